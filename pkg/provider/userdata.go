package provider

// UserDataLimited is implemented by a provider whose cloud caps the user
// data a VM is created with. The sandbox manager reads it (through
// SpecConfig.UserDataLimit, which the daemon fills with UserDataLimitOf)
// before it asks for a VM: user data over the cap loses its optional part
// (the pod's image-pull credentials, with a warning event on the pod), and
// what still does not fit fails the sandbox with the sizes, rather than a
// cloud error after the intent is recorded.
type UserDataLimited interface {
	// UserDataLimit is the largest user data, in bytes as caa hands it to
	// Create (before any encoding the provider applies), that a VM takes.
	UserDataLimit() int
}

// UserDataLimitOf is p's cap on user data in bytes, or 0 when p declares
// none.
func UserDataLimitOf(p Provider) int {
	if l, ok := p.(UserDataLimited); ok {
		return l.UserDataLimit()
	}
	return 0
}
