// Command fakecloud serves one of caa's fake clouds on a local address, for
// the demo, the benchmarks and poking at a provider by hand:
//
//	go run ./test/mocks/cmd/fakecloud --cloud aws --listen 127.0.0.1:0 --latency 50ms
//
// It prints one line with the endpoint and the control URL, then serves
// until SIGINT or SIGTERM. Faults can be changed at run time through the
// control endpoint (see test/mocks/cloud.ControlHandler). --published-limits
// makes the cloud enforce its published per-account request limits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/caa-project/caa/pkg/provider"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fakecloud:", err)
		os.Exit(2)
	}
}

// config is the command line.
type config struct {
	cloud    string
	listen   string
	pageSize int
	images   string
	types    string
	seed     uint64
	faults   cloud.Faults
	// limits turns on the cloud's published request limits.
	limits bool
	// awsPolicy is an IAM policy file the EC2 fake enforces.
	awsPolicy *ec2fake.Policy
	// cloudTiming makes operations take as long as on the real cloud.
	cloudTiming bool
}

func parse(args []string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("fakecloud", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.cloud, "cloud", "aws", "which cloud's wire protocol: aws, azure or ibmcloud")
	fs.StringVar(&c.listen, "listen", "127.0.0.1:0", "address to serve on (port 0 picks a free one)")
	fs.IntVar(&c.pageSize, "page-size", 50, "largest list page the cloud returns")
	fs.StringVar(&c.images, "images", "", "comma-separated images the cloud accepts (empty: any)")
	fs.StringVar(&c.types, "types", "", "comma-separated instance types the cloud accepts (empty: any)")
	fs.Uint64Var(&c.seed, "seed", 1, "seed for random fault draws")
	fs.DurationVar(&c.faults.Latency, "latency", 0, "latency added to every call")
	fs.DurationVar(&c.faults.BootDelay, "boot-delay", 0, "how long a new VM stays Pending")
	fs.DurationVar(&c.faults.InvisibleFor, "invisible-for", 0, "how long a new VM is hidden from get and list")
	fs.DurationVar(&c.faults.RetryAfter, "retry-after", time.Second, "Retry-After sent with throttling replies")
	fs.Float64Var(&c.faults.ThrottleRate, "throttle-rate", 0, "calls per second allowed before throttling (0: off)")
	fs.IntVar(&c.faults.ThrottleBurst, "throttle-burst", 1, "burst of the throttling token bucket")
	fs.BoolVar(&c.faults.ThrottleWriteOnly, "throttle-writes-only", false, "meter only creates and deletes")
	fs.Float64Var(&c.faults.ServerErrorRate, "server-error-rate", 0, "fraction of calls answered with a 5xx")
	fs.BoolVar(&c.limits, "published-limits", false, "enforce the cloud's published per-account request limits (token buckets by operation class)")
	fs.BoolVar(&c.cloudTiming, "cloud-timing", false, "operations take as long as on the real cloud (Azure: a VM create 2m30s, a failed VM's NIC reserved 180s)")
	policyFile := fs.String("aws-policy", "", "IAM policy file the EC2 fake enforces, answering what it does not allow UnauthorizedOperation (e.g. deploy/overlays/aws/iam-policy.json; empty: allow all)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if *policyFile != "" {
		if c.cloud != "aws" {
			return c, fmt.Errorf("--aws-policy is for --cloud aws")
		}
		p, err := ec2fake.ReadPolicy(*policyFile)
		if err != nil {
			return c, fmt.Errorf("--aws-policy: %w", err)
		}
		c.awsPolicy = p
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch c.cloud {
	case "aws", "azure", "ibmcloud":
	default:
		return c, fmt.Errorf("--cloud %q: want aws, azure or ibmcloud", c.cloud)
	}
	if c.pageSize <= 0 {
		return c, fmt.Errorf("--page-size %d: want a positive number", c.pageSize)
	}
	if c.faults.ServerErrorRate < 0 || c.faults.ServerErrorRate > 1 {
		return c, fmt.Errorf("--server-error-rate %v: want a fraction from 0 to 1", c.faults.ServerErrorRate)
	}
	return c, nil
}

// handler builds the cloud core and the front end for c.
func handler(c config) (*cloud.Cloud, http.Handler) {
	opts := cloud.Options{PageSize: c.pageSize, Images: provider.SplitList(c.images), Types: provider.SplitList(c.types), Seed: c.seed}
	var core *cloud.Cloud
	var h http.Handler
	switch c.cloud {
	case "aws":
		core = cloud.New(ec2fake.CloudOptions(opts))
		var o []ec2fake.Option
		if c.limits {
			o = append(o, ec2fake.WithBudget(ec2fake.NewBudget(nil)))
		}
		if c.awsPolicy != nil {
			o = append(o, ec2fake.WithPolicy(c.awsPolicy))
		}
		h = ec2fake.NewServer(core, o...)
	case "azure":
		core = cloud.New(opts)
		var o []armfake.Option
		if c.limits {
			o = append(o, armfake.WithBudget(armfake.NewBudget(nil)))
		}
		if c.cloudTiming {
			o = append(o, armfake.WithCloudTiming())
		}
		h = armfake.NewServer(core, o...)
	default:
		core = cloud.New(opts)
		var o []vpcfake.Option
		if c.limits {
			o = append(o, vpcfake.WithBudget(vpcfake.NewBudget(nil)))
		}
		h = vpcfake.NewServer(core, o...)
	}
	core.SetFaults(c.faults)
	return core, h
}

func run(ctx context.Context, args []string, out io.Writer) error {
	c, err := parse(args, out)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	_, h := handler(c)
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.listen, err)
	}
	url := "http://" + ln.Addr().String()
	fmt.Fprintf(out, "cloud=%s endpoint=%s control=%s%s\n", c.cloud, url, url, cloud.ControlPrefix)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		slog.Warn("fakecloud shutdown", "err", err)
	}
	return nil
}
