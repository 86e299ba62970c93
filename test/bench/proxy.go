package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
)

// Traffic is what a counting proxy saw for one kind of request: how many
// started, and how many response bytes flowed back (a watch's bytes count
// as they stream).
type Traffic struct {
	Requests int64 `json:"requests"`
	Bytes    int64 `json:"bytes"`
}

// Proxy is a reverse proxy in front of the apiserver that counts every
// request by verb and resource ("list pods", "watch pods", "patch
// nodes"), so a scenario knows exactly what one client cost the apiserver.
// It serves TLS on loopback with its own certificate (CAPEM), since
// client-go sends a kubeconfig's token over TLS only.
type Proxy struct {
	URL   string
	CAPEM []byte

	srv  *httptest.Server
	mu   sync.Mutex
	seen map[string]*Traffic
}

// StartProxy listens on 127.0.0.1 and forwards to upstream, trusting caPEM.
func StartProxy(upstream string, caPEM []byte) (*Proxy, error) {
	target, err := url.Parse(upstream)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("proxy: no CA certificate in PEM")
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, MaxIdleConnsPerHost: 64}
	// Watches stream: pass every chunk on at once.
	rp.FlushInterval = -1
	p := &Proxy{seen: map[string]*Traffic{}}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := p.count(Classify(r.Method, r.URL))
		rp.ServeHTTP(&countingWriter{ResponseWriter: w, p: p, t: t}, r)
	}))
	p.srv.EnableHTTP2 = true
	p.srv.StartTLS()
	p.URL = p.srv.URL
	p.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})
	return p, nil
}

// Close stops the proxy and cuts the streams through it.
func (p *Proxy) Close() error {
	p.srv.CloseClientConnections()
	p.srv.Close()
	return nil
}

func (p *Proxy) count(key string) *Traffic {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.seen[key]
	if t == nil {
		t = &Traffic{}
		p.seen[key] = t
	}
	t.Requests++
	return t
}

// Snapshot returns the counts so far, by "verb resource".
func (p *Proxy) Snapshot() map[string]Traffic {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]Traffic, len(p.seen))
	for k, t := range p.seen {
		out[k] = *t
	}
	return out
}

// Reset zeroes the counts. Streams already open count their later bytes
// under their key again, with no new request.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range p.seen {
		*t = Traffic{}
	}
}

// Diff is after minus before, key by key (keys with nothing dropped).
func Diff(after, before map[string]Traffic) map[string]Traffic {
	out := maps.Clone(after)
	for k, b := range before {
		a := out[k]
		a.Requests -= b.Requests
		a.Bytes -= b.Bytes
		out[k] = a
	}
	for k, t := range out {
		if t.Requests == 0 && t.Bytes == 0 {
			delete(out, k)
		}
	}
	return out
}

// countingWriter adds the bytes of a response to its request's key.
type countingWriter struct {
	http.ResponseWriter
	p *Proxy
	t *Traffic
}

// Write counts before it writes, so that a client that has read the
// bytes finds them counted (a failed write still counts: the apiserver
// sent them).
func (w *countingWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	w.t.Bytes += int64(len(b))
	w.p.mu.Unlock()
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the Flusher underneath.
func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Classify names a Kubernetes API request "verb resource[/subresource]"
// the way the apiserver's audit log does: a GET of a collection is a list,
// with watch=true a watch, of one object a get.
func Classify(method string, u *url.URL) string {
	segs := strings.Split(strings.Trim(u.Path, "/"), "/")
	switch {
	case len(segs) >= 2 && segs[0] == "api":
		segs = segs[2:]
	case len(segs) >= 3 && segs[0] == "apis":
		segs = segs[3:]
	default:
		return strings.ToLower(method) + " " + u.Path
	}
	// namespaces/<ns>/<resource>/... is namespaced; namespaces alone or
	// namespaces/<ns> is the namespace resource itself.
	if len(segs) >= 3 && segs[0] == "namespaces" {
		segs = segs[2:]
	}
	resource, named, sub := "", false, ""
	if len(segs) > 0 {
		resource = segs[0]
	}
	if len(segs) > 1 {
		named = true
	}
	if len(segs) > 2 {
		sub = "/" + segs[2]
	}
	verb := ""
	switch method {
	case http.MethodGet:
		switch {
		case u.Query().Get("watch") == "true" || u.Query().Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
		if !named {
			verb = "deletecollection"
		}
	default:
		verb = strings.ToLower(method)
	}
	return verb + " " + resource + sub
}
