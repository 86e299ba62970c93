package relayd_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/caa-project/caa/internal/logbuf"
	"github.com/caa-project/caa/pkg/relayd"
)

// childSocket set in the environment makes the test binary a control
// client instead: it lists the daemon on that socket, prints the outcome
// and exits. The peer check's test runs it as another user.
const childSocket = "RELAYD_TEST_CONTROL_CLIENT"

func TestMain(m *testing.M) {
	if sock := os.Getenv(childSocket); sock != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, boot, err := (&relayd.Client{Socket: sock}).List(ctx)
		if err != nil {
			fmt.Println("error:", err)
		} else {
			fmt.Println("boot:", boot)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// openDaemon serves a daemon with allow on a control socket in a directory
// any user may enter, the socket's mode widened to 0666: the peer check is
// then all that keeps another user out.
func openDaemon(t *testing.T, allow []uint32) (*relayd.Server, string, *logbuf.Buffer) {
	t.Helper()
	d := startDaemon(t) // for its CA and client file
	logs := &logbuf.Buffer{}
	srv, err := relayd.NewServer(relayd.Config{ClientFile: filepath.Join(d.caDir, relayd.ClientFile), Refresh: time.Hour,
		AllowUIDs: allow, Log: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "rdpeer")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	ctl := filepath.Join(dir, "ctl", "relay.sock")
	ln, err := relayd.Listen(ctl)
	require.NoError(t, err)
	fi, err := os.Stat(ctl)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "Listen makes the socket private")
	require.NoError(t, os.Chmod(filepath.Dir(ctl), 0o755))
	require.NoError(t, os.Chmod(ctl, 0o666))
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, ln) }()
	t.Cleanup(func() { stop(); <-done })
	return srv, ctl, logs
}

// A peer whose uid is not allowed is refused with an error naming its uid
// and the flag, and the daemon logs its pid and uid.
func TestControlSocketRefusesAPeerOfAnotherUID(t *testing.T) {
	other := uint32(os.Getuid()) + 4242
	srv, ctl, logs := openDaemon(t, []uint32{other})
	assert.Equal(t, []uint32{other}, srv.Allowed())
	_, _, err := (&relayd.Client{Socket: ctl}).List(ctxT(t))
	require.Error(t, err)
	assert.NotErrorIs(t, err, relayd.ErrUnavailable, "an answer, not a broken connection")
	assert.Contains(t, err.Error(), fmt.Sprintf("uid %d (pid %d)", os.Getuid(), os.Getpid()))
	assert.Contains(t, err.Error(), "--allow-uid")
	assert.Contains(t, logs.String(), fmt.Sprintf("peerPid=%d peerUid=%d", os.Getpid(), os.Getuid()))

	srv, _, _ = openDaemon(t, nil)
	assert.ElementsMatch(t, uniq(0, uint32(os.Getuid())), srv.Allowed(), "the default: root and the daemon's uid")
}

func uniq(a, b uint32) []uint32 {
	if a == b {
		return []uint32{a}
	}
	return []uint32{a, b}
}

// A process of another user (nobody) is refused by the default allow list
// and accepted once its uid is allowed. Needs root, to run the child as
// nobody; CI runs it as root, as the namespace tests.
func TestControlSocketChecksThePeersUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatalf("this test runs a client as user nobody and needs root (CI runs it as root); run: sudo go test -run %s ./pkg/relayd", t.Name())
	}
	const nobody = 65534
	// The test binary, where nobody may run it.
	self, err := os.Executable()
	require.NoError(t, err)
	bin, err := os.MkdirTemp("", "rdbin")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(bin) })
	require.NoError(t, os.Chmod(bin, 0o755))
	exe := filepath.Join(bin, "relayd.test")
	src, err := os.Open(self)
	require.NoError(t, err)
	dst, err := os.OpenFile(exe, os.O_CREATE|os.O_WRONLY, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(dst, src)
	src.Close()
	require.NoError(t, err)
	require.NoError(t, dst.Close())
	asNobody := func(ctl string) (out string, pid int) {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), childSocket+"="+ctl)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		var o bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &o
		require.NoError(t, cmd.Start())
		pid = cmd.Process.Pid
		require.NoError(t, cmd.Wait(), "child: %s", o.String())
		return strings.TrimSpace(o.String()), pid
	}

	srv, ctl, logs := openDaemon(t, nil)
	out, pid := asNobody(ctl)
	assert.Contains(t, out, fmt.Sprintf("error: relay daemon: list : refused: uid %d (pid %d) may not use", nobody, pid))
	assert.Contains(t, logs.String(), fmt.Sprintf("peerPid=%d peerUid=%d", pid, nobody), "the log names the peer")
	_, boot, err := (&relayd.Client{Socket: ctl}).List(ctxT(t))
	require.NoError(t, err, "root is allowed")
	assert.Equal(t, srv.Boot(), boot)

	srv, ctl, _ = openDaemon(t, []uint32{0, nobody})
	out, _ = asNobody(ctl)
	assert.Equal(t, "boot: "+srv.Boot(), out, "an allowed uid is served")
}
