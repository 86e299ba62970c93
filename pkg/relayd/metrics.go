package relayd

import (
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/caa-project/caa/pkg/health"
	"github.com/caa-project/caa/pkg/relay"
)

// The relay daemon's series (`caa relay`'s /metrics). They carry no
// sandbox id or address: one series per result, whatever the node serves.
var (
	descReady = prometheus.NewDesc("caa_relay_ready",
		"1 when the relay daemon serves its control socket (caa's client file read), else 0.", nil, nil)
	descSockets = prometheus.NewDesc("caa_relay_sockets",
		"Agent sockets the relay daemon serves now (one per running sandbox caa registered).", nil, nil)
	descOpen = prometheus.NewDesc("caa_relay_connections_open",
		"kata shim connections relayed to a pod VM now.", nil, nil)
	descConns = prometheus.NewDesc("caa_relay_connections_total",
		"kata shim connections accepted on the agent sockets, by result: relayed (the VM's forwarder answered) or failed (it did not; the shim's connection was closed at once).",
		[]string{"result"}, nil)
	descControl = prometheus.NewDesc("caa_relay_control_requests_total",
		"Requests on the control socket, by operation (serve, stop, list, reach) and result (ok, error, refused: a peer uid not allowed).",
		[]string{"op", "result"}, nil)
)

// Control request results, the values of caa_relay_control_requests_total's
// result label.
const (
	controlOK      = "ok"
	controlError   = "error"
	controlRefused = "refused"
)

// controlKey is one series of caa_relay_control_requests_total.
type controlKey struct{ op, result string }

// Collector returns the collector of the server's series: read at each
// scrape from the relays it serves, plus the counts of those it closed, so
// the counters never go down.
func (s *Server) Collector() prometheus.Collector { return (*serverCollector)(s) }

type serverCollector Server

func (c *serverCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReady, descSockets, descOpen, descConns, descControl} {
		ch <- d
	}
}

func (c *serverCollector) Collect(ch chan<- prometheus.Metric) {
	s := (*Server)(c)
	s.mu.Lock()
	total := s.retired
	sockets := len(s.relays)
	for _, sv := range s.relays {
		st := sv.r.Stats()
		total.Relayed += st.Relayed
		total.Failed += st.Failed
		total.Open += st.Open
	}
	control := map[controlKey]int{}
	for _, op := range []string{OpServe, OpStop, OpList, OpReach} {
		control[controlKey{op, controlOK}] = 0
		control[controlKey{op, controlError}] = 0
	}
	control[controlKey{"", controlRefused}] = 0
	for k, n := range s.control {
		control[k] = n
	}
	s.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(descSockets, prometheus.GaugeValue, float64(sockets))
	ch <- prometheus.MustNewConstMetric(descOpen, prometheus.GaugeValue, float64(total.Open))
	ch <- prometheus.MustNewConstMetric(descConns, prometheus.CounterValue, float64(total.Relayed), "relayed")
	ch <- prometheus.MustNewConstMetric(descConns, prometheus.CounterValue, float64(total.Failed), "failed")
	for k, n := range control {
		ch <- prometheus.MustNewConstMetric(descControl, prometheus.CounterValue, float64(n), k.op, k.result)
	}
}

// retire adds a closed relay's counts to the server's; s.mu is held.
func (s *Server) retire(r *relay.Relay) {
	st := r.Stats()
	s.retired.Accepted += st.Accepted
	s.retired.Relayed += st.Relayed
	s.retired.Failed += st.Failed
}

// countControl counts one control request; s.mu is not held.
func (s *Server) countControl(op, result string) {
	switch op {
	case OpServe, OpStop, OpList, OpReach:
	default:
		op = "other" // an unknown op must not make a series of its own
	}
	if result == controlRefused {
		op = ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.control == nil {
		s.control = map[controlKey]int{}
	}
	s.control[controlKey{op, result}]++
}

// NewRegistry returns the relay daemon's registry: the server's series,
// once it runs (nil until then: caa_relay_ready reads 0), and the Go runtime
// and process collectors.
func newRegistry(srv *atomic.Pointer[Server]) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), &lateCollector{srv: srv})
	return reg
}

// lateCollector serves the server's series once there is a server, and a
// caa_relay_ready of 0 before (the daemon waits for caa's client file).
type lateCollector struct{ srv *atomic.Pointer[Server] }

func (l *lateCollector) Describe(ch chan<- *prometheus.Desc) { (*serverCollector)(nil).Describe(ch) }

func (l *lateCollector) Collect(ch chan<- prometheus.Metric) {
	if s := l.srv.Load(); s != nil {
		s.Collector().Collect(ch)
		return
	}
	ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, 0)
}

// healthHandler serves /healthz (the process answers), /readyz (200 once
// the control socket is served) and /metrics. No sandbox id or address is
// in any answer: the relay runs on the host network.
func healthHandler(srv *atomic.Pointer[Server], reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", health.MetricsHandler(reg))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if srv.Load() == nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready: waiting for caa's client file (caa writes it when it starts in the remote hypervisor mode with --relay-socket)\n"))
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
