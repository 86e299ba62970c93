package relayd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caa-project/caa/internal/cli"
	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/pki"
	"github.com/spf13/pflag"
)

// DefaultSocket is the relay daemon's control socket, in a directory of
// its own below the ledger's (ledger.DefaultPath): the relay's hostPath is
// that directory only (with caa's client file), never the ledger's with
// the agent CA.
const DefaultSocket = "/var/lib/caa/relay/relay.sock"

// Options are `caa relay`'s settings (AddFlags); every flag has an
// environment fallback.
type Options struct {
	// KlogTo, when set, is given the command's logger before its first
	// apiserver call. The binary sets it to cli.RouteKlog; tests that run
	// the command in-process leave it nil, since klog's logger is the
	// process's and is not safe to swap while client-go uses it.
	KlogTo    func(*slog.Logger)
	version   string
	flags     *pflag.FlagSet
	socket    string
	caDir     string
	refresh   time.Duration
	allowUIDs []uint
	// allowEnvErr is a CAA_RELAY_ALLOW_UIDS that does not parse; it
	// matters unless --allow-uid replaces it.
	allowEnvErr error
	logFormat   string
	logLevel    string
	healthAddr  string
	metricsAddr string
}

func (f *Options) check() error {
	var errs []error
	if f.socket == "" || !filepath.IsAbs(f.socket) {
		errs = append(errs, fmt.Errorf("--socket %q: want the control socket's absolute path, e.g. %s", f.socket, DefaultSocket))
	}
	if f.caDir == "" {
		errs = append(errs, errors.New("--agent-ca-dir is empty: pass the directory caa keeps its agent CA in (caa's --agent-ca-dir, by default its ledger's directory)"))
	}
	if f.refresh <= 0 {
		errs = append(errs, errors.New("--refresh must be positive"))
	}
	if f.allowEnvErr != nil {
		errs = append(errs, f.allowEnvErr)
	}
	for _, u := range f.allowUIDs {
		if u > math.MaxUint32 {
			errs = append(errs, fmt.Errorf("--allow-uid %d: not a uid (0 to %d)", u, uint32(math.MaxUint32)))
		}
	}
	if _, err := cli.NewLogger(io.Discard, f.logFormat, f.logLevel); err != nil {
		errs = append(errs, err)
	}
	if f.healthAddr != "" && f.healthAddr == f.metricsAddr {
		errs = append(errs, fmt.Errorf("--metrics-addr %q is --health-addr's too: give it another address, or leave it empty (--health-addr serves /metrics as well)", f.metricsAddr))
	}
	return cli.JoinLine(errs)
}

// NewOptions returns the relay's settings; version is the build's, for
// its log.
func NewOptions(version string) *Options { return &Options{version: version} }

// AddFlags registers the relay daemon's flags on fs.
func (f *Options) AddFlags(fs *pflag.FlagSet) {
	f.flags = fs
	var allowEnv []uint
	allowEnv, f.allowEnvErr = envUIDs("CAA_RELAY_ALLOW_UIDS")
	fs.StringVar(&f.socket, "socket", cli.EnvOr("CAA_RELAY_SOCKET", DefaultSocket),
		"the control socket caa calls (mode 0600; caa's --relay-socket) (env CAA_RELAY_SOCKET)")
	fs.StringVar(&f.caDir, "agent-ca-dir", os.Getenv("CAA_AGENT_CA_DIR"),
		"the directory caa writes "+ClientFile+" in, the --socket's directory by default (caa writes it beside its --relay-socket); "+
			"give the relay a directory of its own, not the agent CA's: it never needs the CA's key nor the ledger (env CAA_AGENT_CA_DIR)")
	fs.DurationVar(&f.refresh, "refresh", cli.EnvDuration("CAA_RELAY_REFRESH", 10*time.Second),
		"how often "+ClientFile+" is checked for new certificates (env CAA_RELAY_REFRESH)")
	fs.UintSliceVar(&f.allowUIDs, "allow-uid", allowEnv,
		"uids whose processes may use the control socket, checked on each connection with SO_PEERCRED besides the socket's 0600 mode "+
			"(repeat it or separate with commas; it replaces the default: the daemon's own uid and 0) (env CAA_RELAY_ALLOW_UIDS, comma-separated)")
	fs.StringVar(&f.healthAddr, "health-addr", os.Getenv("CAA_HEALTH_ADDR"),
		"address of /healthz, /readyz and /metrics: host:port, or unix:PATH for exec probes (caa probe) that need no port "+
			"(the relay runs on the host network); empty: none (env CAA_HEALTH_ADDR)")
	fs.StringVar(&f.metricsAddr, "metrics-addr", os.Getenv("CAA_METRICS_ADDR"),
		"a second address serving /metrics only, for scrapes when --health-addr is a unix socket: host:port; empty: none (env CAA_METRICS_ADDR)")
	fs.StringVar(&f.logFormat, "log-format", cli.EnvOr("CAA_LOG_FORMAT", "text"), "log format: text or json (env CAA_LOG_FORMAT)")
	fs.StringVar(&f.logLevel, "log-level", cli.EnvOr("CAA_LOG_LEVEL", "info"), "log level: debug, info, warn or error (env CAA_LOG_LEVEL)")
}

// Run is `caa relay`: it serves until ctx is done. It returns a
// cli.UsageError for settings that cannot work and a cli.LoggedError for a
// failure it logged.
func Run(ctx context.Context, f *Options, stderr io.Writer) error {
	if f.flags.Changed("allow-uid") {
		f.allowEnvErr = nil
	}
	if f.caDir == "" && !f.flags.Changed("agent-ca-dir") && f.socket != "" {
		f.caDir = filepath.Dir(f.socket)
	}
	if err := f.check(); err != nil {
		return cli.UsageError{Err: err}
	}
	log, _ := cli.NewLogger(stderr, f.logFormat, f.logLevel)
	log = log.With("component", "relay")
	if f.KlogTo != nil {
		f.KlogTo(log)
	}
	fail := func(err error) error {
		log.Error("caa relay cannot run", "err", err)
		return cli.LoggedError{Err: err}
	}
	// caa writes its client file at start; the daemon may start first.
	file := filepath.Join(f.caDir, ClientFile)
	for _, name := range []string{pki.CurrentFile, pki.PreviousFile, filepath.Base(ledger.DefaultPath)} {
		if _, err := os.Lstat(filepath.Join(f.caDir, name)); err == nil {
			log.Warn("the relay's directory holds caa's agent CA or ledger, which the relay never reads: mount only a directory of its own "+
				"(deploy/components/relay: /var/lib/caa/relay), so a compromised relay cannot read the CA's key or write the ledger",
				"dir", f.caDir, "file", name)
		}
	}
	var allow []uint32 // nil: relayd's default
	for _, u := range f.allowUIDs {
		allow = append(allow, uint32(u))
	}
	// The health endpoints answer from the start: /readyz says 503 while
	// caa's client file is awaited.
	var running atomic.Pointer[Server]
	reg := newRegistry(&running)
	ctx, stopHealth := context.WithCancel(ctx)
	var healthDone sync.WaitGroup
	defer func() { stopHealth(); healthDone.Wait() }()
	for _, e := range []struct {
		addr string
		h    http.Handler
	}{{f.healthAddr, healthHandler(&running, reg)}, {f.metricsAddr, health.MetricsHandler(reg)}} {
		if e.addr == "" {
			continue
		}
		hs, err := health.Listen(ctx, e.addr, e.h, log)
		if err != nil {
			return fail(err)
		}
		healthDone.Add(1)
		go func() {
			defer healthDone.Done()
			if err := hs.Serve(ctx); err != nil {
				log.Warn("health endpoint stopped", "err", err)
			}
		}()
	}
	var srv *Server
	for {
		var err error
		if srv, err = NewServer(Config{ClientFile: file, Refresh: f.refresh, AllowUIDs: allow, Log: log}); err == nil {
			break
		}
		log.Warn("waiting for caa's client file", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(2 * time.Second):
		}
	}
	ln, err := Listen(f.socket)
	if err != nil {
		return fail(err)
	}
	running.Store(srv)
	log.Info("caa relay serving", "version", f.version, "socket", f.socket, "boot", srv.Boot(), "allowedUids", srv.Allowed())
	if err := srv.Serve(ctx, ln); err != nil {
		return fail(err)
	}
	log.Info("caa relay stopped; its agent sockets are closed")
	return nil
}

// envUIDs reads a comma-separated list of uids from the environment
// variable key; unset or empty is nil (the flag's default applies).
func envUIDs(key string) ([]uint, error) {
	v := strings.TrimSpace(os.Getenv(key))
	if v == "" {
		return nil, nil
	}
	var out []uint
	for _, part := range strings.Split(v, ",") {
		u, err := strconv.ParseUint(strings.TrimSpace(part), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %q is not a uid (0 to %d): give uids separated by commas, e.g. 0,1000", key, v, part, uint32(math.MaxUint32))
		}
		out = append(out, uint(u))
	}
	return out, nil
}
