package provider

import "strings"

// SameVM reports whether two VM ids name the same VM. Ids compare without
// regard to case: Azure's ARM ids are case-insensitive and Azure echoes them
// in varying case (the compute API upper-cases the resource group in some
// answers, Resource Graph and the network API do not), and no other cloud's
// ids differ only in case.
func SameVM(a, b string) bool { return strings.EqualFold(a, b) }

// VMKey is the form of a VM id to key a map by: ids that name the same VM
// (SameVM) share one key.
func VMKey(id string) string { return strings.ToLower(id) }
