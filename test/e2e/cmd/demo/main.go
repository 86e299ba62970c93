// Command demo is `make demo`: it starts etcd, a real kube-apiserver and a
// fake cloud on 127.0.0.1, creates peer pods on a node, runs caa and shows
// its readiness flip, then restarts caa with VMs killed behind its back and
// shows what it adopted and recreated. It narrates each step and stops
// everything it started. CLOUD=aws (default), azure or ibmcloud picks the
// cloud.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/test/e2e/cluster"
	"github.com/caa-project/caa/test/e2e/katanode"
	ec2fake "github.com/caa-project/caa/test/mocks/aws"
	armfake "github.com/caa-project/caa/test/mocks/azure"
	"github.com/caa-project/caa/test/mocks/cloud"
	vpcfake "github.com/caa-project/caa/test/mocks/ibmcloud"
)

const (
	node    = "demo-node"
	pods    = 20
	killed  = 3
	latency = 50 * time.Millisecond
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }

// fake is the cloud for one demo run and the caa flags that reach it.
type fake struct {
	core  *cloud.Cloud
	flags []string
	env   []string
}

func newFake(name string) (*fake, func(), error) {
	switch name {
	case "", "aws":
		core := cloud.New(ec2fake.CloudOptions(cloud.Options{}))
		srv := httptest.NewServer(ec2fake.NewServer(core))
		return &fake{core: core,
			flags: []string{"--provider", "aws", "--aws-endpoint", srv.URL, "--aws-region", "us-east-1",
				"--aws-security-group-ids", "sg-0123456789abcdef0", "--aws-subnet-id", "subnet-0123456789abcdef0", "--aws-image", "ami-0123456789abcdef0", "--aws-instance-type", "m6a.large"},
			env: []string{"AWS_ACCESS_KEY_ID=AKIDDEMO", "AWS_SECRET_ACCESS_KEY=demo-secret", "AWS_EC2_METADATA_DISABLED=true",
				"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"},
		}, srv.Close, nil
	case "ibmcloud":
		core := cloud.New(cloud.Options{})
		srv := httptest.NewServer(vpcfake.NewServer(core))
		return &fake{core: core,
			flags: []string{"--provider", "ibmcloud", "--ibmcloud-endpoint", srv.URL + "/v1", "--ibmcloud-iam-endpoint", srv.URL, "--ibmcloud-search-endpoint", srv.URL,
				"--ibmcloud-region", "us-south", "--ibmcloud-zone", "us-south-1", "--ibmcloud-vpc-id", vpcfake.DefaultVPC,
				"--ibmcloud-subnet-id", vpcfake.DefaultSubnet, "--ibmcloud-resource-group-id", vpcfake.DefaultResourceGroup, "--ibmcloud-image", "r006-demo-image", "--ibmcloud-instance-type", "bx3dc-2x10"},
			env: []string{"IBMCLOUD_API_KEY=demo-api-key"},
		}, srv.Close, nil
	case "azure":
		// caa's DefaultAzureCredential gets its token from a fake App
		// Service managed identity endpoint, as it would on App Service.
		const image, size = "Canonical:ubuntu-24_04-lts:server:latest", "Standard_DC2as_v5"
		token := "demo-arm-token-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		core := cloud.New(cloud.Options{})
		arm := httptest.NewServer(armfake.NewServer(core, armfake.WithBearerToken(token)))
		mi := &armfake.ManagedIdentity{Token: token, Header: "demo-identity-header"}
		identity := httptest.NewServer(mi)
		subnet := "/subscriptions/" + armfake.DefaultSubscription +
			"/resourceGroups/caa-net/providers/Microsoft.Network/virtualNetworks/caa-vnet/subnets/peerpods"
		return &fake{core: core,
			flags: []string{"--provider", "azure", "--azure-endpoint", arm.URL,
				"--azure-subscription-id", armfake.DefaultSubscription, "--azure-resource-group", armfake.DefaultResourceGroup,
				"--azure-location", armfake.DefaultLocation, "--azure-subnet-id", subnet,
				"--azure-ssh-public-key", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGNhYS1kZW1vLWtleQ caa@demo",
				"--azure-image", image, "--azure-instance-type", size, "--azure-poll-interval", "50ms"},
			env: []string{"IDENTITY_ENDPOINT=" + identity.URL + armfake.ManagedIdentityPath, "IDENTITY_HEADER=" + mi.Header},
		}, func() { arm.Close(); identity.Close() }, nil
	}
	return nil, nil, fmt.Errorf("CLOUD=%q: the demo runs aws, azure or ibmcloud", name)
}

func run(ctx context.Context) error {
	cloudName := os.Getenv("CLOUD")
	// The demo starts etcd and kube-apiserver only: the tests' other
	// binaries (controllers, kubectl, kwok) would add many minutes to a
	// first run for nothing.
	if err := os.Setenv(cluster.OnlyEnv, "etcd,kube-apiserver"); err != nil {
		return err
	}
	say("Building caa, etcd and kube-apiserver (both servers are cached after the first run; a cold build takes about 5 minutes on 2 cores)")
	work, err := os.MkdirTemp("", "caa-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	caaBin := filepath.Join(work, "caa")
	if err := cluster.BuildCaa(ctx, caaBin, ""); err != nil {
		return err
	}

	say("Starting etcd and a real kube-apiserver on 127.0.0.1")
	c, err := cluster.Launch(ctx, cluster.Options{})
	if err != nil {
		return err
	}
	defer func() { _ = c.Stop() }()
	f, closeFake, err := newFake(cloudName)
	if err != nil {
		return err
	}
	defer closeFake()
	f.core.SetFaults(cloud.Faults{Latency: latency})
	say("Started a fake %s cloud (%s per call) and the RuntimeClass kata-remote", orDefault(cloudName, "aws"), latency)

	if _, err := c.CreateNode(ctx, node); err != nil {
		return err
	}
	for i := range pods {
		if _, err := c.CreatePeerPod(ctx, "demo", fmt.Sprintf("app-%02d", i), node, nil); err != nil {
			return err
		}
	}
	say("Created node %s and %d peer pods on it (runtimeClassName: kata-remote)", node, pods)

	ledgerPath := filepath.Join(work, "var-lib-caa", "ledger.db")
	say("First start of caa: it must create one VM per pod before /readyz turns 200")
	d, err := startCaa(ctx, caaBin, c.Kubeconfig(), ledgerPath, f)
	if err != nil {
		return err
	}
	snap, err := d.watchReady(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("    ready after %s with %d VMs in the cloud (creates: %d)\n",
		time.Duration(snap.TimeToReady).Round(time.Millisecond), len(f.core.Live()), f.core.Counters()[cloud.OpCreate])

	say("Upgrading caa: SIGTERM (it deletes no VM), then %d VMs are killed behind its back", killed)
	if err := d.stop(); err != nil {
		return err
	}
	for _, in := range f.core.Live()[:killed] {
		if err := f.core.Kill(in.ID); err != nil {
			return err
		}
		fmt.Printf("    killed %s\n", in.ID)
	}
	f.core.ResetCounters()

	say("The new caa starts on the same ledger: it adopts the live VMs and recreates the killed ones before it is ready")
	d, err = startCaa(ctx, caaBin, c.Kubeconfig(), ledgerPath, f)
	if err != nil {
		return err
	}
	snap, err = d.watchReady(ctx)
	if err != nil {
		return err
	}
	counters := f.core.Counters()
	fmt.Printf("    ready after %s: %d VMs adopted with no cloud write, %d recreated, %d deleted\n",
		time.Duration(snap.TimeToReady).Round(time.Millisecond), pods-killed, counters[cloud.OpCreate], counters[cloud.OpDelete])

	say("caa ledger ls (answered by the running daemon over its unix socket)")
	ls := exec.CommandContext(ctx, caaBin, "ledger", "ls", "--ledger", ledgerPath)
	ls.Stdout, ls.Stderr = os.Stdout, os.Stderr
	if err := ls.Run(); err != nil {
		return fmt.Errorf("caa ledger ls: %w", err)
	}

	say("Stopping caa, the fake cloud, kube-apiserver and etcd")
	if err := d.stop(); err != nil {
		return err
	}
	fmt.Println("    done")
	return nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// daemon is one running caa.
type daemon struct {
	cmd    *exec.Cmd
	health string
	logs   string
	done   chan error
}

func startCaa(ctx context.Context, bin, kubeconfig, ledgerPath string, f *fake) (*daemon, error) {
	port, err := cluster.FreePort()
	if err != nil {
		return nil, err
	}
	logs := filepath.Join(filepath.Dir(ledgerPath), "..", "caa-"+strconv.FormatInt(time.Now().UnixNano(), 36)+".log")
	if err := os.MkdirAll(filepath.Dir(logs), 0o755); err != nil {
		return nil, err
	}
	out, err := os.Create(logs)
	if err != nil {
		return nil, err
	}
	args := append([]string{"run", "--node-name", node, "--kubeconfig", kubeconfig, "--ledger", ledgerPath,
		"--health-addr", "127.0.0.1:" + strconv.Itoa(port), "--resync", "5s", "--confirm-missing", "2s"}, f.flags...)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), f.env...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start caa: %w", err)
	}
	d := &daemon{cmd: cmd, health: "http://127.0.0.1:" + strconv.Itoa(port), logs: logs, done: make(chan error, 1)}
	go func() { d.done <- cmd.Wait(); _ = out.Close() }()
	fmt.Printf("    caa started (pid %d, health on %s, log %s)\n", cmd.Process.Pid, d.health, logs)
	return d, nil
}

// watchReady prints /readyz as it changes until it answers 200.
func (d *daemon) watchReady(ctx context.Context) (health.Snapshot, error) {
	last := ""
	deadline := time.After(3 * time.Minute)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-d.done:
			return health.Snapshot{}, fmt.Errorf("caa exited (%v); see %s", err, d.logs)
		case <-deadline:
			return health.Snapshot{}, errors.New("caa did not become ready within 3 minutes; see " + d.logs)
		case <-ctx.Done():
			return health.Snapshot{}, ctx.Err()
		case <-tick.C:
		}
		snap, err := d.status(ctx)
		if err != nil {
			continue
		}
		line := "not ready: " + snap.Reason
		if snap.Ready {
			line = "ready"
		}
		if line != last {
			fmt.Printf("    /readyz: %s\n", line)
			last = line
		}
		if snap.Ready {
			return snap, nil
		}
	}
}

func (d *daemon) status(ctx context.Context) (health.Snapshot, error) {
	return katanode.ReadStatus(ctx, d.health)
}

func (d *daemon) stop() error {
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case err := <-d.done:
		if err != nil {
			return fmt.Errorf("caa exited with %v on SIGTERM; see %s", err, d.logs)
		}
		return nil
	case <-time.After(time.Minute):
		_ = d.cmd.Process.Kill()
		return errors.New("caa did not stop within a minute of SIGTERM")
	}
}
