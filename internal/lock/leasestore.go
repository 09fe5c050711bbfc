package lock

import (
	"context"
	"math"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// LeaseAPI is a store of Lease objects that behaves as the API server's
// Leases do: Create fails with AlreadyExists, Update and a Delete with a
// resourceVersion precondition fail with Conflict when the object changed,
// Get and Update fail with NotFound when it is gone, and every write
// changes the resourceVersion. Watch may fail: the lock then polls. The
// coordination.k8s.io/v1 client is one; the sql driver's lock rows
// (package sqlstore) another.
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

// leaseSnapshot is Lease l as the engine reads it; l itself is kept as the
// snapshot's version, which a write copies.
func leaseSnapshot(l *coordinationv1.Lease) *Snapshot {
	s := &Snapshot{
		Namespace: l.Namespace,
		Name:      l.Name,
		Release:   l.Labels[LabelRelease],
		Object:    "lease/" + l.Name,
		Spec:      l.Spec,
		Queue:     decodeQueue(l.Annotations[AnnotationQueue]),
		version:   l,
	}
	s.Raw, s.HasRecord = l.Annotations[AnnotationRecord]
	if s.HasRecord {
		s.Record, s.RecordErr = DecodeRecord(s.Raw)
	}
	return s
}

// lease is the Lease from was read from.
func (s *leaseStore) lease(from *Snapshot) *coordinationv1.Lease {
	return from.version.(*coordinationv1.Lease)
}

func (s *leaseStore) Read(ctx context.Context, name string) (*Snapshot, error) {
	l, err := s.api.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return leaseSnapshot(l), nil
}

func (s *leaseStore) Create(ctx context.Context, name string, rec Record) (*Snapshot, error) {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name:      name,
		Namespace: s.ns,
		Labels:    leaseLabels(rec.Release),
	}}
	if err := setHolder(l, &rec); err != nil {
		return nil, err
	}
	l.Spec.LeaseTransitions = ptr(int32(0))
	created, err := s.api.Create(ctx, l, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	return leaseSnapshot(created), nil
}

// Announce implements Store: a Lease names its holder from its take on.
func (s *leaseStore) Announce(_ context.Context, from *Snapshot, _ Record) (*Snapshot, error) {
	return from, nil
}

// Renewal implements Store: the Lease's holder, renewal and LOCKED TILL.
func (s *leaseStore) Renewal(name string, obj runtime.Object) (string, time.Time, time.Time, bool) {
	return leaseRenewal(name, obj)
}

// leaseRenewal is the holder, renewal and LOCKED TILL of obj when it is
// the Lease named name (false otherwise).
func leaseRenewal(name string, obj runtime.Object) (string, time.Time, time.Time, bool) {
	lease, ok := obj.(*coordinationv1.Lease)
	if !ok || lease.Name != name {
		return "", time.Time{}, time.Time{}, false
	}
	l := leaseSnapshot(lease)
	holder, renewed := renewalOf(l)
	rec := l.Record
	if rec != nil && rec.Session != holder {
		rec = nil
	}
	till, _ := LockedTill(rec, &l.Spec)
	return holder, renewed, till, true
}

func (s *leaseStore) Take(ctx context.Context, from *Snapshot, rec Record, queue []Waiter) (*Snapshot, error) {
	l := s.lease(from).DeepCopy()
	if err := setHolder(l, &rec); err != nil {
		return nil, err
	}
	if holderOf(&from.Spec) != rec.Session {
		n := int32(0)
		if l.Spec.LeaseTransitions != nil {
			n = *l.Spec.LeaseTransitions
		}
		l.Spec.LeaseTransitions = ptr(n + 1)
	}
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	for k, val := range leaseLabels(rec.Release) {
		l.Labels[k] = val
	}
	if err := setQueue(l, queue); err != nil {
		return nil, err
	}
	return s.update(ctx, l)
}

func (s *leaseStore) Renew(ctx context.Context, from *Snapshot, rec Record) (*Snapshot, error) {
	return s.writeHolder(ctx, from, rec)
}

func (s *leaseStore) Release(ctx context.Context, from *Snapshot, rec Record, _ string) (*Snapshot, error) {
	return s.writeHolder(ctx, from, rec)
}

func (s *leaseStore) ForceRelease(ctx context.Context, from *Snapshot, rec Record) (*Snapshot, error) {
	return s.writeHolder(ctx, from, rec)
}

func (s *leaseStore) writeHolder(ctx context.Context, from *Snapshot, rec Record) (*Snapshot, error) {
	l := s.lease(from).DeepCopy()
	if err := setHolder(l, &rec); err != nil {
		return nil, err
	}
	return s.update(ctx, l)
}

func (s *leaseStore) Enqueue(ctx context.Context, from *Snapshot, queue []Waiter) (*Snapshot, error) {
	l := s.lease(from).DeepCopy()
	if err := setQueue(l, queue); err != nil {
		return nil, err
	}
	return s.update(ctx, l)
}

func (s *leaseStore) update(ctx context.Context, l *coordinationv1.Lease) (*Snapshot, error) {
	updated, err := s.api.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		return nil, err
	}
	return leaseSnapshot(updated), nil
}

func (s *leaseStore) Delete(ctx context.Context, from *Snapshot) error {
	l := s.lease(from)
	return s.api.Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{
		UID:             &l.UID,
		ResourceVersion: &l.ResourceVersion,
	}})
}

func (s *leaseStore) List(ctx context.Context) ([]*Snapshot, error) {
	ls, err := s.api.List(ctx, metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + ManagedBy})
	if err != nil {
		return nil, err
	}
	out := make([]*Snapshot, 0, len(ls.Items))
	for i := range ls.Items {
		out = append(out, leaseSnapshot(&ls.Items[i]))
	}
	return out, nil
}

func (s *leaseStore) Watch(ctx context.Context, from *Snapshot) (watch.Interface, error) {
	return s.api.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", from.Name).String(),
		ResourceVersion: s.lease(from).ResourceVersion,
	})
}

// setHolder writes rec into l, annotation and spec mirror.
func setHolder(l *coordinationv1.Lease, rec *Record) error {
	s, err := rec.Encode()
	if err != nil {
		return err
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[AnnotationRecord] = s
	applyHolder(&l.Spec, rec)
	return nil
}

// applyHolder mirrors rec in spec: its holder, and while it holds, its
// lease, take and renewal.
func applyHolder(spec *coordinationv1.LeaseSpec, rec *Record) {
	if !rec.ReleasedAt.IsZero() {
		spec.HolderIdentity = ptr("")
		return
	}
	spec.HolderIdentity = ptr(rec.Session)
	spec.LeaseDurationSeconds = ptr(int32(min(math.MaxInt32, math.Ceil(rec.LeaseDuration.Seconds()))))
	spec.AcquireTime = &metav1.MicroTime{Time: rec.AcquiredAt}
	spec.RenewTime = &metav1.MicroTime{Time: rec.RenewedAt}
}

func setQueue(l *coordinationv1.Lease, ws []Waiter) error {
	if len(ws) == 0 {
		delete(l.Annotations, AnnotationQueue)
		return nil
	}
	s, err := encodeQueue(ws)
	if err != nil {
		return err
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[AnnotationQueue] = s
	return nil
}

func (s *leaseStore) WatchQueue(ctx context.Context, name string) (watch.Interface, func(runtime.Object) ([]Waiter, bool), error) {
	w, err := s.api.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	return w, func(o runtime.Object) ([]Waiter, bool) {
		l, ok := o.(*coordinationv1.Lease)
		if !ok || l.Name != name {
			return nil, false
		}
		return decodeQueue(l.Annotations[AnnotationQueue]), true
	}, err
}

// Change reads an event of the Lease watched: its queue, its holder, and
// whether it still names the holder seen in the same state.
func (s *leaseStore) Change(seen *Snapshot, ev watch.Event) (Change, bool) {
	l, ok := ev.Object.(*coordinationv1.Lease)
	if !ok || ev.Type != watch.Modified || l.Namespace != seen.Namespace || l.Name != seen.Name {
		return Change{}, false
	}
	return Change{
		Queue: decodeQueue(l.Annotations[AnnotationQueue]), Queued: true,
		Holders: []string{holderOf(&l.Spec), sessionOfRaw(annotatedRecord(l.Annotations))},
		Same:    sameLeaseHolder(l, seen),
	}, true
}

// Carried is rec: a Lease is not copied onto helm's records.
func (s *leaseStore) Carried(rec Record) Record { return rec }

// Written is nil: a Lease is not copied onto helm's records.
func (s *leaseStore) Written(metav1.ObjectMeta) (*Record, string, int) { return nil, "", 0 }

// sameLeaseHolder tells whether Lease l names the holder of seen in the
// same state: the same holder identity and record session, released or
// not alike (the queue and the record's renewal times aside).
func sameLeaseHolder(l *coordinationv1.Lease, seen *Snapshot) bool {
	return holderOf(&l.Spec) == holderOf(&seen.Spec) && SameHolder(l.Annotations[AnnotationRecord], seen.Raw)
}
