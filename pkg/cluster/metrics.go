package cluster

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the cluster caa's Prometheus series.
type Metrics struct {
	Listings  *prometheus.CounterVec // by result: ok, error, unsynced
	ListedVMs prometheus.Gauge
	Waiting   prometheus.Gauge
	Deletes   *prometheus.CounterVec // departed nodes' VMs, by result
	Published *prometheus.CounterVec // Node views, by result
	Leader    prometheus.Gauge
	Strangers prometheus.Gauge // VMs tagged for nodes this cluster never had
}

// NewMetrics registers the series on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Listings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "caa_cluster_listings_total", Help: "Cluster-wide VM listings by the leader, by result.",
		}, []string{"result"}),
		ListedVMs: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "caa_cluster_listed_vms", Help: "VMs in the last cluster-wide listing.",
		}),
		Waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "caa_cluster_departed_vms_waiting", Help: "VMs of absent nodes waiting out --node-gone-grace.",
		}),
		Deletes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "caa_cluster_departed_vm_deletes_total", Help: "Deletes of VMs of nodes gone from the cluster, by result.",
		}, []string{"result"}),
		Published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "caa_cluster_views_published_total", Help: "Per-node cloud views written on Nodes, by result.",
		}, []string{"result"}),
		Leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "caa_cluster_leader", Help: "1 while this replica holds the Lease.",
		}),
		Strangers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "caa_cluster_unknown_node_vms",
			Help: "VMs in the last listing tagged with this cluster id for a node this cluster never had (another cluster on the same id); never deleted.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.Listings, m.ListedVMs, m.Waiting, m.Deletes, m.Published, m.Leader, m.Strangers)
	}
	return m
}

func (m *Metrics) listing(result string) { m.Listings.WithLabelValues(result).Inc() }
