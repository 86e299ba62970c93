package realnode

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	podvmfake "github.com/caa-project/caa/test/mocks/podvm"
)

// Egress is the apiserver's way to the kubelets of nodes that live in a
// network namespace of their own: an HTTP CONNECT proxy on this process's
// loopback that dials inside the node's namespace, named by the apiserver's
// egress selector for its "cluster" traffic (logs, exec, port-forward: what
// a real cluster sends through konnectivity when the control plane cannot
// route to the nodes).
type Egress struct {
	// Config is the EgressSelectorConfiguration file; pass it to the
	// apiserver as --egress-selector-config-file.
	Config string

	mu    sync.Mutex
	netns string
	srv   *http.Server
	ln    net.Listener
	wg    sync.WaitGroup
	conns map[net.Conn]struct{}
}

// StartEgress starts the proxy and writes its configuration into dir.
// SetNetNS names the namespace it dials in; until then it dials here.
func StartEgress(dir string) (*Egress, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("egress proxy: %w", err)
	}
	e := &Egress{Config: filepath.Join(dir, "egress-selector.yaml"), ln: ln, conns: map[net.Conn]struct{}{}}
	conf := fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      tcp:
        url: http://%s
`, ln.Addr())
	if err := os.WriteFile(e.Config, []byte(conf), 0o644); err != nil {
		ln.Close()
		return nil, fmt.Errorf("egress selector configuration: %w", err)
	}
	e.srv = &http.Server{Handler: http.HandlerFunc(e.connect), ReadHeaderTimeout: 10 * time.Second}
	e.wg.Go(func() { _ = e.srv.Serve(ln) })
	return e, nil
}

// SetNetNS makes the proxy dial in the namespace at path.
func (e *Egress) SetNetNS(path string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.netns = path
}

func (e *Egress) connect(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
		return
	}
	e.mu.Lock()
	netns := e.netns
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	var up net.Conn
	var err error
	if netns != "" {
		up, err = podvmfake.DialIn(netns)(ctx, "tcp", r.Host)
	} else {
		up, err = (&net.Dialer{}).DialContext(ctx, "tcp", r.Host)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		http.Error(w, "no hijack", http.StatusInternalServerError)
		return
	}
	down, buf, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	if _, err := io.WriteString(down, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		up.Close()
		down.Close()
		return
	}
	e.track(up, down)
	e.wg.Go(func() {
		defer e.untrack(up, down)
		done := make(chan struct{})
		go func() {
			_, _ = io.Copy(up, buf)
			if c, ok := up.(interface{ CloseWrite() error }); ok {
				_ = c.CloseWrite()
			}
			close(done)
		}()
		_, _ = io.Copy(down, up)
		down.Close()
		<-done
		up.Close()
	})
}

func (e *Egress) track(cs ...net.Conn) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range cs {
		e.conns[c] = struct{}{}
	}
}

func (e *Egress) untrack(cs ...net.Conn) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range cs {
		delete(e.conns, c)
	}
}

// Close stops the proxy and cuts the tunnels it holds.
func (e *Egress) Close() {
	_ = e.srv.Close()
	e.mu.Lock()
	for c := range e.conns {
		c.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
}
