package ibmcloud

// SetSearchLimit makes p ask Global Search for pages of n hits, so a test
// can see a listing cross pages without a thousand VMs.
func SetSearchLimit(p *Provider, n int) { p.searchLimit = n }
