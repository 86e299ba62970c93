package nodeagent

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The agent's tests run this very test binary as the "caa" of a pod: with
// fakeCAAEnv=1 in its environment (set by the pod spec, so it also proves
// the env reaches the process) TestMain serves a stand-in for caa's health
// endpoints instead of running the tests.
//
// The stand-in is steered through files in the directory fakeDirEnv names,
// read on every use so a test can change its behaviour while it runs, and
// shared by every restart of the pod's process:
//
//	<path>          the HTTP status GET <path> answers ("500"); absent: 200
//	exit-code       at start, exit at once with this code (a crash loop)
//	ignore-sigterm  present: SIGTERM is logged and ignored
//
// With fakeSharedEnv set to a directory, the stand-in writes a file named
// after $POD_NAME there at start, holding its pod name and pid: the test
// of two pods on one node reads them from the node's host directory.
//
// GET /exit?code=N makes the running process exit with N. Every request
// and signal is logged to stdout (the pod's caa.log) as
// "fake-caa: GET <path> -> <status>" or "fake-caa: ignoring SIGTERM",
// which the tests read to see which probes ran.
const (
	fakeCAAEnv    = "NODEAGENT_FAKE_CAA"
	fakeDirEnv    = "NODEAGENT_FAKE_DIR"
	fakeSharedEnv = "NODEAGENT_FAKE_SHARED"
)

func TestMain(m *testing.M) {
	if os.Getenv(fakeCAAEnv) == "1" {
		os.Exit(runFakeCAA(os.Getenv(fakeDirEnv), os.Getenv(healthEnv)))
	}
	os.Exit(m.Run())
}

// runFakeCAA serves until SIGTERM (unless told to ignore it) or /exit, and
// returns the exit code.
func runFakeCAA(dir, addr string) int {
	if b, err := os.ReadFile(filepath.Join(dir, "exit-code")); err == nil {
		code, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			fmt.Printf("fake-caa: bad exit-code file: %v\n", err)
			return 2
		}
		fmt.Printf("fake-caa: exiting at start with %d\n", code)
		return code
	}
	if shared := os.Getenv(fakeSharedEnv); shared != "" {
		name := os.Getenv("POD_NAME")
		if err := os.WriteFile(filepath.Join(shared, name), fmt.Appendf(nil, "%s %d\n", name, os.Getpid()), 0o644); err != nil {
			fmt.Printf("fake-caa: write into the shared directory: %v\n", err)
			return 2
		}
	}
	// Listen for SIGTERM before serving, so a stop that follows the first
	// probe at once is never missed.
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Printf("fake-caa: listen on %q: %v\n", addr, err)
		return 2
	}
	exit := make(chan int, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/exit", func(w http.ResponseWriter, r *http.Request) {
		code, err := strconv.Atoi(r.URL.Query().Get("code"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Printf("fake-caa: GET /exit -> exiting with %d\n", code)
		// The whole answer reaches the caller before the process goes.
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case exit <- code:
		default:
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		status := http.StatusOK
		if b, err := os.ReadFile(filepath.Join(dir, filepath.Base(r.URL.Path))); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				status = n
			}
		}
		fmt.Printf("fake-caa: GET %s -> %d\n", r.URL.Path, status)
		w.WriteHeader(status)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	// The process exits without shutting the server down: the probes
	// of a process that is gone fail, as they should.
	go func() { _ = srv.Serve(l) }()
	for {
		select {
		case <-term:
			if _, err := os.Stat(filepath.Join(dir, "ignore-sigterm")); err == nil {
				fmt.Println("fake-caa: ignoring SIGTERM")
				continue
			}
			fmt.Println("fake-caa: SIGTERM, exiting")
			return 0
		case code := <-exit:
			return code
		}
	}
}
