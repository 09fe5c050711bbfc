package lock

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
)

// Sightings is a process's memory of when it first saw each lock's latest
// renewal, on its own monotonic clock: what Confirm needs to tell a holder
// that stopped from one whose renewals a lying Date header makes look late.
// A holder stamps every write it makes with a later renewal time than the
// one before.
//
// One Sightings is shared by every backend of a process (the stores of a
// connection are made anew for each operation; the controller's live as
// long as it does). It is safe for concurrent use.
type Sightings struct {
	mu sync.Mutex
	m  map[string]sighting
	// queues is, per lock, when each queued waiter's entry was first seen
	// with its current expiry.
	queues map[string]map[string]sighting
}

// claimSight suffixes a lock's key in Sightings for the claim in flight on
// its beat, judged beside its gate's holder.
const claimSight = "#claim"

type sighting struct {
	holder  string
	renewed time.Time
	till    time.Time
	// at is when this process first saw the lock so, on its monotonic
	// clock.
	at time.Time
}

// NewSightings returns an empty memory.
func NewSightings() *Sightings {
	return &Sightings{m: map[string]sighting{}, queues: map[string]map[string]sighting{}}
}

// mark records that lock key was read held by holder, renewed at renewed
// until till, at now, and returns since when it has been seen exactly so:
// any change to the holder, its renewal or its LOCKED TILL starts anew
// (as client-go compares the whole record), so that no view of the lock,
// however it came to differ, keeps an old first sight.
func (s *Sightings) mark(key, holder string, renewed, till, now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.m[key]
	if ok && cur.holder == holder && renewed.Equal(cur.renewed) && till.Equal(cur.till) {
		return cur.at
	}
	s.m[key] = sighting{holder: holder, renewed: renewed, till: till, at: now}
	return now
}

// advance records a later renewal of the holder remembered for lock key,
// seen at now on the lock's watch: its first sight is then now, and its
// LOCKED TILL is no longer known (the next read sets it, keeping now when
// it matches). A renewal of anyone else, or no later one, changes nothing:
// only a read (mark) replaces the holder, so that a stale claim replayed
// by a watch cannot restart the confirmation of a dead holder's lock.
func (s *Sightings) advance(key, holder string, renewed, till, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.m[key]
	if !ok || cur.holder != holder || !renewed.After(cur.renewed) {
		return
	}
	s.m[key] = sighting{holder: holder, renewed: renewed, till: till, at: now}
}

// forget drops the memory of lock key's holder (released, or gone).
func (s *Sightings) forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key)
}

// forgetClaim drops the memory of the claim in flight on lock key's beat.
func (s *Sightings) forgetClaim(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key+claimSight)
}

// forgetAll drops everything remembered of lock key (gone).
func (s *Sightings) forgetAll(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key)
	delete(s.m, key+claimSight)
	delete(s.queues, key)
}

// queue records that lock key's queue was read holding ws at now and
// returns, for each entry, since when it has been seen with the same
// expiry (a refresh starts anew). Entries no longer queued are forgotten,
// and so is the lock's queue once it is empty.
func (s *Sightings) queue(key string, ws []Waiter, now time.Time) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.queues[key]
	if len(ws) == 0 {
		delete(s.queues, key)
		return nil
	}
	cur := make(map[string]sighting, len(ws))
	since := make([]time.Time, len(ws))
	for i, w := range ws {
		seen, ok := old[w.Session]
		if !ok || !seen.till.Equal(w.ExpiresAt) {
			seen = sighting{holder: w.Session, till: w.ExpiresAt, at: now}
		}
		cur[w.Session], since[i] = seen, seen.at
	}
	s.queues[key] = cur
	return since
}

// sightKey names a lock in Sightings.
func (b *Backend) sightKey(namespace, name string) string {
	return string(b.kind) + "/" + namespace + "/" + name
}

// RenewalOf is the holder a lock names and its latest renewal: the later
// of the spec's renewTime and the holder's own record's renewedAt.
func RenewalOf(l *Snapshot) (string, time.Time) {
	holder := HolderOf(&l.Spec)
	var renewed time.Time
	if t := l.Spec.RenewTime; t != nil {
		renewed = t.Time
	} else if t := l.Spec.AcquireTime; t != nil {
		renewed = t.Time
	}
	if rec := l.Record; rec != nil && rec.Session == holder && rec.RenewedAt.After(renewed) {
		renewed = rec.RenewedAt
	}
	return holder, renewed
}

// sightEvent notes a renewal of the remembered holder that an object seen
// on the lock's watch carries (a Lease; for a release lock, its beat
// object), so that a waiter that let the holder's renewals pass without
// reading the lock again (watchView.quiet) knows when it first saw the
// latest one. Records are not looked at: a read judges them.
func (b *Backend) sightEvent(namespace, lockName string, obj runtime.Object) {
	if b.Sightings == nil || b.clock == nil {
		return
	}
	if holder, renewed, till, ok := b.store(namespace).Renewal(lockName, obj); ok {
		b.Sightings.advance(b.sightKey(namespace, lockName), holder, renewed, till, b.clock.Now())
	}
}
