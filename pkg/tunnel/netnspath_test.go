package tunnel_test

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/caa-project/caa/pkg/podvm"
	"github.com/caa-project/caa/pkg/tunnel"
)

// inImageWithoutVarRun runs f on a thread of its own mount namespace in which
// /var is an empty tmpfs: /var/run (and so /var/run/netns) does not exist,
// /run/netns does, as in a distroless image with the host's /run/netns
// mounted. The thread is thrown away after f.
func inImageWithoutVarRun(t *testing.T, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			done <- err
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			done <- err
			return
		}
		if err := unix.Mount("tmpfs", "/var", "tmpfs", 0, ""); err != nil {
			done <- err
			return
		}
		if _, err := os.Stat("/var/run/netns"); err == nil {
			done <- os.ErrExist
			return
		}
		done <- f()
	}()
	return <-done
}

// TestKatasVarRunNetNSPathWorksWithoutTheLink: kata's networkNamespacePath
// is /var/run/netns/<name>; in a container that has only the host's
// /run/netns mounted and no /var/run link, caa still inspects, builds and
// checks the tunnel in that namespace.
func TestKatasVarRunNetNSPathWorksWithoutTheLink(t *testing.T) {
	w := newWorld(t)
	name := filepath.Base(w.pod.NSPath)
	kata := "/var/run/netns/" + name
	_, err := os.Stat(filepath.Join(tunnel.NetNSDir, name))
	require.NoError(t, err, "the fake pod namespace must be under /run/netns on the host")
	require.Equal(t, kata, tunnel.ResolveNetNS(kata), "a path that exists is used as it is")
	require.Equal(t, "/somewhere/else", tunnel.ResolveNetNS("/somewhere/else"))

	cfg := w.cfg
	cfg.NetNSPath = kata
	gone := cfg
	gone.NetNSPath = "/var/run/netns/caa-no-such-pod"
	// Inside the thread only errors travel back (require cannot stop a
	// goroutine other than the test's).
	var (
		resolved               string
		checkErr, inspectErr   error
		setupErr, checkedErr   error
		teardownErr, goneTdErr error
		goneSetupErr           error
		n                      podvm.Network
		st                     tunnel.State
	)
	require.NoError(t, inImageWithoutVarRun(t, func() error {
		resolved = tunnel.ResolveNetNS(kata)
		checkErr = tunnel.CheckPodNetNS(kata, cfg.HostNetNSPath)
		n, inspectErr = tunnel.Inspect(kata)
		setupErr = tunnel.Setup(cfg)
		st, checkedErr = tunnel.Check(cfg)
		teardownErr = tunnel.Teardown(cfg)
		goneTdErr = tunnel.Teardown(gone)
		goneSetupErr = tunnel.Setup(gone)
		return nil
	}))
	require.Equal(t, filepath.Join(tunnel.NetNSDir, name), resolved)
	require.NoError(t, checkErr)
	require.NoError(t, inspectErr)
	require.Equal(t, w.pod.IP, n.PodIP)
	require.NoError(t, setupErr)
	require.NoError(t, checkedErr)
	require.True(t, st.Complete(), "%+v", st)
	require.NoError(t, teardownErr)
	// A namespace gone from both places is "gone", as before.
	require.NoError(t, goneTdErr)
	require.ErrorContains(t, goneSetupErr, "does not exist")
}
