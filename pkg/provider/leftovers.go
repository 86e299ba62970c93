package provider

// LeftoverFinder is implemented by a provider whose creates make resources
// apart from the VM that can outlive it: an Azure NIC whose VM's create was
// refused, or whose delete Azure refused while it kept the NIC reserved for
// the VM (NicReservedForAnotherVm, about 180 s). Left alone, each holds a
// subnet address until the subnet runs out.
type LeftoverFinder interface {
	// Leftovers returns such resources that the provider's last List for
	// sel showed with caa's tags for sel and no VM: each as a VM whose ID
	// is what Delete takes to delete it, whose Tags are the resource's, and
	// whose State is Terminated (its VM is gone). It makes no call of its
	// own: the listing brought them. The caller collects them as it
	// collects orphan VMs (seen twice, a grace period apart).
	Leftovers(sel Selector) []VM
}
