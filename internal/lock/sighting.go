package lock

import (
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
)

// Sightings is a process's memory of when it first saw each lock's latest
// renewal, in its own elapsed time: what Confirm needs to tell a holder
// that stopped from one whose renewals a lying Date header makes look late.
// A holder stamps every write it makes with a later renewal time than the
// one before, so the latest renewal seen only ever grows while the holder
// runs, whichever object (Lease, beat, record) it was seen on.
//
// One Sightings is shared by every backend of a process (the stores of a
// connection are made anew for each operation; the controller's live as
// long as it does). It is safe for concurrent use.
type Sightings struct {
	mu sync.Mutex
	m  map[string]sighting
}

type sighting struct {
	holder  string
	renewed time.Time
	// at is when this process first saw renewed, on its monotonic clock.
	at time.Time
}

// NewSightings returns an empty memory.
func NewSightings() *Sightings { return &Sightings{m: map[string]sighting{}} }

// mark records that holder's renewal renewed of lock key was seen at now,
// and returns when the latest renewal of that holder was first seen. A
// renewal no later than the one remembered changes nothing; another holder
// replaces the memory.
func (s *Sightings) mark(key, holder string, renewed, now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.m[key]
	if ok && cur.holder == holder && !renewed.After(cur.renewed) {
		return cur.at
	}
	s.m[key] = sighting{holder: holder, renewed: renewed, at: now}
	return now
}

// forget drops the memory of lock key (released, or gone).
func (s *Sightings) forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key)
}

// sightKey names a lock in Sightings.
func (b *Backend) sightKey(namespace, name string) string {
	return string(b.store) + "/" + namespace + "/" + name
}

// renewalOf is the holder a Lease (or a release lock's virtual Lease) names
// and its latest renewal: the later of the spec's renewTime and the
// holder's own record's renewedAt.
func renewalOf(l *coordinationv1.Lease) (string, time.Time) {
	holder := holderOf(&l.Spec)
	var renewed time.Time
	if t := l.Spec.RenewTime; t != nil {
		renewed = t.Time
	} else if t := l.Spec.AcquireTime; t != nil {
		renewed = t.Time
	}
	if rec := annotatedRecord(l.Annotations); rec != nil && rec.Session == holder && rec.RenewedAt.After(renewed) {
		renewed = rec.RenewedAt
	}
	return holder, renewed
}

// sightEvent marks the renewal an object seen on the lock's watch carries
// (a Lease; for a release lock, its beat object or one of its records), so
// that a waiter that let the holder's renewals pass without reading the lock
// again (watchView.quiet) still knows when it first saw the latest one.
// Objects that name no unreleased holder are ignored: they renew nothing.
func (b *Backend) sightEvent(namespace, lockName string, obj runtime.Object) {
	if l, ok := obj.(*coordinationv1.Lease); ok {
		if l.Name != lockName {
			return
		}
		if holder, renewed := renewalOf(l); holder != "" {
			b.seen().mark(b.sightKey(namespace, lockName), holder, renewed, b.clock.Now())
		}
		return
	}
	if b.store != StoreRelease {
		return
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return
	}
	var rec *Record
	if m.GetName() == lockName {
		rec = decodeBeat(m.GetAnnotations()[AnnotationBeat], releaseOf(lockName), namespace)
	} else {
		rec = annotatedRecord(m.GetAnnotations())
	}
	if rec != nil && rec.Session != "" && rec.ReleasedAt.IsZero() {
		b.seen().mark(b.sightKey(namespace, lockName), rec.Session, rec.RenewedAt, b.clock.Now())
	}
}
