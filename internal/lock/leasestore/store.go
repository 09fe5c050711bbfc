package leasestore

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// NewBackend returns a backend that keeps each release's lock in a
// coordination.k8s.io/v1 Lease of its namespace (see lock.NewBackend).
func NewBackend(client kubernetes.Interface, est *servertime.Estimator, clk clock.Clock) *lock.Backend {
	return lock.NewBackend(client, est, clk, lock.StoreLease, func(ns string) lock.Store {
		return New(client.CoordinationV1().Leases(ns), ns)
	})
}

// LeaseAPI is a store of Lease objects that behaves as the API server's
// Leases do: Create fails with AlreadyExists, Update and a Delete with a
// resourceVersion precondition fail with Conflict when the object changed,
// Get and Update fail with NotFound when it is gone, and every write
// changes the resourceVersion. Watch may fail: the lock then polls. The
// coordination.k8s.io/v1 client is one; a test's wrapper of it another.
type LeaseAPI interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error)
	Create(ctx context.Context, l *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error)
	Update(ctx context.Context, l *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
	List(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// leaseStore keeps each release's lock in a Lease of api: the record in
// AnnotationRecord, mirrored in the spec for tools that only read Leases,
// the queue in AnnotationQueue. Every write is an update conditional on
// the Lease as read.
type leaseStore struct {
	api LeaseAPI
	ns  string
}

// Snapshot is Lease l as the engine reads it; l itself is kept as the
// snapshot's version, which a write copies.
func Snapshot(l *coordinationv1.Lease) *lock.Snapshot {
	s := &lock.Snapshot{
		Namespace: l.Namespace,
		Name:      l.Name,
		Release:   l.Labels[lock.LabelRelease],
		Object:    "lease/" + l.Name,
		Spec:      l.Spec,
		Queue:     lock.DecodeQueue(l.Annotations[lock.AnnotationQueue]),
		Version:   l,
	}
	s.Raw, s.HasRecord = l.Annotations[lock.AnnotationRecord]
	if s.HasRecord {
		s.Record, s.RecordErr = lock.DecodeRecord(s.Raw)
	}
	return s
}

// lease is the Lease from was read from.
func (s *leaseStore) lease(from *lock.Snapshot) *coordinationv1.Lease {
	return from.Version.(*coordinationv1.Lease)
}

func (s *leaseStore) Read(ctx context.Context, name string) (*lock.Snapshot, error) {
	l, err := s.api.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return Snapshot(l), nil
}

func (s *leaseStore) Create(ctx context.Context, name string, rec lock.Record) (*lock.Snapshot, error) {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name:      name,
		Namespace: s.ns,
		Labels:    lock.LockLabels(rec.Release),
	}}
	if err := SetHolder(l, &rec); err != nil {
		return nil, err
	}
	l.Spec.LeaseTransitions = ptr.To(int32(0))
	created, err := s.api.Create(ctx, l, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	return Snapshot(created), nil
}

// Announce implements Store: a Lease names its holder from its take on.
func (s *leaseStore) Announce(_ context.Context, from *lock.Snapshot, _ lock.Record) (*lock.Snapshot, error) {
	return from, nil
}

// Renewal implements Store: the Lease's holder, renewal and LOCKED TILL.
func (s *leaseStore) Renewal(name string, obj runtime.Object) (string, time.Time, time.Time, bool) {
	lease, ok := obj.(*coordinationv1.Lease)
	if !ok || lease.Name != name {
		return "", time.Time{}, time.Time{}, false
	}
	l := Snapshot(lease)
	holder, renewed := lock.RenewalOf(l)
	rec := l.Record
	if rec != nil && rec.Session != holder {
		rec = nil
	}
	till, _ := lock.LockedTill(rec, &l.Spec)
	return holder, renewed, till, true
}

func (s *leaseStore) Take(ctx context.Context, from *lock.Snapshot, rec lock.Record, queue []lock.Waiter) (*lock.Snapshot, error) {
	l := s.lease(from).DeepCopy()
	if err := SetHolder(l, &rec); err != nil {
		return nil, err
	}
	if lock.HolderOf(&from.Spec) != rec.Session {
		n := int32(0)
		if l.Spec.LeaseTransitions != nil {
			n = *l.Spec.LeaseTransitions
		}
		l.Spec.LeaseTransitions = ptr.To(n + 1)
	}
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	for k, val := range lock.LockLabels(rec.Release) {
		l.Labels[k] = val
	}
	if err := SetQueue(l, queue); err != nil {
		return nil, err
	}
	return s.update(ctx, l)
}

func (s *leaseStore) Renew(ctx context.Context, from *lock.Snapshot, rec lock.Record) (*lock.Snapshot, error) {
	return s.writeHolder(ctx, from, rec)
}

func (s *leaseStore) Release(ctx context.Context, from *lock.Snapshot, rec lock.Record, _ string) (*lock.Snapshot, error) {
	return s.writeHolder(ctx, from, rec)
}

func (s *leaseStore) ForceRelease(ctx context.Context, from *lock.Snapshot, rec lock.Record) (*lock.Snapshot, error) {
	return s.writeHolder(ctx, from, rec)
}

func (s *leaseStore) writeHolder(ctx context.Context, from *lock.Snapshot, rec lock.Record) (*lock.Snapshot, error) {
	l := s.lease(from).DeepCopy()
	if err := SetHolder(l, &rec); err != nil {
		return nil, err
	}
	return s.update(ctx, l)
}

func (s *leaseStore) Enqueue(ctx context.Context, from *lock.Snapshot, queue []lock.Waiter) (*lock.Snapshot, error) {
	l := s.lease(from).DeepCopy()
	if err := SetQueue(l, queue); err != nil {
		return nil, err
	}
	return s.update(ctx, l)
}

func (s *leaseStore) update(ctx context.Context, l *coordinationv1.Lease) (*lock.Snapshot, error) {
	updated, err := s.api.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		return nil, err
	}
	return Snapshot(updated), nil
}

func (s *leaseStore) Delete(ctx context.Context, from *lock.Snapshot) error {
	l := s.lease(from)
	return s.api.Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{
		UID:             &l.UID,
		ResourceVersion: &l.ResourceVersion,
	}})
}

func (s *leaseStore) List(ctx context.Context) ([]*lock.Snapshot, error) {
	ls, err := s.api.List(ctx, metav1.ListOptions{LabelSelector: lock.LabelManagedBy + "=" + lock.ManagedBy})
	if err != nil {
		return nil, err
	}
	out := make([]*lock.Snapshot, 0, len(ls.Items))
	for i := range ls.Items {
		out = append(out, Snapshot(&ls.Items[i]))
	}
	return out, nil
}

func (s *leaseStore) Watch(ctx context.Context, from *lock.Snapshot) (watch.Interface, error) {
	return s.api.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", from.Name).String(),
		ResourceVersion: s.lease(from).ResourceVersion,
	})
}

// SetHolder writes rec into l, annotation and spec mirror.
func SetHolder(l *coordinationv1.Lease, rec *lock.Record) error {
	s, err := rec.Encode()
	if err != nil {
		return err
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[lock.AnnotationRecord] = s
	lock.ApplyHolder(&l.Spec, rec)
	return nil
}

// SetQueue writes the waiters' queue ws on Lease l (none: the annotation
// goes).
func SetQueue(l *coordinationv1.Lease, ws []lock.Waiter) error {
	if len(ws) == 0 {
		delete(l.Annotations, lock.AnnotationQueue)
		return nil
	}
	s, err := lock.EncodeQueue(ws)
	if err != nil {
		return err
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[lock.AnnotationQueue] = s
	return nil
}

func (s *leaseStore) WatchQueue(ctx context.Context, name string) (watch.Interface, func(runtime.Object) ([]lock.Waiter, bool), error) {
	w, err := s.api.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	return w, func(o runtime.Object) ([]lock.Waiter, bool) {
		l, ok := o.(*coordinationv1.Lease)
		if !ok || l.Name != name {
			return nil, false
		}
		return lock.DecodeQueue(l.Annotations[lock.AnnotationQueue]), true
	}, err
}

// Change reads an event of the Lease watched: its queue, its holder, and
// whether it still names the holder seen in the same state.
func (s *leaseStore) Change(seen *lock.Snapshot, ev watch.Event) (lock.Change, bool) {
	l, ok := ev.Object.(*coordinationv1.Lease)
	if !ok || ev.Type != watch.Modified || l.Namespace != seen.Namespace || l.Name != seen.Name {
		return lock.Change{}, false
	}
	return lock.Change{
		Queue: lock.DecodeQueue(l.Annotations[lock.AnnotationQueue]), Queued: true,
		Holders: []string{lock.HolderOf(&l.Spec), lock.SessionOf(lock.AnnotatedRecord(l.Annotations))},
		Same:    sameLeaseHolder(l, seen),
	}, true
}

// Carried is rec: a Lease is not copied onto helm's records.
func (s *leaseStore) Carried(rec lock.Record) lock.Record { return rec }

// Written is nil: a Lease is not copied onto helm's records.
func (s *leaseStore) Written(metav1.ObjectMeta) (*lock.Record, string, int) { return nil, "", 0 }

// sameLeaseHolder tells whether Lease l names the holder of seen in the
// same state: the same holder identity and record session, released or
// not alike (the queue and the record's renewal times aside).
func sameLeaseHolder(l *coordinationv1.Lease, seen *lock.Snapshot) bool {
	return lock.HolderOf(&l.Spec) == lock.HolderOf(&seen.Spec) && lock.SameHolder(l.Annotations[lock.AnnotationRecord], seen.Raw)
}

// New returns the store of the Leases of api in namespace ns.
func New(api LeaseAPI, ns string) lock.Store { return &leaseStore{api: api, ns: ns} }
