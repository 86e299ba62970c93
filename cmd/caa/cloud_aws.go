//go:build caa_aws || !(caa_aws || caa_azure || caa_ibmcloud)

package main

import (
	"context"
	"log/slog"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/aws"
)

func awsCloud() *cloud {
	cfg := &aws.Config{}
	return &cloud{
		name:     "aws",
		addFlags: cfg.AddFlags,
		types:    aws.InstanceTypes,
		tees:     aws.TEEs,
		defaults: func() cloudDefaults { return cloudDefaults{instanceType: cfg.InstanceType, image: cfg.Image} },
		typeFlag: "--aws-instance-type", imageFlag: "--aws-image",
		open: func(ctx context.Context, log *slog.Logger) (provider.Provider, cloudDefaults, error) {
			cfg.Logger = log
			if err := cfg.Validate(); err != nil {
				return nil, cloudDefaults{}, err
			}
			p, err := aws.New(ctx, *cfg)
			if err != nil {
				return nil, cloudDefaults{}, err
			}
			return p, cloudDefaults{instanceType: cfg.InstanceType, image: cfg.Image}, nil
		},
	}
}
