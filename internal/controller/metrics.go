package controller

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the controller's Prometheus series, registered on
// controller-runtime's registry (served on /metrics).
type metrics struct {
	releases   *prometheus.GaugeVec
	recoveries *prometheus.CounterVec
	delay      prometheus.Histogram
	held       prometheus.Histogram
	waiters    prometheus.Gauge
	errors     *prometheus.CounterVec

	mu sync.Mutex
	// state is the lock state last observed per pending release (key
	// namespace/name); releases counts them.
	state map[string]string
	// queued is the number of waiters last observed per release.
	queued map[string]int
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		releases: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "helm_autorecover_pending_releases",
			Help: "Pending helm releases the controller watches, by the state of their lock as last judged (live, expired, legacy-pending, none).",
		}, []string{"lock_state"}),
		recoveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "helm_autorecover_recoveries_total",
			Help: "Releases the controller recovered, by reason (expired-lock: its holder stopped renewing; legacy: pending with no lock for --recover-legacy-after) and strategy (fail, rollback).",
		}, []string{"reason", "strategy"}),
		delay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "helm_autorecover_recovery_delay_seconds",
			Help:    "Server time from the moment a release became recoverable (its lock's LOCKED TILL, or its pending revision reaching --recover-legacy-after) to its recovery (the midpoint of the recovery's server-time bounds).",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60, 300, 900},
		}),
		held: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "helm_autorecover_abandoned_lock_hold_seconds",
			Help:    "How long the holder of each recovered release held its lock, from acquiry to its last LOCKED TILL, as observed.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14),
		}),
		waiters: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "helm_autorecover_lock_waiters",
			Help: "Clients queued for the locks of pending releases (--lock-timeout), as last observed.",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "helm_autorecover_errors_total",
			Help: "Failures of the controller, by kind: read, recover, forbidden and conflict are retried with backoff; rollback (helm's rollback after a recovery failed; the release stays marked failed) is not.",
		}, []string{"kind"}),
		state:  map[string]string{},
		queued: map[string]int{},
	}
	reg.MustRegister(m.releases, m.recoveries, m.delay, m.held, m.waiters, m.errors)
	return m
}

// observe records the lock state and waiters last judged for a release;
// an empty state forgets it (no longer pending).
func (m *metrics) observe(key, state string, waiters int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if state == "" {
		delete(m.state, key)
		delete(m.queued, key)
	} else {
		m.state[key] = state
		m.queued[key] = waiters
	}
	counts := map[string]float64{"live": 0, "expired": 0, "legacy-pending": 0, "none": 0}
	total := 0
	for k, s := range m.state {
		counts[s]++
		total += m.queued[k]
	}
	for s, n := range counts {
		m.releases.WithLabelValues(s).Set(n)
	}
	m.waiters.Set(float64(total))
}
