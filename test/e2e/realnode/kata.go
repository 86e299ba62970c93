package realnode

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/caa-project/caa/pkg/hypervisor/hypervisorpb"
	"github.com/caa-project/caa/test/e2e/upstream"
)

// KataHandler is the runtime handler (and RuntimeClass handler) of kata's
// remote hypervisor, with kata's shim type.
const (
	KataHandler = "kata-remote"
	KataType    = "io.containerd.kata.v2"
)

// RequireUpstream fails t under CI (CI=true) and skips it elsewhere when
// $UPSTREAM_SRC does not name the pinned upstream sources: the real node's
// kata parts build from them.
func RequireUpstream(t testing.TB) {
	t.Helper()
	var errs []error
	seen := map[string]bool{}
	for _, k := range []upstream.Kind{upstream.PodVM, upstream.KataShim, upstream.KataAgent} {
		if err := upstream.Check(k); err != nil && !seen[err.Error()] {
			seen[err.Error()] = true
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the real-node tests build kata's shim and the pod VM's programs from upstream's sources, and CI must run them (.ci/run sets %s): %v", upstream.SrcEnv, err)
		}
		t.Skipf("not CI and no upstream sources: %v", err)
	}
}

// KataShim is kata 4.1.0's shim, built, with its remote hypervisor
// configuration pointed at a hypervisor socket.
type KataShim struct {
	Bin, Config string
}

// BuildKataShim builds (or finds) kata's shim and writes its generated
// configuration-remote.toml into dir with remote_hypervisor_socket set to
// socket, the only change from what kata's Makefile generates.
func BuildKataShim(ctx context.Context, dir, socket string) (KataShim, error) {
	built, err := upstream.Build(ctx, upstream.KataShim)
	if err != nil {
		return KataShim{}, err
	}
	b, err := os.ReadFile(filepath.Join(built, upstream.RemoteConfig))
	if err != nil {
		return KataShim{}, err
	}
	re := regexp.MustCompile(`(?m)^remote_hypervisor_socket = .*$`)
	if !re.Match(b) {
		return KataShim{}, fmt.Errorf("%s: no remote_hypervisor_socket line to point at caa", upstream.RemoteConfig)
	}
	b = re.ReplaceAll(b, []byte(fmt.Sprintf("remote_hypervisor_socket = %q", socket)))
	cfg := filepath.Join(dir, upstream.RemoteConfig)
	if err := os.WriteFile(cfg, b, 0o644); err != nil {
		return KataShim{}, err
	}
	return KataShim{Bin: filepath.Join(built, upstream.ShimBin), Config: cfg}, nil
}

// Runtime is the node's kata-remote handler running this shim with its
// configuration. The pod annotations passed to it are kata's own and
// CRI-O's, so a test can give a sandbox CRI-O's names as the shim reads them.
func (k KataShim) Runtime() Runtime {
	return Runtime{Handler: KataHandler, Type: KataType, Path: k.Bin,
		Options:        map[string]string{"ConfigPath": k.Config},
		PodAnnotations: []string{"io.katacontainers.*", "io.kubernetes.cri-o.*"}}
}

// Syslog serves /dev/log, where kata's shim logs (its logger needs a
// syslog to start), and keeps every message.
type Syslog struct {
	conn *net.UnixConn
	mu   sync.Mutex
	msgs []string
	done chan struct{}
}

// SyslogPath is where the shim's logger writes.
const SyslogPath = "/dev/log"

// ServeSyslog serves SyslogPath for t's duration. Another real-node test
// serving it (a run beside this one) makes it wait, for up to ten minutes:
// the shim's log would go there instead; a path left by a dead process is
// taken over.
func ServeSyslog(t testing.TB) *Syslog {
	t.Helper()
	deadline := time.Now().Add(10 * time.Minute)
	told := false
	var conn *net.UnixConn
	for {
		var err error
		conn, err = net.ListenUnixgram("unixgram", &net.UnixAddr{Name: SyslogPath, Net: "unixgram"})
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("serve %s for kata's shim: %v", SyslogPath, err)
		}
		c, err := net.Dial("unixgram", SyslogPath)
		if err == nil {
			c.Close()
		} else if errors.Is(err, syscall.ECONNREFUSED) {
			_ = os.Remove(SyslogPath) // nobody serves it
			continue
		}
		if !told {
			t.Logf("waiting for %s: another syslog serves it (a real-node test beside this one?)", SyslogPath)
			told = true
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is served by another process: the test needs kata's shim's log; stop it or run the test where /dev/log is free", SyslogPath)
		}
		time.Sleep(time.Second)
	}
	s := &Syslog{conn: conn, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		buf := make([]byte, 64<<10)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.msgs = append(s.msgs, strings.TrimRight(string(buf[:n]), "\n"))
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = conn.Close()
		<-s.done
		_ = os.Remove(SyslogPath)
	})
	return s
}

// Lines returns the messages so far.
func (s *Syslog) Lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.msgs)
}

// HypervisorCalls sits between kata's shim and caa's hypervisor socket and
// counts the shim's ttrpc requests by method, whatever caa does (a caa
// killed or handed over keeps no count). Each connection is relayed as it
// is; a connection caa's socket refuses is closed, as the shim would see.
type HypervisorCalls struct {
	Socket  string
	ln      net.Listener
	target  string
	mu      sync.Mutex
	n       map[string]int
	creates map[string]*hypervisorpb.CreateVMRequest // by sandbox id
	wg      sync.WaitGroup
}

// CountHypervisorCalls serves socket and relays to target.
func CountHypervisorCalls(t testing.TB, socket, target string) *HypervisorCalls {
	t.Helper()
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatalf("hypervisor call counter: %v", err)
	}
	h := &HypervisorCalls{Socket: socket, ln: ln, target: target, n: map[string]int{}, creates: map[string]*hypervisorpb.CreateVMRequest{}}
	h.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.wg.Go(func() { h.relay(c) })
		}
	})
	t.Cleanup(func() { _ = ln.Close(); h.wg.Wait() })
	return h
}

func (h *HypervisorCalls) relay(c net.Conn) {
	defer c.Close()
	up, err := net.Dial("unix", h.target)
	if err != nil {
		h.add("(refused: nothing listens on caa's socket)")
		return
	}
	defer up.Close()
	go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
	// ttrpc frames: a 10-byte header (length, stream id, type, flags),
	// then the message; type 1 is a request whose fields 1 and 2 are the
	// service and the method.
	hdr := make([]byte, 10)
	for {
		if _, err := io.ReadFull(c, hdr); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr[:4]))
		if _, err := io.ReadFull(c, body); err != nil {
			return
		}
		if hdr[8] == 1 {
			m, payload := parseRequest(body)
			h.add(m)
			if m == createVM {
				req := &hypervisorpb.CreateVMRequest{}
				if proto.Unmarshal(payload, req) == nil {
					h.mu.Lock()
					h.creates[req.Id] = req
					h.mu.Unlock()
				}
			}
		}
		if _, err := up.Write(append(hdr, body...)); err != nil {
			return
		}
		hdr = make([]byte, 10)
	}
}

const createVM = "hypervisor.Hypervisor/CreateVM"

// parseRequest reads "service/method" and the payload from a ttrpc request
// (fields 1, 2 and 3).
func parseRequest(b []byte) (string, []byte) {
	var service, method string
	var payload []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			break
		}
		if typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b)
			switch num {
			case 1:
				service = string(v)
			case 2:
				method = string(v)
			case 3:
				payload = v
			}
		}
		b = b[n:]
	}
	return path.Join(service, method), payload
}

func (h *HypervisorCalls) add(m string) {
	h.mu.Lock()
	h.n[m]++
	h.mu.Unlock()
}

// CreateVM returns the CreateVM request the shim sent for sandbox id, or
// nil.
func (h *HypervisorCalls) CreateVM(id string) *hypervisorpb.CreateVMRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.creates[id]
}

// CreateVMs returns the sandbox ids the shim sent CreateVM for.
func (h *HypervisorCalls) CreateVMs() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Collect(maps.Keys(h.creates))
}

// Counts returns the calls so far by "service/method".
func (h *HypervisorCalls) Counts() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.n)
}
