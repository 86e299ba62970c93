//go:build caa_azure || !(caa_aws || caa_azure || caa_ibmcloud)

package clouds

import (
	"context"
	"log/slog"
	"os"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/azure"
)

func azureCloud() *Cloud {
	cfg := &azure.Config{}
	return &Cloud{
		Name:       "azure",
		AddFlags:   cfg.AddFlags,
		Types:      azure.InstanceTypes,
		TEEs:       azure.TEEs,
		Configured: func() Defaults { return Defaults{InstanceType: cfg.InstanceType, Image: cfg.Image} },
		TypeFlag:   "--azure-instance-type", ImageFlag: "--azure-image",
		Open: func(ctx context.Context, log *slog.Logger) (provider.Provider, Defaults, error) {
			if err := cfg.Validate(); err != nil {
				return nil, Defaults{}, err
			}
			// Which credential route the SDK's chain will take: names and
			// paths, never a secret or a token.
			log.InfoContext(ctx, "azure credential route", "route", azure.CredentialRoute(os.Getenv))
			p, err := azure.New(ctx, *cfg, azure.WithLogger(log))
			if err != nil {
				return nil, Defaults{}, err
			}
			return p, Defaults{InstanceType: cfg.InstanceType, Image: cfg.Image}, nil
		},
	}
}
