package lock

import (
	"context"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// Snapshot is one read of a release's lock in one store: what the engine
// judges and decides from, in typed fields. A store fills it from its own
// objects and keeps in it (Version) what a write conditional on this read
// needs; the engine never looks there.
type Snapshot struct {
	Namespace string
	// Name is the lock's name, LeaseName(Release).
	Name    string
	Release string
	// Object names where the lock is kept, as kubectl names it
	// (lease/NAME, or secret/NAME or configmap/NAME: the release's newest
	// record); "" when there is no such object yet.
	Object string

	// Raw is the lock record as the store holds it (on the release
	// records: the gate's, with its beat's renewal merged in), "" with
	// HasRecord false when there is none. Record and RecordErr are Raw as
	// DecodeRecord reads it (a newer schema's record keeps the fields every
	// schema shares).
	Raw       string
	HasRecord bool
	Record    *Record
	RecordErr error
	// Spec is the holder's tenure apart from the record: a Lease's spec, or
	// on the release records the one the record implies (specOf). It
	// judges a record that cannot be read (Judge, LockedTill).
	Spec coordinationv1.LeaseSpec
	// Queue is the waiters' queue as stored, expired entries included.
	Queue []Waiter

	// The release records' own (zero on a Lease):
	//
	// Claim is the beat when it names another session than the gate's
	// holder, or was marked released: a take in flight, a person's
	// release, or a stale claim, judged by its own expiry.
	Claim *Claim
	// Silent marks an unreleased gate whose beat says nothing of its
	// holder (missing, unreadable, or another session's beat not claimed
	// from it): judged by its long bound in server time, and by its
	// holder's lease on the reader's own clock (see confirm).
	Silent bool
	// Newest is the release's newest record, where the gate is; nil on a
	// Lease, and on the release records of a release with no record (the
	// lock is virtual: its take wrote nothing).
	Newest *Newest

	// Version is the store's own: what a write conditional on this read
	// needs (the objects read, their resourceVersions). The engine never
	// looks at it.
	Version any
}

// Claim is a release lock's beat that names another session than the
// gate's holder, or was marked released (Snapshot.Claim).
type Claim struct {
	Record *Record
	// Encoded is Record as the beat holds it, for telling two beats apart.
	Encoded string
	// From names the gate's session the claimant judged Free or Expired
	// ("" when the gate had none); On the record and resourceVersion it
	// claimed against ("NAME@RV@SESSION"; "" for a renewal).
	From, On string
}

// Newest is a release's newest stored record, where its gate is
// (Snapshot.Newest).
type Newest struct {
	Name string
	// Revision is the revision its labels name (0 or less: unreadable).
	Revision int
	// Status is helm's status label.
	Status string
	// ResourceVersion is the record's, the gate's version.
	ResourceVersion string
	// Unlabelled is set when a record of the release carries no status
	// label: the whole history is read before any decision made from the
	// newest record alone (see part.Newest).
	Unlabelled bool
	// GateRenewed is the renewedAt of the gate's own record, before its
	// beat's renewals are merged in (zero when it has none): a holder
	// tells by it that the record its lock was on was deleted (vanished).
	GateRenewed time.Time
}

// Change is what a store reads of an event seen on the watch of a lock
// (Store.Change): what a waiter needs to tell whether its next decision
// can be anything but "wait" (see watchView.quiet).
type Change struct {
	// Queue is the waiters' queue the object now stores, when Queued (an
	// event of the object the queue lives on).
	Queue  []Waiter
	Queued bool
	// Holders are the sessions the object names as the lock's holder.
	Holders []string
	// Same tells that the change leaves the lock's holder as seen, in the
	// same state (its renewals aside).
	Same bool
}

// virtual reports a release lock taken while the release had no record.
func (s *Snapshot) virtual(kind StoreKind) bool { return kind == StoreRelease && s.Newest == nil }

// Store keeps locks of one namespace in one backend: a Lease per release,
// the release's own records, a row of helm's sql database. Each write is
// conditional on the snapshot it is made from and names what it does; a
// store decides what that means for its own objects. A write that finds
// the lock changed since fails with a Conflict (apierrors.IsConflict), one
// that finds it deleted with NotFound; the engine then reads again and
// decides anew. Read and Create fail with NotFound and AlreadyExists as the
// API server does. A store that cannot be watched returns an error from
// Watch and WatchQueue: the engine then polls.
type Store interface {
	// Read reads the lock named name.
	Read(ctx context.Context, name string) (*Snapshot, error)
	// Create takes the lock of a release that has none, naming rec.
	Create(ctx context.Context, name string, rec Record) (*Snapshot, error)
	// Announce readies the lock in from, taken by rec while the release
	// had nothing stored (a virtual lock), for the first revision its
	// holder writes: the release store names rec on the beat before the
	// first gate appears, so that the gate is judged by it; the others
	// have nothing to do and return from.
	Announce(ctx context.Context, from *Snapshot, rec Record) (*Snapshot, error)
	// Take names rec the holder of a lock judged Free or Expired in
	// from, with queue the waiters left.
	Take(ctx context.Context, from *Snapshot, rec Record, queue []Waiter) (*Snapshot, error)
	// Renew writes the holder's own record rec: a renewal, or the
	// revision it names.
	Renew(ctx context.Context, from *Snapshot, rec Record) (*Snapshot, error)
	// Enqueue writes the waiters' queue.
	Enqueue(ctx context.Context, from *Snapshot, queue []Waiter) (*Snapshot, error)
	// Release writes the holder's own record rec, marked released; at,
	// when set, names where the holder's write fence last left its lock
	// (RecordAt), written first without reading.
	Release(ctx context.Context, from *Snapshot, rec Record, at string) (*Snapshot, error)
	// ForceRelease writes rec, another session's record marked released
	// by a person (unlock).
	ForceRelease(ctx context.Context, from *Snapshot, rec Record) (*Snapshot, error)
	// Delete removes the lock (after an uninstall that kept no history).
	Delete(ctx context.Context, from *Snapshot) error
	// List reads every lock of the namespace.
	List(ctx context.Context) ([]*Snapshot, error)
	// Watch watches what the lock read in from is kept on, from then.
	Watch(ctx context.Context, from *Snapshot) (watch.Interface, error)
	// Renewal reads, from an object seen on the watch of lock name, the
	// holder it names, its latest renewal and its LOCKED TILL (false when
	// the object says nothing of a live holder): how a waiter that lets
	// the holder's renewals pass without reading the lock again knows when
	// it first saw the latest one. Records are not looked at: a read
	// judges them.
	Renewal(name string, obj runtime.Object) (holder string, renewed, till time.Time, ok bool)
	// Change reads an event seen on the watch (Watch) of the lock read as
	// seen; false for an object or a kind of event the store cannot vouch
	// for, which makes the waiter read the lock again.
	Change(seen *Snapshot, ev watch.Event) (Change, bool)
	// Carried is rec as a write of helm's records made under the lock
	// carries it (Held.Carry).
	Carried(rec Record) Record
	// Written reads, from a record write made under the lock as the API
	// server returned it (Held.GateWritten), the lock record it carries,
	// where it left it (name@resourceVersion) and at which revision; nil
	// when the store keeps no lock on helm's records.
	Written(meta metav1.ObjectMeta) (rec *Record, at string, rev int)
	// WatchQueue watches the object the queue of lock name lives on, and
	// says how to read the queue from one of its events.
	WatchQueue(ctx context.Context, name string) (watch.Interface, func(runtime.Object) ([]Waiter, bool), error)
}

// RecordAt names release record name at resourceVersion rv.
func RecordAt(name, rv string) string { return name + "@" + rv }

// ClaimedOn is the annotationClaimedOn of session's claim against release
// record name at resourceVersion rv. The session is in it so that a claim
// written over it by a version that does not know the annotation (and
// leaves it) is not judged by it.
func ClaimedOn(session, name, rv string) string { return RecordAt(name, rv) + "@" + session }

// claimAgainstGate tells whether the claim l carries was made against its
// gate as it stands (see annotationClaimedOn): always for a claim that
// names no record, or names it for another session (written by an earlier
// version over this one's).
func claimAgainstGate(l *Snapshot) bool {
	if l.Claim == nil || l.Claim.On == "" {
		return true
	}
	at, session, _ := cutLast(l.Claim.On, "@")
	if session != l.Claim.Record.Session {
		return true
	}
	anchor, gateRV := "", ""
	if l.Newest != nil {
		anchor, gateRV = l.Newest.Name, l.Newest.ResourceVersion
	}
	return at == RecordAt(anchor, gateRV)
}

// cutLast cuts s around the last sep.
func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}
