package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/caa-project/caa/pkg/provider"
	"github.com/caa-project/caa/pkg/provider/aws"
	"github.com/caa-project/caa/pkg/provider/azure"
	"github.com/caa-project/caa/pkg/provider/ibmcloud"
)

// providerFromFlags builds a cloud's provider the way `caa run` does, from
// its --<cloud>-... flags.
func providerFromFlags(ctx context.Context, name string, flags []string) (provider.Provider, error) {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	var (
		a  aws.Config
		az azure.Config
		ib ibmcloud.Config
	)
	a.AddFlags(fs)
	az.AddFlags(fs)
	ib.AddFlags(fs)
	var own []string
	for i := 0; i < len(flags); i++ {
		if flags[i] == "--provider" {
			i++
			continue
		}
		own = append(own, flags[i])
	}
	if err := fs.Parse(own); err != nil {
		return nil, err
	}
	switch name {
	case "aws":
		return aws.New(ctx, a)
	case "azure":
		return azure.New(ctx, az)
	}
	return ibmcloud.New(ctx, ib)
}

// sdkListTime is the median wall time of runs listings of sel through the
// cloud's real provider in this process, against f with no injected
// latency: what the SDK's request, decode and caa's reading of the page
// cost before any wire latency, which S1's latency-only bound leaves out.
// The first listing (token fetches, connection set-up) is not counted.
func sdkListTime(ctx context.Context, f *fakeCloud, sel provider.Selector, want, runs int) (time.Duration, error) {
	restore := map[string]*string{}
	for _, kv := range f.env {
		k, v, _ := strings.Cut(kv, "=")
		if old, ok := os.LookupEnv(k); ok {
			restore[k] = &old
		} else {
			restore[k] = nil
		}
		_ = os.Setenv(k, v)
	}
	defer func() {
		for k, v := range restore {
			if v == nil {
				_ = os.Unsetenv(k)
			} else {
				_ = os.Setenv(k, *v)
			}
		}
	}()
	p, err := providerFromFlags(ctx, f.name, f.flags)
	if err != nil {
		return 0, fmt.Errorf("%s provider in process: %w", f.name, err)
	}
	var ds []float64
	for i := range runs + 1 {
		start := time.Now()
		vms, err := p.List(ctx, sel)
		if err != nil {
			return 0, fmt.Errorf("%s list in process: %w", f.name, err)
		}
		if len(vms) != want {
			return 0, fmt.Errorf("%s list in process: %d VMs, want %d", f.name, len(vms), want)
		}
		if i > 0 {
			ds = append(ds, float64(time.Since(start)))
		}
	}
	return time.Duration(Median(ds)), nil
}
