//go:build caa_aws || !(caa_aws || caa_azure || caa_ibmcloud)

package clouds

import (
	"context"
	"log/slog"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/aws"
)

func awsCloud() *Cloud {
	cfg := &aws.Config{}
	return &Cloud{
		Name:       "aws",
		AddFlags:   cfg.AddFlags,
		Types:      aws.InstanceTypes,
		TEEs:       aws.TEEs,
		Configured: func() Defaults { return Defaults{InstanceType: cfg.InstanceType, Image: cfg.Image} },
		TypeFlag:   "--aws-instance-type", ImageFlag: "--aws-image",
		Open: func(ctx context.Context, log *slog.Logger) (provider.Provider, Defaults, error) {
			cfg.Logger = log
			if err := cfg.FillFromIMDS(ctx); err != nil {
				return nil, Defaults{}, err
			}
			if err := cfg.Validate(); err != nil {
				return nil, Defaults{}, err
			}
			p, err := aws.New(ctx, *cfg)
			if err != nil {
				return nil, Defaults{}, err
			}
			return p, Defaults{InstanceType: cfg.InstanceType, Image: cfg.Image}, nil
		},
	}
}
