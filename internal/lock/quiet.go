package lock

import (
	"cmp"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// watchView is what a waiter knows of the lock between two reads: the lock
// as last read, and the queue as the watch has shown it since.
type watchView struct {
	seen     *Snapshot
	queue    []Waiter
	self     string
	seenLive bool
	wasAhead map[string]bool
}

func newWatchView(seen *Snapshot, self string, seenLive bool) *watchView {
	v := &watchView{seen: seen, self: self, seenLive: seenLive, wasAhead: map[string]bool{}}
	if seen != nil {
		v.queue = seen.Queue
		for _, w := range v.queue {
			if w.Session == self {
				break
			}
			v.wasAhead[w.Session] = true
		}
	}
	return v
}

// quiet reports a change to the lock, seen while waiting, that cannot make
// this waiter's next decision anything but "wait": while a live waiter is
// queued ahead of it, any change that leaves it so and names no new holder
// of its own session; once it is first, a change that leaves the holder the
// same session in the same state (its renewals aside) and it still queued
// first. Deciding again on every change made each of n waiters read the
// lock on each of the others' heartbeats and on each of the holder's
// writes: their clients' request budgets ran dry, and the one whose turn
// came then took seconds to take the lock, or starved its renewals until
// it lost it (20 contending clients, issue 13).
//
// It only ever spares a read while waiting, never decides: a change it lets
// pass is read anyway when the waiter's own heartbeat, the holder's expiry
// or an entry ahead's expiry, as last read, falls due (nextDecision), and
// every take is judged on a fresh read. So it errs towards false (decide
// again) on whatever it does not recognise: another kind of event or
// object, a deletion, an unreadable record or beat, self missing from the
// queue.
//
// A Lease store's event carries the Lease itself; a release store's the
// beat object (a Secret or ConfigMap named LeaseName(release)) or one of the
// release's records. now is the server time as estimated (zero when
// unknown: every entry is then taken for live).
func (v *watchView) quiet(store StoreKind, ev watch.Event, now servertime.Bounds, margin time.Duration) bool {
	if v.seen == nil {
		return false
	}
	obj, err := meta.Accessor(ev.Object)
	if err != nil || obj.GetNamespace() != v.seen.Namespace {
		return false
	}
	a := obj.GetAnnotations()
	lockObject := obj.GetName() == v.seen.Name
	if lockObject {
		if ev.Type != watch.Modified {
			return false
		}
		if store == StoreRelease {
			v.queue = decodeWaiters(a[AnnotationWaiters])
		} else {
			v.queue = decodeQueue(a[AnnotationQueue])
		}
	} else if store != StoreRelease {
		return false
	}
	if v.namesSelf(store, lockObject, obj) {
		return false // our own take committing late: adopt it (attempt)
	}
	live := liveWaiters(v.queue, now, margin)
	i := slices.IndexFunc(live, func(w Waiter) bool { return w.Session == v.self })
	switch {
	case i < 0:
		return false // dropped from the queue: queue again
	case i > 0 && slices.ContainsFunc(live[:i], func(w Waiter) bool { return v.wasAhead[w.Session] }):
		return true // someone live comes first whatever happens to the lock
	case !v.seenLive:
		return false // only the queue held us back: now first
	}
	// First in the queue: quiet only when the lock is as it was.
	switch {
	case store != StoreRelease:
		l, ok := ev.Object.(*coordinationv1.Lease)
		return ok && sameLeaseHolder(l, v.seen)
	case lockObject:
		return sameBeatHolder(v.seen, a)
	default:
		return sameGate(v.seen, ev.Type, obj)
	}
}

// namesSelf tells whether the changed object names this waiter's session as
// the lock's holder.
func (v *watchView) namesSelf(store StoreKind, lockObject bool, obj metav1.Object) bool {
	a := obj.GetAnnotations()
	switch {
	case store != StoreRelease:
		l, ok := obj.(*coordinationv1.Lease)
		return !ok || holderOf(&l.Spec) == v.self || sessionOfRaw(annotatedRecord(a)) == v.self
	case lockObject:
		bt := decodeBeat(a[AnnotationBeat], releaseOf(v.seen.Name), v.seen.Namespace)
		return bt != nil && bt.Session == v.self
	default:
		return sessionOfRaw(annotatedRecord(a)) == v.self
	}
}

// sameLeaseHolder tells whether Lease l names the holder of seen in the
// same state: the same holder identity and record session, released or
// not alike (the queue and the record's renewal times aside).
func sameLeaseHolder(l *coordinationv1.Lease, seen *Snapshot) bool {
	return holderOf(&l.Spec) == holderOf(&seen.Spec) && sameHolder(l.Annotations[AnnotationRecord], seen.Raw)
}

// sameBeatHolder tells whether the beat object, whose annotations are now
// a, names the holder seen: its renewal, or the same claim from the same
// gate session.
func sameBeatHolder(seen *Snapshot, a map[string]string) bool {
	bt := decodeBeat(a[AnnotationBeat], releaseOf(seen.Name), seen.Namespace)
	if bt == nil {
		return false
	}
	if c := seen.Claim; c != nil {
		// The beat seen was a claim (or a released or stale beat): the
		// same only while it is that same one.
		return c.Record.Session == bt.Session && c.Record.ReleasedAt.Equal(bt.ReleasedAt) &&
			c.From == a[annotationClaimedFrom] && c.On == a[annotationClaimedOn]
	}
	// The beat seen was the gate holder's own (merged into the record), or
	// there was none: the same only for that holder's renewal.
	rec := seen.Record
	return seen.HasRecord && seen.RecordErr == nil && rec != nil && rec.Session != "" && rec.ReleasedAt.IsZero() && holderOf(&seen.Spec) == rec.Session &&
		bt.Session == rec.Session && bt.ReleasedAt.IsZero()
}

// sameGate tells whether a change to one of the release's records leaves
// the gate as seen: a record older than the gate (helm marking the previous
// revision superseded, or pruning its history), the gate itself still
// naming the holder seen in the same state, or a newer record carrying the
// live holder seen (the holder's own helm writing its pending revision). A
// record newer than the gate without that holder's lock (stock helm's, say),
// the gate's deletion, or a gate that now names another session or was
// released change it.
func sameGate(seen *Snapshot, typ watch.EventType, obj metav1.Object) bool {
	if seen.Newest == nil {
		return false // a release that had no record: any record is news
	}
	gate, gateRev := seen.Newest.Name, seen.Newest.Revision
	order := cmp.Compare(records.RevisionOf(obj.GetLabels()), gateRev)
	if order == 0 {
		order = strings.Compare(obj.GetName(), gate)
	}
	raw, carries := obj.GetAnnotations()[AnnotationRecord]
	held, hasHolder := seen.Raw, seen.HasRecord
	switch {
	case order < 0:
		return true
	case order == 0:
		return typ == watch.Modified && carries == hasHolder && (!carries || sameHolder(raw, held))
	default:
		if typ == watch.Deleted || !carries || !hasHolder || !sameHolder(raw, held) {
			return false
		}
		rec, err := DecodeRecord(held)
		return err == nil && rec.Session != "" && rec.ReleasedAt.IsZero()
	}
}

// sameHolder tells whether two encodings of a lock record name the same
// holder in the same state: the same session, released or not alike (a
// renewal changes neither). Two unreadable or absent records are the same
// only when equal.
func sameHolder(a, b string) bool {
	if a == b {
		return true
	}
	ra, errA := DecodeRecord(a)
	rb, errB := DecodeRecord(b)
	if errA != nil || errB != nil || ra == nil || rb == nil {
		return false
	}
	return ra.Session == rb.Session && ra.ReleasedAt.Equal(rb.ReleasedAt) && ra.ReleasedBy == rb.ReleasedBy
}
