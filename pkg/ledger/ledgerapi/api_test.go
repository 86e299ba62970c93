package ledgerapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/caa-project/caa/pkg/ledger"
	"github.com/caa-project/caa/pkg/ledger/ledgerapi"
)

// shortDir keeps unix socket paths under the 108-byte limit that long
// t.TempDir() names can exceed.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "caa")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Join(dir, "l")
}

func openWritable(t *testing.T, path string) *ledger.Ledger {
	t.Helper()
	l, err := ledger.Open(ledger.Options{Path: path, Node: "node-a", Cluster: "c1", Timeout: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func seed(t *testing.T, l *ledger.Ledger) {
	t.Helper()
	for i, name := range []string{"web", "db", "cache"} {
		r, err := l.Put(ledger.Record{
			PodUID: "uid-" + name, Namespace: "default", Name: name, Phase: ledger.PhaseCreating,
			Provider: "aws", Key: "key-" + name, Attempt: 1,
		})
		require.NoError(t, err)
		if i < 2 {
			r.Phase, r.VMID = ledger.PhaseRunning, "i-"+name
			_, err = l.Put(r)
			require.NoError(t, err)
		}
	}
	r, err := l.Get("uid-cache")
	require.NoError(t, err)
	require.NoError(t, l.Delete("uid-cache", r.Revision))
}

// serve runs the API for l on its socket until the test ends.
func serve(t *testing.T, l *ledger.Ledger) string {
	t.Helper()
	sock := ledgerapi.SocketPath(l.Path())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ledgerapi.Serve(ctx, sock, &ledgerapi.Local{L: l, KeepOpen: true}, nil) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		_, err := os.Stat(sock)
		assert.True(t, errors.Is(err, os.ErrNotExist), "socket removed on shutdown")
	})
	require.Eventually(t, func() bool {
		c, err := net.Dial("unix", sock)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	return sock
}

func TestClientMatchesLocal(t *testing.T) {
	path := shortDir(t)
	l := openWritable(t, path)
	seed(t, l)
	sock := serve(t, l)

	ctx := context.Background()
	local := &ledgerapi.Local{L: l, KeepOpen: true}
	remote := ledgerapi.NewClient(sock, time.Second)
	t.Cleanup(func() { _ = remote.Close() })

	lm, err := local.Meta(ctx)
	require.NoError(t, err)
	rm, err := remote.Meta(ctx)
	require.NoError(t, err)
	assert.Equal(t, lm.ID, rm.ID)
	assert.Equal(t, "node-a", rm.Node)

	for _, f := range []ledger.Filter{{}, {Phases: []ledger.Phase{ledger.PhaseRunning}}, {Phases: []ledger.Phase{ledger.PhaseFailed}}} {
		lr, err := local.List(ctx, f)
		require.NoError(t, err)
		rr, err := remote.List(ctx, f)
		require.NoError(t, err)
		assert.Equal(t, len(lr), len(rr), "filter %v", f)
		for i := range lr {
			assert.True(t, lr[i].UpdatedAt.Equal(rr[i].UpdatedAt))
			assert.Equal(t, lr[i].PodUID, rr[i].PodUID)
			assert.Equal(t, lr[i].Revision, rr[i].Revision)
		}
	}

	rec, err := remote.Get(ctx, "uid-web")
	require.NoError(t, err)
	assert.Equal(t, "i-web", rec.VMID)
	assert.Equal(t, uint64(2), rec.Revision)

	hist, err := remote.History(ctx, "uid-cache")
	require.NoError(t, err)
	require.Len(t, hist, 2)
	assert.Equal(t, ledger.ActionDeleted, hist[1].Action)

	all, err := remote.AllHistory(ctx)
	require.NoError(t, err)
	assert.Len(t, all, 6, "2+2 events for web and db, 2 for cache")
	for i := 1; i < len(all); i++ {
		assert.False(t, all[i].Time.Before(all[i-1].Time), "events are in time order")
	}

	st, err := remote.Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, st.Records)
	assert.Equal(t, 2, st.ByPhase[ledger.PhaseRunning])
	assert.Equal(t, 2, st.IndexedVMs)

	probs, err := remote.Verify(ctx)
	require.NoError(t, err)
	assert.Empty(t, probs)
	assert.Contains(t, remote.Source(), sock)
}

func TestClientErrorsKeepTheirKind(t *testing.T) {
	path := shortDir(t)
	l := openWritable(t, path)
	sock := serve(t, l)
	c := ledgerapi.NewClient(sock, time.Second)
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()

	_, err := c.Get(ctx, "no-such-pod")
	assert.ErrorIs(t, err, ledger.ErrNotFound)
	assert.Contains(t, err.Error(), "no-such-pod")

	_, err = c.History(ctx, "no-such-pod")
	assert.ErrorIs(t, err, ledger.ErrNotFound)

	_, err = c.List(ctx, ledger.Filter{Phases: []ledger.Phase{"Sleeping"}})
	assert.ErrorIs(t, err, ledger.ErrInvalid)
	assert.Contains(t, err.Error(), "Sleeping")
}

func TestOpenPicksDaemonThenFile(t *testing.T) {
	ctx := context.Background()

	t.Run("daemon answers", func(t *testing.T) {
		path := shortDir(t)
		l := openWritable(t, path)
		seed(t, l)
		serve(t, l)
		r, err := ledgerapi.Open(ctx, path, time.Second)
		require.NoError(t, err)
		defer r.Close()
		assert.Contains(t, r.Source(), "daemon on ")
		recs, err := r.List(ctx, ledger.Filter{})
		require.NoError(t, err)
		assert.Len(t, recs, 2)
	})

	t.Run("no daemon reads the file", func(t *testing.T) {
		path := shortDir(t)
		l := openWritable(t, path)
		seed(t, l)
		require.NoError(t, l.Close())
		r, err := ledgerapi.Open(ctx, path, time.Second)
		require.NoError(t, err)
		defer r.Close()
		assert.Contains(t, r.Source(), "read-only")
		recs, err := r.List(ctx, ledger.Filter{})
		require.NoError(t, err)
		assert.Len(t, recs, 2)
	})

	t.Run("stale socket file falls back to the file", func(t *testing.T) {
		path := shortDir(t)
		l := openWritable(t, path)
		seed(t, l)
		require.NoError(t, l.Close())
		ln, err := net.Listen("unix", ledgerapi.SocketPath(path))
		require.NoError(t, err)
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		require.NoError(t, ln.Close()) // leaves the file, nobody listening
		r, err := ledgerapi.Open(ctx, path, time.Second)
		require.NoError(t, err)
		defer r.Close()
		assert.Contains(t, r.Source(), "read-only")
	})

	t.Run("held without a socket fails within the timeout", func(t *testing.T) {
		path := shortDir(t)
		openWritable(t, path)
		start := time.Now()
		_, err := ledgerapi.Open(ctx, path, 300*time.Millisecond)
		require.ErrorIs(t, err, ledger.ErrLocked)
		assert.Contains(t, err.Error(), path)
		assert.Contains(t, err.Error(), ledgerapi.SocketPath(path))
		assert.Contains(t, err.Error(), "process ")
		assert.Less(t, time.Since(start), 30*time.Second, "it gave up instead of hanging")
	})
}

func TestServeRefusesALiveSocketAndIsPrivate(t *testing.T) {
	path := shortDir(t)
	l := openWritable(t, path)
	sock := serve(t, l)

	info, err := os.Stat(sock)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	err = ledgerapi.Serve(context.Background(), sock, &ledgerapi.Local{L: l, KeepOpen: true}, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "answered by another process")
}

func TestListOverTheWireKeepsGoodRecordsBesideCorruptOnes(t *testing.T) {
	path := shortDir(t)
	l := openWritable(t, path)
	seed(t, l)
	require.NoError(t, l.Close())

	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("records")).Put([]byte("uid-garbage"), []byte{1, 0xff, 0xff})
	}))
	require.NoError(t, db.Close())

	l = openWritable(t, path)
	sock := serve(t, l)
	c := ledgerapi.NewClient(sock, time.Second)
	t.Cleanup(func() { _ = c.Close() })

	recs, err := c.List(context.Background(), ledger.Filter{})
	require.ErrorIs(t, err, ledger.ErrCorrupt)
	assert.Contains(t, err.Error(), "uid-garbage")
	assert.Len(t, recs, 2, "the two good records still arrive")

	probs, err := c.Verify(context.Background())
	require.NoError(t, err)
	require.NotEmpty(t, probs)
	assert.Contains(t, probs[0].Where, "uid-garbage")
}

func TestAllHistoryIsReadPageByPage(t *testing.T) {
	path := shortDir(t)
	l := openWritable(t, path)
	const pods = 2*ledger.DefaultHistoryPagePods + 50
	require.NoError(t, l.Update(func(tx *ledger.Tx) error {
		for i := range pods {
			uid := fmt.Sprintf("uid-%04d", i)
			r, err := tx.Put(ledger.Record{PodUID: uid, Namespace: "default", Name: uid, Phase: ledger.PhaseCreating, Attempt: 1})
			if err != nil {
				return err
			}
			if i%2 == 0 {
				if err := tx.Delete(uid, r.Revision); err != nil {
					return err
				}
			}
		}
		return nil
	}))

	// Count what the client asks the daemon for.
	var mu sync.Mutex
	var queries []string
	h := ledgerapi.NewHandler(&ledgerapi.Local{L: l, KeepOpen: true}, nil)
	sock := ledgerapi.SocketPath(path)
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/history" {
			mu.Lock()
			queries = append(queries, r.URL.RawQuery)
			mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	c := ledgerapi.NewClient(sock, 5*time.Second)
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()

	all, err := c.AllHistory(ctx)
	require.NoError(t, err)
	assert.Len(t, all, pods+pods/2, "one entry per pod, a second for each deleted one")
	for i := 1; i < len(all); i++ {
		assert.False(t, all[i].Time.Before(all[i-1].Time), "events are in time order")
	}
	mu.Lock()
	assert.Equal(t, []string{"pods=100", "after=uid-0099&pods=100", "after=uid-0199&pods=100"}, queries,
		"three pages of at most 100 pods")
	mu.Unlock()

	local, err := (&ledgerapi.Local{L: l, KeepOpen: true}).AllHistory(ctx)
	require.NoError(t, err)
	assert.Len(t, local, len(all), "the file and the daemon agree")

	t.Run("one page", func(t *testing.T) {
		p, err := c.HistoryPage(ctx, "uid-0010", 5)
		require.NoError(t, err)
		assert.Equal(t, "uid-0015", p.Next)
		require.NotEmpty(t, p.Events)
		assert.Equal(t, "uid-0011", p.Events[0].Record.PodUID)
	})
	t.Run("a bad page size is refused", func(t *testing.T) {
		resp, err := httpOverSocket(sock).Get("http://caa/v1/history?pods=many")
		require.NoError(t, err)
		defer resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	})
	t.Run("a client without pages still gets everything", func(t *testing.T) {
		resp, err := httpOverSocket(sock).Get("http://caa/v1/history")
		require.NoError(t, err)
		defer resp.Body.Close()
		var body struct {
			Events []ledger.Event `json:"events"`
			Next   string         `json:"next"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		assert.Len(t, body.Events, len(all))
		assert.Empty(t, body.Next)
	})
}

func httpOverSocket(sock string) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
}

func seedSandboxes(t *testing.T, l *ledger.Ledger) {
	t.Helper()
	s, err := l.PutSandbox(ledger.Sandbox{ID: "sb-1", PodUID: "uid-web", Namespace: "default", Name: "web", Phase: ledger.SandboxCreated,
		Tunnel: ledger.Tunnel{VXLANID: 555000, Port: 4789, LocalIP: "10.0.0.1"}})
	require.NoError(t, err)
	s.Phase, s.Provider, s.VMID, s.IPs, s.CertSerials = ledger.SandboxRunning, "aws", "i-sb1", []string{"10.1.0.5"}, []string{"5a17"}
	_, err = l.PutSandbox(s)
	require.NoError(t, err)
}

// The sandboxes read the same over the daemon's socket as from the file,
// and a daemon older than them is told apart from a missing sandbox.
func TestSandboxesOverTheWire(t *testing.T) {
	path := shortDir(t)
	l := openWritable(t, path)
	seedSandboxes(t, l)
	sock := serve(t, l)
	ctx := context.Background()
	local := &ledgerapi.Local{L: l, KeepOpen: true}
	remote := ledgerapi.NewClient(sock, time.Second)
	t.Cleanup(func() { _ = remote.Close() })

	ls, err := local.Sandboxes(ctx)
	require.NoError(t, err)
	rs, err := remote.Sandboxes(ctx)
	require.NoError(t, err)
	require.Len(t, rs, 1)
	assert.Equal(t, ls[0].Revision, rs[0].Revision)
	assert.Equal(t, "i-sb1", rs[0].VMID)
	assert.Equal(t, 555000, rs[0].Tunnel.VXLANID)
	assert.Equal(t, []string{"5a17"}, rs[0].CertSerials)

	s, err := remote.Sandbox(ctx, "sb-1")
	require.NoError(t, err)
	assert.Equal(t, ledger.SandboxRunning, s.Phase)
	hist, err := remote.SandboxHistory(ctx, "sb-1")
	require.NoError(t, err)
	require.Len(t, hist, 2)
	assert.Equal(t, ledger.SandboxCreated, hist[0].Sandbox.Phase)

	_, err = remote.Sandbox(ctx, "sb-none")
	assert.ErrorIs(t, err, ledger.ErrNotFound)
	_, err = remote.SandboxHistory(ctx, "sb-none")
	assert.ErrorIs(t, err, ledger.ErrNotFound)

	// A daemon that predates the sandboxes: its mux answers 404, no JSON.
	old := filepath.Join(filepath.Dir(path), "old.sock")
	ln, err := net.Listen("unix", old)
	require.NoError(t, err)
	srv := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	oc := ledgerapi.NewClient(old, time.Second)
	t.Cleanup(func() { _ = oc.Close() })
	_, err = oc.Sandboxes(ctx)
	assert.ErrorIs(t, err, ledgerapi.ErrNotServed)
	assert.NotErrorIs(t, err, ledger.ErrNotFound)
}
