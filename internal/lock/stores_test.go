package lock

import (
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// Stores reaches the stores from this package's own tests. The stores are
// packages of their own that import this one, so these tests cannot import
// them; stores_bridge_test.go (package lock_test, which can) fills Stores
// before any test runs.
var Stores struct {
	LeaseBackend   func(kubernetes.Interface, *servertime.Estimator, clock.Clock) *Backend
	ReleaseBackend func(kubernetes.Interface, *servertime.Estimator, clock.Clock, records.Driver) *Backend
	// LeaseStore and ReleaseStore open a store of namespace ns (the Lease
	// store over the client's Leases).
	LeaseStore   func(client kubernetes.Interface, ns string) Store
	ReleaseStore func(client kubernetes.Interface, driver records.Driver, ns string) Store

	LeaseSnapshot   func(*coordinationv1.Lease) *Snapshot
	SetHolder       func(*coordinationv1.Lease, *Record) error
	SetQueue        func(*coordinationv1.Lease, []Waiter) error
	ReleaseSnapshot func(ns, release string, gate records.Record, beat *metav1.ObjectMeta, listRV string) *Snapshot
	GateRecord      func(Record) Record
	GateEffective   func(*Record)
	EncodeBeat      func(Record) (string, error)
	DecodeBeat      func(s, release, ns string) *Record
	EncodeWaiters   func([]Waiter) (string, error)
	DecodeWaiters   func(string) []Waiter

	AnnotationBeat, AnnotationWaiters, AnnotationClaimedFrom, AnnotationClaimedOn string
}

func NewLeaseBackend(client kubernetes.Interface, est *servertime.Estimator, clk clock.Clock) *Backend {
	return Stores.LeaseBackend(client, est, clk)
}

func NewReleaseBackend(client kubernetes.Interface, est *servertime.Estimator, clk clock.Clock, driver records.Driver) *Backend {
	return Stores.ReleaseBackend(client, est, clk, driver)
}

func leaseSnapshot(l *coordinationv1.Lease) *Snapshot { return Stores.LeaseSnapshot(l) }

func setHolder(l *coordinationv1.Lease, rec *Record) error { return Stores.SetHolder(l, rec) }

func setQueue(l *coordinationv1.Lease, ws []Waiter) error { return Stores.SetQueue(l, ws) }

func gateForm(rec Record) Record { return Stores.GateRecord(rec) }

func encodeBeat(rec Record) (string, error) { return Stores.EncodeBeat(rec) }

func decodeBeat(s, release, ns string) *Record { return Stores.DecodeBeat(s, release, ns) }

func encodeWaiters(ws []Waiter) (string, error) { return Stores.EncodeWaiters(ws) }

func decodeWaiters(s string) []Waiter { return Stores.DecodeWaiters(s) }

// leaseChanges and releaseChanges read watch events as each store does
// (Store.Change), for watchView.quiet.
func leaseChanges() Store { return Stores.LeaseStore(nil, "") }

func releaseChanges() Store { return Stores.ReleaseStore(nil, records.DriverSecret, "") }
