//go:build caa_ibmcloud || !(caa_aws || caa_azure || caa_ibmcloud)

package main

import (
	"context"
	"log/slog"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/ibmcloud"
)

func ibmcloudCloud() *cloud {
	cfg := &ibmcloud.Config{}
	return &cloud{
		name:     "ibmcloud",
		addFlags: cfg.AddFlags,
		types:    ibmcloud.InstanceTypes,
		tees:     ibmcloud.TEEs,
		defaults: func() cloudDefaults { return cloudDefaults{instanceType: cfg.InstanceType, image: cfg.Image} },
		typeFlag: "--ibmcloud-instance-type", imageFlag: "--ibmcloud-image",
		open: func(ctx context.Context, log *slog.Logger) (provider.Provider, cloudDefaults, error) {
			if err := cfg.Validate(); err != nil {
				return nil, cloudDefaults{}, err
			}
			p, err := ibmcloud.New(ctx, *cfg)
			if err != nil {
				return nil, cloudDefaults{}, err
			}
			log.Info("ibmcloud credentials", "route", p.Credentials())
			return p, cloudDefaults{instanceType: cfg.InstanceType, image: cfg.Image}, nil
		},
	}
}
