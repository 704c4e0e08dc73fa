package main

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// metrics are the hub's Prometheus metrics, in a registry of its own.
type metrics struct {
	reg      *prometheus.Registry
	syncs    *prometheus.HistogramVec
	fetches  *prometheus.HistogramVec
	clusters *prometheus.HistogramVec
	webhook  *prometheus.CounterVec
	statuses *prometheus.CounterVec
	// The connections of each listener (limitListener).
	connOpen    *prometheus.GaugeVec
	connMax     *prometheus.GaugeVec
	connRefused *prometheus.CounterVec
}

// newMetrics registers the hub's metrics; c is the cache WorkerClusters are counted from.
func newMetrics(reg *prometheus.Registry, c client.Reader) *metrics {
	m := &metrics{
		reg: reg,
		syncs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "flotilla_hub_sync_duration_seconds", Help: "Time to fetch a fleet source and reconcile what its new head changed.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 12),
		}, []string{"source", "result"}),
		fetches: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "flotilla_hub_fetch_duration_seconds", Help: "Time to look for a new head of a fleet source and fetch it.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}, []string{"source", "result"}),
		clusters: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "flotilla_hub_cluster_reconcile_duration_seconds", Help: "Time to validate, render and write one changed cluster and push its desired state.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 12),
		}, []string{"source", "result"}),
		webhook: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_hub_webhook_deliveries_total", Help: "Webhook deliveries by source and HTTP answer.",
		}, []string{"source", "code"}),
		statuses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_hub_commit_statuses_posted_total", Help: "Commit statuses posted, by source, state and result.",
		}, []string{"source", "state", "result"}),
		connOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "flotilla_hub_connections_open", Help: "Connections open, by listener (tunnel, http, proxy).",
		}, []string{"listener"}),
		connMax: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "flotilla_hub_connections_max", Help: "The most connections a listener holds open at once (connections.<listener>.max).",
		}, []string{"listener"}),
		connRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flotilla_hub_connections_refused_total", Help: "Connections closed as soon as accepted because their listener held its most already.",
		}, []string{"listener"}),
	}
	reg.MustRegister(m.syncs, m.fetches, m.clusters, m.webhook, m.statuses, m.connOpen, m.connMax, m.connRefused, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&clusterCollector{c: c, desc: prometheus.NewDesc("flotilla_hub_clusters", "WorkerClusters by condition and status.", []string{"namespace", "condition", "status"}, nil)})
	return m
}

func (m *metrics) observeSync(source string, took time.Duration, err error) {
	observe(m.syncs, source, took, err)
}

func (m *metrics) observeFetch(source string, took time.Duration, err error) {
	observe(m.fetches, source, took, err)
}

func (m *metrics) observeReconcile(source string, took time.Duration, err error) {
	observe(m.clusters, source, took, err)
}

func observe(h *prometheus.HistogramVec, source string, took time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	h.WithLabelValues(source, result).Observe(took.Seconds())
}

func (m *metrics) connected(sessions func() int) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "flotilla_hub_connected_agents", Help: "Agents with a live tunnel."},
		func() float64 { return float64(sessions()) }))
}

// connections are the metrics of one listener's connections, which hold at most max:
// its series exist, at zero, from the start, so that a rate of refusals can be taken
// from the first scrape on.
func (m *metrics) connections(listener string, max int) connCounts {
	m.connMax.WithLabelValues(listener).Set(float64(max))
	return connCounts{open: m.connOpen.WithLabelValues(listener), refused: m.connRefused.WithLabelValues(listener)}
}

// statusQueue reports a source's queue of commit statuses: a forge that throttles the
// hub shows as a queue that grows, and a queue that overflowed as statuses dropped.
func (m *metrics) statusQueue(source string, queue func() (pending, dropped int)) {
	labels := prometheus.Labels{"source": source}
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "flotilla_hub_commit_statuses_pending", ConstLabels: labels,
			Help: "Commit statuses queued or being posted."},
			func() float64 { p, _ := queue(); return float64(p) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "flotilla_hub_commit_statuses_dropped_total", ConstLabels: labels,
			Help: "Commit statuses dropped unposted because the queue was full, oldest of a fleet-wide change first."},
			func() float64 { _, d := queue(); return float64(d) }),
	)
}

// webhooks counts deliveries by the answer the handler gave.
func (m *metrics) webhooks(source string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(rec, r)
		m.webhook.WithLabelValues(source, strconv.Itoa(rec.code)).Inc()
	})
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) { r.code = code; r.ResponseWriter.WriteHeader(code) }

func (m *metrics) countStatuses(source string, b commitstatus.Backend) commitstatus.Backend {
	return &countingBackend{Backend: b, count: func(st commitstatus.State, err error) {
		result := "ok"
		if err != nil {
			result = "error"
		}
		m.statuses.WithLabelValues(source, string(st), result).Inc()
	}}
}

type countingBackend struct {
	commitstatus.Backend
	count func(commitstatus.State, error)
}

func (c *countingBackend) Set(ctx context.Context, commit string, st commitstatus.Status) error {
	err := c.Backend.Set(ctx, commit, st)
	c.count(st.State, err)
	return err
}

// clusterCollector counts WorkerClusters by condition when scraped. It reads the hub's
// cache, so that a scrape, however frequent, sends no request to the hub cluster.
type clusterCollector struct {
	c    client.Reader
	desc *prometheus.Desc
}

func (cc *clusterCollector) Describe(ch chan<- *prometheus.Desc) { ch <- cc.desc }

func (cc *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var list v1alpha1.WorkerClusterList
	// Only read, never kept: ten thousand copies per scrape would be waste.
	if err := cc.c.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(cc.desc, err)
		return
	}
	type key struct{ ns, cond, status string }
	counts := map[key]int{}
	for _, wc := range list.Items {
		for _, typ := range []string{v1alpha1.ConditionRegistered, v1alpha1.ConditionConnected, v1alpha1.ConditionWorkerConfigured, v1alpha1.ConditionReady, v1alpha1.ConditionDispatchReady} {
			s := string(metav1.ConditionUnknown)
			for _, c := range wc.Status.Conditions {
				if c.Type == typ {
					s = string(c.Status)
				}
			}
			counts[key{wc.Namespace, typ, s}]++
		}
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(cc.desc, prometheus.GaugeValue, float64(n), k.ns, k.cond, k.status)
	}
}
