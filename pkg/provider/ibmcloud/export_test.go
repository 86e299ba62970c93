package ibmcloud

import (
	"context"

	"github.com/IBM/vpc-go-sdk/vpcv1"

	"github.com/caa-project/caa/pkg/provider"
)

// SetSearchLimit makes p ask Global Search for pages of n hits, so a test
// can see a listing cross pages without a thousand VMs.
func SetSearchLimit(p *Provider, n int) { p.searchLimit = n }

// CreateNamed makes an instance as another program would (the adaptor):
// with the provider's placement for spec, but named name, with userTags.
func CreateNamed(p *Provider, spec provider.Spec, name string) (string, error) {
	in, _, err := p.api.CreateInstanceWithContext(context.Background(),
		&vpcv1.CreateInstanceOptions{InstancePrototype: p.prototype(spec, name, nil)})
	if err != nil {
		return "", err
	}
	return str(in.ID), nil
}
