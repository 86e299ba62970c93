//go:build caa_azure || !(caa_aws || caa_azure || caa_ibmcloud)

package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/azure"
)

func azureCloud() *cloud {
	cfg := &azure.Config{}
	return &cloud{
		name:     "azure",
		addFlags: cfg.AddFlags,
		types:    azure.InstanceTypes,
		tees:     azure.TEEs,
		defaults: func() cloudDefaults { return cloudDefaults{instanceType: cfg.InstanceType, image: cfg.Image} },
		typeFlag: "--azure-instance-type", imageFlag: "--azure-image",
		open: func(ctx context.Context, log *slog.Logger) (provider.Provider, cloudDefaults, error) {
			if err := cfg.Validate(); err != nil {
				return nil, cloudDefaults{}, err
			}
			// Which credential route the SDK's chain will take: names and
			// paths, never a secret or a token.
			log.InfoContext(ctx, "azure credential route", "route", azure.CredentialRoute(os.Getenv))
			p, err := azure.New(ctx, *cfg, azure.WithLogger(log))
			if err != nil {
				return nil, cloudDefaults{}, err
			}
			return p, cloudDefaults{instanceType: cfg.InstanceType, image: cfg.Image}, nil
		},
	}
}
