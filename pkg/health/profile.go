package health

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
)

// ProfileHandler serves Go's runtime profiles (net/http/pprof's
// /debug/pprof/ index, heap, goroutine, allocs, profile, trace, ...) on a
// mux of its own, for the opt-in --pprof-addr listener.
//
// It is never served by default nor on the health address: a goroutine
// dump shows call arguments and /debug/pprof/cmdline the whole command
// line, a CPU profile or trace costs CPU while it runs, and the health
// port is open to the kubelet and to scrapers. An operator who wants a
// profile starts caa with --pprof-addr on loopback (127.0.0.1:6060) and
// reaches it with kubectl port-forward or from the node.
func ProfileHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("POST /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return mux
}

// CheckProfileAddr validates --pprof-addr: empty (off) or host:port.
// It returns whether the host is a loopback address, so the caller can
// warn about an address reachable from elsewhere.
func CheckProfileAddr(addr string) (loopback bool, err error) {
	if addr == "" {
		return true, nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("--pprof-addr %q: want host:port, such as 127.0.0.1:6060 (empty: off): %w", addr, err)
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}
