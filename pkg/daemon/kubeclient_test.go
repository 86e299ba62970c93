package daemon

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// In the remote hypervisor mode every StartVM reads its pod and service
// account (image-pull secrets) and writes an event through the node's
// client: a burst of sandboxes (bench S10) must not queue behind
// client-go's default client-side limit of 5 requests a second. 100
// requests at once would wait (100-10)/5 = 18 s there.
func TestKubeClientServesASandboxBurst(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"kind":"ServiceAccount","apiVersion":"v1","metadata":{"name":"default","namespace":"ns"}}`)
	}))
	defer srv.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, srv.URL)), 0o600))
	client, err := (&Options{kubeconfig: kubeconfig}).kubeClient()
	require.NoError(t, err)

	const requests = 100 // a node's burst: one service-account read per sandbox
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, requests)
	for range requests {
		wg.Go(func() {
			_, err := client.CoreV1().ServiceAccounts("ns").Get(ctx, "default", metav1.GetOptions{})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	// With client-go's default limit this takes 18 s; caa's allows the
	// burst at once. 5 s leaves room for a loaded machine.
	require.Less(t, time.Since(t0), 5*time.Second, "the node's apiserver client holds a burst of requests back")
}
