//go:build caa_ibmcloud || !(caa_aws || caa_azure || caa_ibmcloud)

package clouds

import (
	"context"
	"log/slog"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/ibmcloud"
)

func ibmcloudCloud() *Cloud {
	cfg := &ibmcloud.Config{}
	return &Cloud{
		Name:       "ibmcloud",
		AddFlags:   cfg.AddFlags,
		Types:      ibmcloud.InstanceTypes,
		TEEs:       ibmcloud.TEEs,
		Configured: func() Defaults { return Defaults{InstanceType: cfg.InstanceType, Image: cfg.Image} },
		TypeFlag:   "--ibmcloud-instance-type", ImageFlag: "--ibmcloud-image",
		Open: func(ctx context.Context, log *slog.Logger) (provider.Provider, Defaults, error) {
			if err := cfg.Validate(); err != nil {
				return nil, Defaults{}, err
			}
			p, err := ibmcloud.New(ctx, *cfg)
			if err != nil {
				return nil, Defaults{}, err
			}
			log.Info("ibmcloud credentials", "route", p.Credentials())
			return p, Defaults{InstanceType: cfg.InstanceType, Image: cfg.Image}, nil
		},
	}
}
