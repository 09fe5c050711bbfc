package releasestore

import (
	"cmp"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
)

// Change reads an event of the release's lock watched: the beat (its
// queue, the session it names, and whether it still names the holder seen
// the same way) or one of the release's records (the session its lock
// names, and whether it leaves the gate as seen).
func (s *releaseStore) Change(seen *lock.Snapshot, ev watch.Event) (lock.Change, bool) {
	obj, err := meta.Accessor(ev.Object)
	if err != nil || obj.GetNamespace() != seen.Namespace {
		return lock.Change{}, false
	}
	a := obj.GetAnnotations()
	if obj.GetName() != seen.Name {
		return lock.Change{Holders: []string{lock.SessionOf(lock.AnnotatedRecord(a))}, Same: sameGate(seen, ev.Type, obj)}, true
	}
	if ev.Type != watch.Modified {
		return lock.Change{}, false
	}
	c := lock.Change{Queue: DecodeWaiters(a[AnnotationWaiters]), Queued: true, Same: sameBeatHolder(seen, a)}
	if bt := decodeBeat(a[AnnotationBeat], releaseOf(seen.Name), seen.Namespace); bt != nil {
		c.Holders = []string{bt.Session}
	}
	return c, true
}

// Carried is rec in the form a release record carries it (gateForm).
func (s *releaseStore) Carried(rec lock.Record) lock.Record { return gateForm(rec) }

// Written reads the lock a record write left on the record: the record
// and its revision, and where (RecordAt).
func (s *releaseStore) Written(meta metav1.ObjectMeta) (*lock.Record, string, int) {
	rec := lock.AnnotatedRecord(meta.Annotations)
	if rec == nil {
		return nil, "", 0
	}
	return rec, lock.RecordAt(meta.Name, meta.ResourceVersion), records.RevisionOf(meta.Labels)
}

// sameBeatHolder tells whether the beat object, whose annotations are now
// a, names the holder seen: its renewal, or the same claim from the same
// gate session.
func sameBeatHolder(seen *lock.Snapshot, a map[string]string) bool {
	bt := decodeBeat(a[AnnotationBeat], releaseOf(seen.Name), seen.Namespace)
	if bt == nil {
		return false
	}
	if c := seen.Claim; c != nil {
		// The beat seen was a claim (or a released or stale beat): the
		// same only while it is that same one.
		return c.Record.Session == bt.Session && c.Record.ReleasedAt.Equal(bt.ReleasedAt) &&
			c.From == a[AnnotationClaimedFrom] && c.On == a[AnnotationClaimedOn]
	}
	// The beat seen was the gate holder's own (merged into the record), or
	// there was none: the same only for that holder's renewal.
	rec := seen.Record
	return seen.HasRecord && seen.RecordErr == nil && rec != nil && rec.Session != "" && rec.ReleasedAt.IsZero() && lock.HolderOf(&seen.Spec) == rec.Session &&
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
func sameGate(seen *lock.Snapshot, typ watch.EventType, obj metav1.Object) bool {
	if seen.Newest == nil {
		return false // a release that had no record: any record is news
	}
	gate, gateRev := seen.Newest.Name, seen.Newest.Revision
	order := cmp.Compare(records.RevisionOf(obj.GetLabels()), gateRev)
	if order == 0 {
		order = strings.Compare(obj.GetName(), gate)
	}
	raw, carries := obj.GetAnnotations()[lock.AnnotationRecord]
	held, hasHolder := seen.Raw, seen.HasRecord
	switch {
	case order < 0:
		return true
	case order == 0:
		return typ == watch.Modified && carries == hasHolder && (!carries || lock.SameHolder(raw, held))
	default:
		if typ == watch.Deleted || !carries || !hasHolder || !lock.SameHolder(raw, held) {
			return false
		}
		rec, err := lock.DecodeRecord(held)
		return err == nil && rec.Session != "" && rec.ReleasedAt.IsZero()
	}
}
