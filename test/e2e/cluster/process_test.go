package cluster

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeServer writes an executable that prints line and exits 1, standing in
// for a server that dies at start.
func fakeServer(t *testing.T, line string) string {
	t.Helper()
	return script(t, "echo '"+line+"'\nexit 1")
}

func script(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fake-server")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestServerDyingAtStartIsReportedWithItsLog(t *testing.T) {
	c := &Cluster{dir: t.TempDir(), logf: t.Logf, bins: Binaries{Etcd: fakeServer(t, "etcd: bad flag")}}
	err := c.launch(t.Context())
	if err == nil {
		t.Fatal("launch succeeded with a server that exits")
	}
	for _, want := range []string{"etcd exited", "exit status 1", "etcd: bad flag"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if errors.Is(err, errPortTaken) {
		t.Errorf("a bad flag was taken for a port clash: %v", err)
	}
	if n := strings.Count(fileTail(filepath.Join(c.dir, "etcd.log"), 0, 100), "=== "); n != 1 {
		t.Errorf("etcd started %d times, want 1 (no retry)", n)
	}
}

func TestPortClashRetriesOnOtherPorts(t *testing.T) {
	c := &Cluster{dir: t.TempDir(), logf: t.Logf, bins: Binaries{Etcd: fakeServer(t, "listen tcp 127.0.0.1:1: bind: address already in use")}}
	err := c.launch(t.Context())
	if !errors.Is(err, errPortTaken) {
		t.Fatalf("launch: %v, want a port clash", err)
	}
	if n := strings.Count(fileTail(filepath.Join(c.dir, "etcd.log"), 0, 100), "=== "); n != startAttempts {
		t.Errorf("etcd started %d times, want %d", n, startAttempts)
	}
}

// A retry is judged by what the new process printed, not by the lines an
// earlier attempt left in the same log.
func TestRetryJudgesOnlyItsOwnOutput(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran-once")
	bin := script(t, "if [ -e "+marker+" ]; then echo 'etcd: bad flag'; else touch "+marker+"; echo 'bind: address already in use'; fi\nexit 1")
	c := &Cluster{dir: t.TempDir(), logf: t.Logf, bins: Binaries{Etcd: bin}}
	err := c.launch(t.Context())
	if err == nil || errors.Is(err, errPortTaken) || !strings.Contains(err.Error(), "bad flag") {
		t.Fatalf("launch: %v, want the second attempt's bad flag and no port clash", err)
	}
	if n := strings.Count(fileTail(filepath.Join(c.dir, "etcd.log"), 0, 100), "=== "); n != 2 {
		t.Errorf("etcd started %d times, want 2", n)
	}
}
