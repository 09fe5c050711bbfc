package lock

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/sleepclock"
)

// part is a Held lock's share in one store (a Backend): the lock taken
// there, renewed, kept and given back. Its methods are safe for concurrent
// use; its writes are serialised.
type part struct {
	// Previous is the record found on the Lease before this lock was taken
	// (nil when there was no Lease or its record was unreadable), and
	// PreviousState how it was judged: Free (released) or Expired (its holder
	// died or stalled; the revision it was writing may need recovery).
	Previous      *Record
	PreviousState State

	b   *Backend
	req Request

	// writeMu serialises writes; mu guards the fields below it.
	writeMu writeGate
	mu      sync.Mutex
	snap    *Snapshot
	rec     Record
	// deadline is the renew deadline on the local clock: the send time of
	// the last successful write + lease - margin. maxHoldAt is the local time
	// at which the holder must give up (zero: never).
	deadline  time.Time
	maxHoldAt time.Time
	lastSend  time.Time
	// gateStamp is the renewedAt of the latest copy of the lock this holder
	// wrote or carried onto a release record (the release store's gate);
	// renewals go to the beat and leave it.
	gateStamp time.Time
	// lost is set once writing under the lock is no longer safe; gone when,
	// moreover, someone else holds or deleted the Lease (so even a release
	// is pointless). released once it was given back. done is closed on
	// lost or released.
	lost     error
	gone     bool
	released bool
	done     chan struct{}

	// waited is set by Wait when the lock was not taken at its first
	// attempt: someone else held it, or waiters came first.
	waited bool

	// gateAt is, on the release store, where the write fence last wrote
	// this holder's unreleased lock onto a release record
	// (RecordAt(name, resourceVersion)), on the highest revision it
	// wrote, gateAtRev; "" when it wrote none. Its release is written there
	// first (see releaseStore.Release).
	gateAt    string
	gateAtRev int
	// gateUnsure is set once a write made under the lock may have left a
	// copy of it somewhere GateWritten was not told of (GateUnsure, or a
	// Carry whose write did not call GateWritten): the release then reads
	// where the lock is. carryNoted is set by GateWritten during a Carry.
	gateUnsure bool
	carryNoted bool

	// wrote is the newest revision this holder's session wrote under the
	// lock (Wrote): every record written from then on names it at least.
	wrote int
}

// GateUnsure tells a lock on the release store that a write made under it
// did not end in an accepted answer: it may have committed (a lost answer,
// a write cut off at the deadline) and left the lock on a record other than
// the one GateWritten last named, a newer one say. The release is then
// written only after reading where the lock is, as before any write.
func (h *part) GateUnsure() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gateUnsure = true
}

// Newest is the release's newest record as this lock last read or wrote
// it, on the release store (ok false on a Lease, and when a record of the
// release carries no status label): its name, revision (0 and "" when the
// release had no record) and status label.
func (h *part) Newest() (name string, rev int, status string, ok bool) {
	if h.b.kind != StoreRelease {
		return "", 0, "", false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.snap.Newest
	if n == nil {
		return "", 0, "", true
	}
	if n.Unlabelled {
		return "", 0, "", false // read the whole history: see read
	}
	if n.Revision <= 0 {
		return "", 0, "", false
	}
	return n.Name, n.Revision, n.Status, true
}

// GateWritten tells a lock on the release store that a write made under it
// (the write fence's copy of the lock onto helm's record write) was
// accepted: meta is the record as the API server returned it. A write that
// copies the lock goes through Carry and calls GateWritten inside it, while
// no release can run: a Carry whose write does not makes the release read
// where the lock is (it may have left a copy on a newer record). When it
// carries this holder's unreleased lock, at a revision no lower than the
// last such write, the release is written there, conditional on that
// resourceVersion, without reading the records again: if anything wrote
// the record since, the release reads them as usual.
func (h *part) GateWritten(meta metav1.ObjectMeta) {
	if meta.ResourceVersion == "" {
		return
	}
	rec, at, rev := h.b.store(h.req.Namespace).Written(meta)
	if rec == nil || rec.Session != h.req.Session || !rec.ReleasedAt.IsZero() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.carryNoted = true
	if rev >= h.gateAtRev {
		h.gateAt, h.gateAtRev = at, rev
	}
}

func (b *Backend) newHeld(req *Request, l *Snapshot, rec Record, sent time.Time, prev *Record, prevState State) *part {
	h := &part{
		Previous:      prev,
		PreviousState: prevState,
		b:             b,
		req:           *req,
		snap:          l,
		rec:           rec,
		lastSend:      sent,
		gateStamp:     rec.RenewedAt,
		deadline:      sent.Add(req.LeaseDuration - b.renewMargin()),
		done:          make(chan struct{}),
	}
	if req.MaxHold > 0 {
		h.maxHoldAt = sent.Add(req.MaxHold)
	}
	return h
}

// Carry runs write, a write that copies this lock's record onto another
// release record (the fence's create of the next revision, or its move of
// the lock before helm prunes the newest record), with the record as it
// stands and while no renewal or other write of this lock is in flight. A
// renewal committing in between would extend the lock on the old record
// only: the copy everyone else judges would show an earlier LOCKED TILL
// than the deadline the holder goes by, and a client could take the lock
// over while the holder still writes.
func (h *part) Carry(write func(Record) error) error {
	h.writeMu.Lock()
	defer h.writeMu.Unlock()
	if err := h.Valid(); err != nil {
		return err
	}
	h.mu.Lock()
	if h.b.kind == StoreRelease && !h.rec.RenewedAt.After(h.gateStamp) {
		// Every copy of the lock on a release record gets its own stamp
		// (a millisecond later: others wait that much longer, the
		// holder's deadline stays), so a copy left behind on an older
		// record is told from the latest (see vanished).
		h.rec.RenewedAt = h.gateStamp.Add(time.Millisecond)
		h.rec.LockedTill = h.rec.RenewedAt.Add(h.rec.LeaseDuration.Duration)
	}
	rec := h.rec
	h.gateStamp = later(h.gateStamp, rec.RenewedAt)
	snap := h.snap
	h.mu.Unlock()
	if snap.virtual(h.b.kind) {
		// Taken while the release had no record: the store names us
		// before the first gate appears (Store.Announce). Best effort:
		// without it the gate is judged by its long bound until the
		// first renewal, which only delays a takeover.
		// The deadline is on the backend's clock, not the runtime's
		// (a test build's offset clock, an embedder's): the time left
		// bounds the write. Found by the simulation (seed 389): with
		// a clock 10 min behind, the context had always expired, the
		// beat was never written, and a holder that died before its
		// first renewal left its gate judged by the 24 h bound.
		ctx, cancel := h.b.withDeadline(withFence(context.Background(), h.Valid), h.Deadline())
		if announced, err := h.b.store(h.req.Namespace).Announce(ctx, snap, rec); err == nil {
			h.mu.Lock()
			h.snap = announced
			h.mu.Unlock()
		}
		cancel()
	}
	rec = h.b.store(h.req.Namespace).Carried(rec)
	// The beat's write may have taken the time left (its fence then found
	// the lock past its deadline): nothing more is sent under it.
	if err := h.Valid(); err != nil {
		return err
	}
	h.mu.Lock()
	h.carryNoted = false
	h.mu.Unlock()
	err := write(rec)
	h.mu.Lock()
	if !h.carryNoted {
		// The copy went somewhere this lock was not told of (GateWritten
		// inside write), or its outcome is unknown: the release reads
		// where the lock is.
		h.gateUnsure = true
	}
	h.mu.Unlock()
	return err
}

// Wrote tells the lock that its holder's session wrote revision rev under
// it (the write fence's create of that revision's record, which may have
// committed). From then on the record names rev, when newer than the
// revision it named: every copy of the lock written later (a renewal of the
// beat or the Lease, a release, a taker's copy of it as the abandoned
// holder) names the newest revision the session wrote. Without it an
// upgrade's --rollback-on-failure, which writes a second revision under the
// lock taken for the first, would leave the lock naming the first, and the
// second would be taken for stock helm's once a renewal carried that on.
// Nothing is written now; the next write of the lock carries it.
func (h *part) Wrote(rev int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wrote = max(h.wrote, rev)
	h.rec.Revision = max(h.rec.Revision, rev)
}

// Session is the holder's session ID.
func (h *part) Session() string { return h.req.Session }

// ReadFloor is a resourceVersion of the release's records written at or
// after this lock was taken: the gate's, when this part is a record lock
// whose gate (the newest record) names this session, which only this
// session's take can have written. A read of the records "not older than"
// it sees every record written before the take, without the wait a fully
// consistent read may cost right after a write. "" when there is none (a
// Lease, a virtual record lock).
func (h *part) ReadFloor() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.b.kind != StoreRelease || h.snap.Newest == nil {
		return ""
	}
	rec := h.snap.Record
	if h.snap.RecordErr != nil || rec == nil || rec.Session != h.req.Session {
		return ""
	}
	return h.snap.Newest.ResourceVersion
}

// Record returns a copy of the record as last written.
func (h *part) Record() Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rec
}

// Deadline is the renew deadline on the injected local clock: unless a
// renewal succeeds first, the lock must be considered lost from then on. It
// is moved earlier by any time the machine spent asleep since the last
// renewal was sent, which the clock's readings do not count but the lease
// does (sleepclock.Elapsed's larger estimate).
func (h *part) Deadline() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.deadlineLocked()
}

func (h *part) deadlineLocked() time.Time {
	now := h.b.clock.Now()
	_, hi := sleepclock.Elapsed(h.b.clock, h.lastSend, now)
	return h.deadline.Add(now.Sub(h.lastSend) - hi)
}

// Done is closed once the lock has been released or lost.
func (h *part) Done() <-chan struct{} { return h.done }

// Valid reports whether it is still safe to write under this lock: nil while
// the lock is held and its renew deadline has not passed. It is the check a
// fenced writer makes before every write. Passing the maximum hold time does
// not by itself invalidate the lock (the holder may still record its
// failure before the deadline); Keep reports it through onLost.
func (h *part) Valid() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.validLocked()
}

func (h *part) validLocked() error {
	switch {
	case h.lost != nil:
		return h.lost
	case h.released:
		return fmt.Errorf("lock on release %q in namespace %q was already released: %w", h.req.Release, h.req.Namespace, ErrLost)
	case !h.b.clock.Now().Before(h.deadlineLocked()):
		return h.loseLocked(fmt.Errorf("lock on release %q in namespace %q was not renewed before its renew deadline (lease %s less margin %s after the last renewal was sent); stop writing: %w", h.req.Release, h.req.Namespace, h.req.LeaseDuration, h.b.renewMargin(), ErrLost))
	}
	if h.b.time == nil {
		return nil
	}
	// The local deadline above stands still with this process's clocks;
	// the API server's clock does not (see ServerPassedLockedTill).
	till := StopTill(&h.rec, h.b.renewMargin())
	if now, ok := h.b.time.Now(); ServerPassedLockedTill(till, now, ok, h.b.renewMargin()) {
		return h.loseLocked(fmt.Errorf("lock on release %q in namespace %q: the API server's clock reads at least %s, past its LOCKED TILL %s less the renew margin %s, though this process's clocks say its renew deadline has not come (they stood still: a paused or restored virtual machine, a restored snapshot); another client may have taken the release over; stop writing: %w",
			h.req.Release, h.req.Namespace, now.Earliest.UTC().Format(time.RFC3339Nano), till.UTC().Format(time.RFC3339Nano), h.b.renewMargin(), ErrLost))
	}
	return nil
}

// releasedLocked marks the lock given back (unless it was lost first).
func (h *part) releasedLocked() {
	if !h.released && h.lost == nil {
		h.released = true
		close(h.done)
	}
}

func (h *part) loseLocked(err error) error {
	if h.lost == nil && !h.released {
		h.lost = err
		close(h.done)
	}
	if h.lost != nil {
		return h.lost
	}
	return err
}

// loseGone marks the lock as held or deleted by someone else.
func (h *part) loseGone(err error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gone = true
	return h.loseLocked(err)
}

// isGone reports whether the lock was lost to someone else (taken, released
// by a person, or vanished with its record), not merely at its renew
// deadline.
// isVirtual reports whether the lock is a record lock taken while the
// release had no record (nothing was written to take it).
func (h *part) isVirtual() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.snap.virtual(h.b.kind)
}

func (h *part) isGone() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gone
}

func (h *part) maxHoldPassedLocked() bool {
	return !h.maxHoldAt.IsZero() && !h.b.clock.Now().Before(h.maxHoldAt)
}

func (h *part) maxHoldErr() error {
	return fmt.Errorf("lock on release %q in namespace %q held for %s, its maximum hold time; stopping: %w", h.req.Release, h.req.Namespace, h.req.MaxHold, ErrMaxHold)
}

// Renew extends the lock by one lease from now. It fails with an error
// wrapping ErrLost when the lock is no longer this session's (the caller must
// stop writing at once) and with ErrMaxHold once the maximum hold time has
// passed; other errors are transient and the lock stays valid until
// Deadline.
func (h *part) Renew(ctx context.Context) error {
	return h.write(ctx, false, func(*Record) {})
}

// SetRevision records the revision being written, renewing the lock in the
// same write.
//
// It writes nothing when the record already names rev and no abandoned
// holder (the take named it: nextRevision), beyond checking the lock is
// still valid. On the release store the take's beat is then left as the
// claim it wrote: it names the record it was made against
// (annotationClaimedOn), so it is never taken for a claim in flight against
// a later record (stock helm's, say: TestUnreadableRecordIsSkipped); the
// first renewal makes it the holder's own beat.
func (h *part) SetRevision(ctx context.Context, rev int) error {
	h.mu.Lock()
	named := h.rec.Revision == rev && h.rec.Abandoned == nil && !h.released
	h.mu.Unlock()
	if named {
		return h.Valid()
	}
	return h.write(ctx, false, func(r *Record) { r.Revision, r.Abandoned = rev, nil })
}

// Release gives the lock back: holderIdentity becomes empty and the record is
// kept, marked released, for whoever looks next. It is idempotent. It works
// after the renew deadline or the maximum hold time too, since the write is
// conditional on this session still being the holder. Pass a context that is
// not already cancelled (for example context.WithoutCancel plus a timeout)
// when releasing on the way out of an interrupted operation.
func (h *part) Release(ctx context.Context) error {
	return h.write(ctx, true, func(r *Record) { r.Abandoned = nil })
}

// ReleaseAbandoning gives the lock back, as Release does, after this holder
// failed to recover the revision that abandoned, an expired holder's record,
// left pending: the record it leaves names that holder (Record.Abandoned), so
// the next client recovers the revision at once. A nil abandoned is Release.
func (h *part) ReleaseAbandoning(ctx context.Context, abandoned *Record) error {
	if abandoned == nil {
		return h.Release(ctx)
	}
	a := *abandoned
	a.Abandoned = nil
	return h.write(ctx, true, func(r *Record) { r.Abandoned = &a })
}

// releaseNamingExpired gives h back naming the holder it was taken over
// from, when that holder had expired (Found, ReleaseAbandoning): the next
// client, this one retrying included, recovers at once what that holder
// abandoned rather than judge it stock helm's.
func (h *part) releaseNamingExpired(ctx context.Context) error {
	return h.ReleaseAbandoning(ctx, HandedOn(h.Previous, h.PreviousState))
}

// ReleaseAndDelete gives the lock back by deleting the Lease, for uninstall,
// so nothing of the release is left behind. The delete is conditional on the
// resourceVersion last seen. When waiters are queued it only releases, so
// their order survives.
func (h *part) ReleaseAndDelete(ctx context.Context) error {
	h.writeMu.Lock()
	defer h.writeMu.Unlock()
	h.mu.Lock()
	cur := h.snap
	done, gone, err := h.released, h.gone, h.lost
	h.mu.Unlock()
	if done {
		return nil
	}
	if gone {
		return err
	}
	store := h.b.store(h.req.Namespace)
	for range maxConflicts {
		now, err := h.b.serverNow(ctx)
		if err != nil {
			return fmt.Errorf("release lock on release %q in namespace %q: %w", h.req.Release, h.req.Namespace, err)
		}
		if len(liveWaiters(cur.Queue, now, h.b.margin())) > 0 {
			return h.writeLocked(ctx, true, func(*Record) {})
		}
		err = store.Delete(ctx, cur)
		switch {
		case err == nil:
			h.mu.Lock()
			h.releasedLocked()
			h.mu.Unlock()
			return nil
		case apierrors.IsConflict(err):
			fresh, err := h.reread(ctx, cur)
			if err != nil {
				return err
			}
			cur = fresh
			h.mu.Lock()
			h.snap = fresh
			h.mu.Unlock()
		case apierrors.IsNotFound(err):
			return h.loseGone(fmt.Errorf("lock on release %q in namespace %q: %s was deleted by someone else: %w", h.req.Release, h.req.Namespace, h.b.object(cur.Name), ErrLost))
		default:
			return fmt.Errorf("release lock on release %q in namespace %q: delete %s: %w", h.req.Release, h.req.Namespace, h.b.object(cur.Name), err)
		}
	}
	return fmt.Errorf("release lock on release %q in namespace %q: lease changed %d times; retry", h.req.Release, h.req.Namespace, maxConflicts)
}

// reread fetches the Lease after a conflict on cur (the Lease as last
// written or read) and checks that this session still holds it.
//
// In the release store, the lock moves from record to record: our own
// fenced helm writes carry it onto a new revision, and before helm prunes
// the newest record they write our current record onto the next newest. Any
// other change that leaves no record of ours on the newest record means the
// lock vanished while held (stock helm, which takes no lock, rewrote or
// superseded the record, or deleted it): the lock is lost, never written
// back. When the newest record is older than the one the lock was on (the
// newer one was deleted), a record of ours found there counts only if it is
// at least as recent as our last write: an older copy is what was left
// behind when the lock moved on, not the lock.
func (h *part) reread(ctx context.Context, cur *Snapshot) (*Snapshot, error) {
	name := LeaseName(h.req.Release)
	fresh, err := h.b.store(h.req.Namespace).Read(ctx, name)
	if apierrors.IsNotFound(err) {
		what := "lease " + name + " was deleted by someone else"
		switch {
		case cur.virtual(h.b.kind):
			// Still no record: its beat changed (found by review).
			what = "another session wrote its beat before the release's first revision was created (another client is installing it)"
		case h.b.kind == StoreRelease:
			what = "every stored revision of the release was deleted (by a client that takes no lock, such as stock helm's uninstall, or by hand)"
		}
		return nil, h.loseGone(fmt.Errorf("lock on release %q in namespace %q: %s: %w", h.req.Release, h.req.Namespace, what, ErrLost))
	}
	if err != nil {
		return nil, fmt.Errorf("lock on release %q in namespace %q: read %s: %w", h.req.Release, h.req.Namespace, h.b.object(name), err)
	}
	if err := h.vanished(cur, fresh); err != nil {
		return nil, h.loseGone(err)
	}
	if holder := HolderOf(&fresh.Spec); holder != h.req.Session {
		by := "nobody (released)"
		if holder != "" {
			by = "session " + holder
			if rec := fresh.Record; fresh.RecordErr == nil && rec != nil && rec.Session == holder && rec.Who != "" {
				by += " of " + rec.Who
			}
		}
		return nil, h.loseGone(fmt.Errorf("lock on release %q in namespace %q is now held by %s: %w", h.req.Release, h.req.Namespace, by, ErrLost))
	}
	if c := claimOf(fresh); c != nil {
		// The release store's beat (see package releasestore): a person's release
		// marks it before the gate, a takeover claims it before the gate.
		switch {
		case c.Session == h.req.Session && !c.ReleasedAt.IsZero():
			return nil, h.loseGone(fmt.Errorf("lock on release %q in namespace %q was released by %s: %w", h.req.Release, h.req.Namespace, firstNonEmpty(c.ReleasedBy, "someone else"), ErrLost))
		case c.Session != h.req.Session && fresh.Claim.From == h.req.Session:
			return nil, h.loseGone(fmt.Errorf("lock on release %q in namespace %q is being taken over by session %s of %s: %w", h.req.Release, h.req.Namespace, c.Session, firstNonEmpty(c.Who, "unknown"), ErrLost))
		}
	}
	// A write of ours whose answer was lost may have committed a later
	// renewal than the last one we know of: the next one stamps after it,
	// so LOCKED TILL never moves back.
	if rec := fresh.Record; fresh.RecordErr == nil && rec != nil && rec.Session == h.req.Session {
		h.mu.Lock()
		if rec.RenewedAt.After(h.rec.RenewedAt) {
			h.rec.RenewedAt, h.rec.RenewedAfter, h.rec.LockedTill = rec.RenewedAt, rec.RenewedAfter, rec.LockedTill
		}
		h.mu.Unlock()
	}
	return fresh, nil
}

// vanished reports, for the release store, a lock that vanished while held:
// fresh, the release's newest record, carries no lock record at all (stock
// helm rewrote it, or wrote a newer revision), or it is older than cur's
// record and carries an older copy of our record than our last write (the
// record the lock was on was deleted). See reread.
func (h *part) vanished(cur, fresh *Snapshot) error {
	if h.b.kind != StoreRelease {
		return nil
	}
	ref := fresh.Object
	if !fresh.HasRecord {
		return fmt.Errorf("lock on release %q in namespace %q vanished: the release's newest record %s no longer carries it (rewritten or written by a client that takes no lock, such as stock helm's rollback or uninstall): %w", h.req.Release, h.req.Namespace, ref, ErrLost)
	}
	if cur.Newest == nil || fresh.Newest == nil || fresh.Newest.Revision >= cur.Newest.Revision {
		return nil
	}
	was := cur.Newest.Revision
	rec := fresh.Record
	if fresh.RecordErr != nil || rec == nil || rec.Session != h.req.Session {
		return nil // judged by its holder below
	}
	// The gate's own stamp, before the beat's renewals are merged in.
	stamped := rec.RenewedAt
	if t := fresh.Newest.GateRenewed; !t.IsZero() {
		stamped = t
	}
	h.mu.Lock()
	last := h.gateStamp
	h.mu.Unlock()
	if stamped.Before(last) {
		return fmt.Errorf("lock on release %q in namespace %q vanished: revision %d, which it was on, was deleted, and %s carries only an older copy of it (written %s, last copy %s): %w", h.req.Release, h.req.Namespace, was, ref, stamped.UTC().Format(time.RFC3339Nano), last.UTC().Format(time.RFC3339Nano), ErrLost)
	}
	return nil
}

func (h *part) write(ctx context.Context, release bool, mutate func(*Record)) error {
	h.writeMu.Lock()
	defer h.writeMu.Unlock()
	return h.writeLocked(ctx, release, mutate)
}

// writeLocked updates the Lease, conditional on the last resourceVersion; on
// a conflict it re-reads and goes on only while this session still holds the
// lock. Callers hold writeMu.
func (h *part) writeLocked(ctx context.Context, release bool, mutate func(*Record)) error {
	h.mu.Lock()
	if h.released {
		h.mu.Unlock()
		return nil
	}
	cur := h.snap
	h.mu.Unlock()
	if !release {
		// Every request this write sends is checked against the renew
		// deadline right before it leaves, and none is sent or retried
		// after it (the simulation, seed 842: a read held up by a system
		// sleep, then the beat written 20 s after the lock expired). A
		// release is conditional on this session still holding the lock:
		// it may go after the deadline.
		var cancel context.CancelFunc
		ctx, cancel = h.b.withDeadline(withFence(ctx, h.Valid), h.Deadline())
		defer cancel()
	}
	store := h.b.store(h.req.Namespace)
	for range maxConflicts {
		h.mu.Lock()
		var err error
		if release {
			if h.gone {
				err = h.lost
			}
		} else if err = h.validLocked(); err == nil && h.maxHoldPassedLocked() {
			err = h.maxHoldErr()
		}
		rec, wrote := h.rec, h.wrote
		h.mu.Unlock()
		if err != nil {
			return err
		}
		sent := h.b.clock.Now()
		now, err := h.b.serverNow(ctx)
		if err != nil {
			return fmt.Errorf("lock on release %q in namespace %q: %w", h.req.Release, h.req.Namespace, err)
		}
		if !release {
			// serverNow may have asked the API server: check again.
			if err := Fenced(ctx); err != nil {
				return err
			}
		}
		mutate(&rec)
		rec.Revision = max(rec.Revision, wrote) // see Wrote
		if release {
			rec.ReleasedAt = later(ceilMilli(now.Latest), rec.RenewedAt)
		} else {
			stamp(&rec, now)
		}
		var updated *Snapshot
		if release {
			h.mu.Lock()
			at := h.gateAt
			if h.gateUnsure {
				at = ""
			}
			h.mu.Unlock()
			updated, err = store.Release(ctx, cur, rec, at)
		} else {
			updated, err = store.Renew(ctx, cur, rec)
		}
		switch {
		case err == nil:
			h.mu.Lock()
			defer h.mu.Unlock()
			h.snap, h.rec = updated, rec
			// A revision written while this write was in flight (Wrote,
			// on a part no Carry serialises with it) is named by the next.
			h.rec.Revision = max(h.rec.Revision, h.wrote)
			if release {
				h.releasedLocked()
				return nil
			}
			h.lastSend = sent
			h.deadline = sent.Add(h.req.LeaseDuration - h.b.renewMargin())
			return nil
		case apierrors.IsConflict(err):
			fresh, err := h.reread(ctx, cur)
			if err != nil {
				return err
			}
			cur = fresh
		case apierrors.IsNotFound(err):
			return h.loseGone(fmt.Errorf("lock on release %q in namespace %q: %s was deleted by someone else: %w", h.req.Release, h.req.Namespace, h.b.object(cur.Name), ErrLost))
		default:
			return fmt.Errorf("renew lock on release %q in namespace %q: %w", h.req.Release, h.req.Namespace, err)
		}
	}
	return fmt.Errorf("renew lock on release %q in namespace %q: lease changed %d times; retry", h.req.Release, h.req.Namespace, maxConflicts)
}

// fenceKey is the context key of a write's fence (withFence).
type fenceKey struct{}

// withFence returns ctx carrying valid, the check that the lock a write
// belongs to (a take's new record, a holder's renewal) may still be
// written: nil while its renew deadline has not passed, on the local clock
// and in the API server's (part.Valid). A store that sends several
// requests for one write of the lock (the release store: it reads, then
// claims the beat, then writes the gate) checks it right before each
// write request it sends (Fenced), so that none leaves once that deadline
// has passed, however long the process stood still in between: a read
// held up by a pause or a system sleep, say (the simulation, seeds 302
// and 842).
func withFence(ctx context.Context, valid func() error) context.Context {
	return context.WithValue(ctx, fenceKey{}, valid)
}

// Fenced runs the check ctx carries (withFence); nil when it carries none.
func Fenced(ctx context.Context) error {
	if valid, ok := ctx.Value(fenceKey{}).(func() error); ok {
		return valid()
	}
	return nil
}

// withDeadline bounds ctx by the renew deadline d, on the backend's clock
// (a test build's offset clock, an embedder's): no request of the write,
// client-go's retries of a throttled one included, is sent after it.
func (b *Backend) withDeadline(ctx context.Context, d time.Time) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, max(d.Sub(b.clock.Now()), 0))
}

// firstProbeAfter bounds how long a holder waits, once it holds the lock,
// before its first server-time probe (see Keep).
const firstProbeAfter = time.Second

// Keep renews the lock every third of its lease until ctx is done or the
// lock is released or lost. It calls onLost once, with an error wrapping
// ErrLost or ErrMaxHold, when the lock was taken, could not be renewed before
// its renew deadline, or was held past the maximum hold time; the caller must
// then stop its operation before writing again. Transient renewal errors are
// retried until the deadline. Run it in its own goroutine.
func (h *part) Keep(ctx context.Context, onLost func(error)) {
	clk := h.b.clock
	lease := h.req.LeaseDuration
	retry := max(lease/15, 100*time.Millisecond)
	var nextRenew, probeAfter time.Time
	report := func(err error) {
		if onLost != nil {
			onLost(err)
		}
	}
	// The probes below narrow the server-time bounds for the LOCKED TILL
	// the next renewal writes; the take's is written already. An operation
	// that ends within its first moments (a no-wait upgrade: half a
	// second) renews nothing, and probing would only add requests: the
	// first probe waits a sixth of the lease, at most firstProbeAfter.
	probeAfter = clk.Now().Add(min(lease/6, firstProbeAfter))
	for {
		h.mu.Lock()
		if h.released || h.lost != nil {
			lost := h.lost
			h.mu.Unlock()
			if lost != nil {
				report(lost)
			}
			return
		}
		deadline, maxHoldAt := h.deadline, h.maxHoldAt
		if nextRenew.IsZero() || nextRenew.Before(h.lastSend) {
			nextRenew = h.renewAt(h.lastSend.Add(lease / 3))
		}
		h.mu.Unlock()

		// Between renewals, a few cheap requests timed to split the Date
		// header's second narrow the server-time bounds, so the LOCKED TILL
		// written is close to the truth and a dead holder is recovered from
		// soon after its lease.
		probeAt, probing := h.b.time.ProbeAt(later(clk.Now(), probeAfter), probeWidth)
		wake := slices.MinFunc([]time.Time{nextRenew, deadline, orFar(maxHoldAt), orFar(probeAt)}, time.Time.Compare)
		timer := clk.NewTimer(wake.Sub(clk.Now()))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-h.done:
			timer.Stop()
			continue
		case <-timer.C():
		}

		now := clk.Now()
		h.mu.Lock()
		switch {
		case h.released:
			h.mu.Unlock()
			return
		case h.lost == nil && h.maxHoldPassedLocked():
			err := h.maxHoldErr()
			h.mu.Unlock()
			report(err)
			return
		}
		err := h.validLocked()
		h.mu.Unlock()
		if err != nil {
			continue // reported at the top of the loop
		}
		if now.Before(nextRenew) {
			if probing && !now.Before(probeAt) {
				pctx, cancel := context.WithTimeout(ctx, min(time.Second, max(nextRenew.Sub(now), 100*time.Millisecond)))
				err := h.b.time.Probe(pctx, h.b.client.Discovery())
				cancel()
				probeAfter = clk.Now().Add(probeWidth)
				if err != nil {
					probeAfter = clk.Now().Add(lease)
				}
			}
			continue
		}
		err = h.Renew(ctx) // bounded by its deadline (writeLocked)
		switch {
		case err == nil:
			nextRenew = time.Time{}
		case ctx.Err() != nil:
			return
		default:
			h.mu.Lock()
			lost := h.lost
			h.mu.Unlock()
			if lost == nil {
				nextRenew = clk.Now().Add(retry)
			}
		}
	}
}

// stopKeeping stops a Keep of h by calling cancel, its context's, once no
// write of the lock is in flight: a renewal in flight runs to its answer
// first, bounded by the renew deadline (writeLocked). Cancelled mid-flight,
// a renewal that committed is forgotten (its resourceVersion, and its send
// time, which the renew deadline counts from), and the next write of the
// lock conflicts with it and reads the lock again first. Acquire hands its
// parts' renewals over so once every part is taken (the simulation, seed
// 13031: a renewal of the gate cancelled there 60 ms after it committed,
// on a network of up to 900 ms a request; the renewal after it sent its
// write at 24.2 s against a deadline of 24.8 s counted from the one
// before, and the lock was lost).
func (h *part) stopKeeping(cancel context.CancelFunc) {
	h.writeMu.Lock()
	defer h.writeMu.Unlock()
	cancel()
}

// renewAt picks when to renew: at target, or up to a sixth of the lease (at
// most a second) earlier when that lets the renewal double as a probe of the
// server clock (servertime.Estimator.ProbeAt). Tighter bounds make the
// LOCKED TILL this holder writes closer to the truth, so a dead holder is
// recovered from sooner.
func (h *part) renewAt(target time.Time) time.Time {
	window := min(time.Second, h.req.LeaseDuration/6)
	if p, ok := h.b.time.ProbeAt(target.Add(-window), probeWidth); ok && !p.After(target) {
		return p
	}
	return target
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func orFar(t time.Time) time.Time {
	if t.IsZero() {
		return time.Unix(1<<62, 0)
	}
	return t
}

// writeGate is a mutex held across a request. It is a channel rather than a
// sync.Mutex so that a goroutine waiting for it is durably blocked in a
// testing/synctest bubble (internal/sim runs this package on virtual time,
// which advances only when every goroutine is durably blocked; one waiting
// on a sync.Mutex is not).
type writeGate struct {
	once sync.Once
	ch   chan struct{}
}

// Lock takes the gate, waiting for it.
func (g *writeGate) Lock() {
	g.once.Do(func() { g.ch = make(chan struct{}, 1) })
	g.ch <- struct{}{}
}

// Unlock gives the gate back.
func (g *writeGate) Unlock() { <-g.ch }
