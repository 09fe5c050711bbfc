package protocol

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
	"github.com/helm-autorecover/helm-autorecover/internal/sqlstore"
)

// acquire takes the lock of req.Release in every store, in order (see
// Stores). With wait false it fails at once with an error wrapping
// lock.ErrLocked when a live client holds any of them; with wait true it
// waits in arrival order until ctx ends, calling onProgress as
// lock.Backend.Wait does.
func (c *Conn) acquire(ctx context.Context, req lock.Request, stores []*lock.Backend, wait bool, onProgress func(*lock.Record, time.Duration)) (*Lock, error) {
	h, err := lock.Acquire(ctx, req, wait, onProgress, stores...)
	if err != nil {
		return nil, err
	}
	l := &Lock{conn: c, held: h, release: req.Release, namespace: req.Namespace}
	// Until recovery succeeds, a holder found expired is handed on when
	// this lock is released (see Release).
	_, found := h.Previous()
	l.handOn = found == lock.Expired
	return l, nil
}

// ReadFloor is a resourceVersion of the release's records written at or
// after this lock was taken ("" when none): see lock.Held.ReadFloor. It is
// given once per lock, to the first read under it: helm's writes through
// the fence do not move it, so a later read (a second Recover after helm
// wrote a revision) must be consistent.
func (l *Lock) ReadFloor() string {
	if l.floorGiven.Swap(true) {
		return ""
	}
	return l.held.ReadFloor()
}

// NewestAtTake is the release's newest record as the take of its record
// lock read or wrote it (revision 0: none; its name, revision and status
// label), from the read that take's write was conditional on; false when
// no part was taken on the release's records (a Lease alone, the sql
// driver). It is given once, to the first recovery under the lock
// (Conn.Recover): when that record is not pending, only it is read, not
// the whole history. Later recoveries (after helm wrote a revision) read
// the history.
func (l *Lock) NewestAtTake() (helmx.Summary, bool) {
	if l.newestGiven.Swap(true) {
		return helmx.Summary{}, false
	}
	name, rev, status, ok := l.held.Newest()
	if !ok {
		return helmx.Summary{}, false
	}
	return helmx.Summary{RecordName: name, Name: l.release, Namespace: l.namespace, Revision: rev, Status: common.Status(status)}, true
}

// Lock is a release lock taken through Acquire: every store's part under
// one session, and what it was taken from. Its methods are safe for
// concurrent use.
type Lock struct {
	conn               *Conn
	held               *lock.Held
	release, namespace string
	// fence is the write fence Take armed for the lock (Fence).
	fence *helmx.WriteFence
	// endOnce makes End give the lock back once; unfence stops the fence
	// judging writes by this lock (End).
	endOnce sync.Once
	unfence func()
	// drainOnce makes drain close the fence and helm's sql driver once.
	drainOnce sync.Once

	// floorGiven is set once ReadFloor has given the take's floor;
	// newestGiven once NewestAtTake has said what the take read.
	floorGiven  atomic.Bool
	newestGiven atomic.Bool
	// lastRecordWrite is the resourceVersion of the fence's last accepted
	// write of a record of the release (guarded by mu).
	lastRecordWrite string

	mu sync.Mutex
	// handOn is set while the lock was taken over from an expired holder
	// whose revision has not been recovered: Release then leaves a record
	// that names that holder, so the next client recovers it at once.
	handOn bool
	// unsettled lists the holder's own revisions whose last write through
	// the fence failed or left them pending (OwnRecordWrite): Release
	// resolves them first.
	unsettled map[int]bool
	// resolved says, for the user, what Release did about them.
	resolved []string
	// preempted is the request the holder stopped its operation for
	// (watchAsks): its own revision is marked failed naming the asker.
	preempted *PreemptedError
	// preemptDecided is closed once the holder decided whether the stop
	// for preempted took effect (stopFor).
	preemptDecided chan struct{}
	// settledWrites says, for each of the holder's own revisions, whether
	// the last write of it through the fence settled it (OwnRecordWrite).
	settledWrites map[int]bool
	// helmMu guards helmSQL, helm's own sql driver opened for this lock's
	// session (HelmSQL), closed when the fence is drained (helmDrained:
	// none is opened afterwards). Opening it talks to the database: it has
	// a mutex of its own, so that mu is never held across it.
	helmMu      sync.Mutex
	helmSQL     *sqlstore.HelmDriver
	helmDrained bool
}

// Resolved says what Release did about revisions of this holder's own
// that helm's operation left pending (its final write failed): one
// sentence each, naming the release and namespace; none on the happy path.
func (l *Lock) Resolved() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.resolved)
}

func (l *Lock) noteResolved(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.resolved = append(l.resolved, fmt.Sprintf(format, args...))
}

// DescriptionOwnUnsettled is written into a revision its own holder marks
// failed on release, because helm's operation ended without recording its
// outcome there (its last write of the revision failed). Verbs: the pending
// status, the session, the server time.
const DescriptionOwnUnsettled = "Failed %s: the operation ended without recording its outcome (helm's last write of this revision did not succeed); marked failed by its own holder, helm-autorecover session %s, at %s"

// maxSettleAttempts bounds how often the holder reads its own revision
// again after a conflict while marking it failed.
const maxSettleAttempts = 3

// Taken describes the holder this lock was taken from and how it was
// found: Free when it released, Expired when this lock took it over (an
// abandoned holder handed on already stands in for it, lock.Found). The
// record is nil when there was none or it was unreadable.
func (l *Lock) Taken() (*Record, State) { return l.held.Previous() }

// Session is the lock's session ID.
func (l *Lock) Session() string { return l.held.Session() }

// Record is the lock's record as last written (the release record's part).
func (l *Lock) Record() lock.Record { return l.held.Record() }

// Carry runs write with the lock's record while no renewal of it is in
// flight (lock.Held.Carry), for writes that copy it onto another record.
func (l *Lock) Carry(write func(lock.Record) error) error { return l.held.Carry(write) }

// Valid is nil while it is still safe to write under the lock.
func (l *Lock) Valid() error { return l.held.Valid() }

// Deadline is the lock's renew deadline (lock.Held.Deadline) on this
// process's clock as time.Now reads it, whatever clock the lock was given:
// the write fence puts it on every write as its deadline. Zero means none.
func (l *Lock) Deadline() time.Time {
	d := l.held.Deadline()
	if d.IsZero() || l.conn == nil || l.conn.clock == nil {
		return d
	}
	// time.Now is read first: the time left, read after it, is never
	// overstated.
	now := time.Now()
	return now.Add(d.Sub(l.conn.clock.Now()))
}

// FeedServerClock is how the write fence (helmx.ServerClockFeed) passes
// every answer it sees under this lock, helm's included, through the
// connection's estimate of the API server's clock, by which the lock also
// stops (lock.ServerPassedLockedTill): a holder whose clocks stood still
// learns from helm's first read after it resumed that its lock ran out.
func (l *Lock) FeedServerClock(next http.RoundTripper) http.RoundTripper {
	if l.conn == nil || l.conn.est == nil {
		return next
	}
	return l.conn.est.WrapTransport(next)
}

// RecordWritten is how the write fence (helmx.RecordWriteNoter) tells the
// lock the metadata of each record write it made, as the server returned
// it: Release reads not older than the last, and writes the release where
// the last write carrying the lock left it (lock.Held.GateWritten).
func (l *Lock) RecordWritten(meta metav1.ObjectMeta) {
	l.mu.Lock()
	l.lastRecordWrite = meta.ResourceVersion
	l.mu.Unlock()
	l.held.GateWritten(meta)
}

// RecordWriteUnsure is how the write fence (helmx.RecordWriteNoter) tells
// the lock that a record write it was asked to make did not end in an
// accepted answer: the release then reads where the lock is before writing
// it (lock.Held.GateUnsure).
func (l *Lock) RecordWriteUnsure() { l.held.GateUnsure() }

// OwnRecordWrite is how the write fence (helmx.OwnRecordReporter) tells the
// lock that a write of revision rev, one of the holder's own, failed or
// left it pending (settled false), or resolved it (settled true). Release
// resolves every revision left unsettled before it gives the lock back;
// when every write succeeded it costs no request.
func (l *Lock) OwnRecordWrite(rev int, settled bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.settledWrites == nil {
		l.settledWrites = map[int]bool{}
	}
	l.settledWrites[rev] = settled
	if settled {
		delete(l.unsettled, rev)
		return
	}
	if l.unsettled == nil {
		l.unsettled = map[int]bool{}
	}
	l.unsettled[rev] = true
}

// Wrote is how the write fence (helmx.RevisionNoter) tells the lock that
// the holder wrote revision rev: its record names the newest revision the
// session wrote (lock.Held.Wrote).
func (l *Lock) Wrote(rev int) { l.held.Wrote(rev) }

// Previous maps what the lock was taken from onto recovery's input.
func (l *Lock) Previous() recovery.LockInfo { return recovery.PreviousLock(l.held.Previous()) }

// NextRevision is the revision op is about to write, to record with
// SetRevision so that whoever finds it abandoned recovers it at once: the
// one after latest, the highest stored revision recovery read (or latest
// itself for an uninstall, which rewrites it). A negative latest (recovery
// rolled back, writing a revision it did not read) reads the history again;
// a driver that keeps no record counts as no revision.
func (l *Lock) NextRevision(ctx context.Context, op lock.Operation, latest int) (int, error) {
	if latest < 0 {
		latest = 0
		if _, err := l.conn.Records(); err == nil {
			hist, err := l.conn.History(ctx, l.namespace, l.release)
			if err != nil {
				return 0, err
			}
			if n := len(hist); n > 0 {
				latest = hist[n-1].Revision
			}
		}
	}
	if op == lock.OpUninstall {
		return latest, nil
	}
	return latest + 1, nil
}

// Renew extends every part by one lease from now.
func (l *Lock) Renew(ctx context.Context) error { return l.held.Renew(ctx) }

// SetRevision records the revision the operation is about to write.
func (l *Lock) SetRevision(ctx context.Context, rev int) error {
	return l.held.SetRevision(ctx, rev)
}

// Keep renews every part until ctx ends or the lock is released; onLost is
// called once, when a part is lost or held past its maximum hold.
func (l *Lock) Keep(ctx context.Context, onLost func(error)) { l.held.Keep(ctx, onLost) }

// Release gives the lock back, once its write fence is drained (no write
// let through it can land any more). When it was taken over from an expired
// holder whose revision was not recovered (recovery failed, was blocked, or
// never ran), the record left names that holder (lock.Record.Abandoned), so
// the next client recovers it at once instead of taking it for stock
// helm's. A lock already lost (its renew deadline passed, or someone took
// or released it) is not written at all: the holder stops writing, as the
// CLI's fail-stop does, and its lock runs out by itself, after which the
// next client takes it over and recovers what it left.
//
// A revision of the holder's own that helm's operation may have left
// pending (the fence saw its last write fail: a 5xx on the final status
// write, conflicts retried to the end; see OwnRecordWrite) is resolved
// first: read, and when still pending and carrying this lock, marked
// failed (recovery.MarkFailed, conditional on the resourceVersion read).
// When that fails too, the record left names this holder as abandoned
// (lock.Record.Abandoned, with its tenure ending now), so the next client
// recovers the revision at once instead of taking it for stock helm's.
func (l *Lock) Release(ctx context.Context) error {
	l.drain()
	l.mu.Lock()
	handOn := l.handOn
	// The release's first read of the records is served once the API
	// server's cache holds helm's last write through the fence (see
	// RecordWritten), unless a write of a revision of ours ended unsettled:
	// its outcome may be unknown (a create whose answer was lost may have
	// committed after that write), and only a consistent read sees it.
	if len(l.unsettled) == 0 {
		ctx = records.WithNotOlderThan(ctx, l.lastRecordWrite)
	}
	l.mu.Unlock()
	if err := l.held.Valid(); err != nil {
		return err
	}
	if done, err := l.settleOwn(ctx); done {
		return err
	}
	if handOn {
		return l.held.ReleaseAfterFailedRecovery(ctx)
	}
	return l.held.Release(ctx)
}

// drain closes the lock's write fence and waits until no write let through
// it can still land (helmx.WriteFence.Drain): nothing written under the lock
// may land once it is free, and the holder's own revision is settled only
// once helm's last write of it has ended.
func (l *Lock) drain() { l.drainOnce.Do(l.drainNow) }

// drainNow is drain's one run: a second caller (the guard's end of the
// process beside Run's own release, preemption beside either) waits for it
// to end, so nobody reads the holder's own revision before helm's last
// write of it ended.
func (l *Lock) drainNow() {
	if l.fence != nil {
		l.fence.Drain()
	}
	l.helmMu.Lock()
	h := l.helmSQL
	l.helmSQL, l.helmDrained = nil, true
	l.helmMu.Unlock()
	if h != nil {
		// Waits, up to the renew deadline, for helm's transactions still
		// open to end, so that the holder's own revision is read after
		// helm's last write of it. Past that, a write of theirs is judged
		// by the database's trigger alone: refused once this session no
		// longer holds the lock row, whose next taker waits for its
		// commit.
		ctx, cancel := context.WithDeadline(context.Background(), l.Deadline())
		_ = h.Close(ctx)
		cancel()
	}
}

// ReleaseAndDelete gives the lock back and removes what is left of it,
// after an uninstall that kept no history. A revision of its own left
// unsettled is resolved first, as Release does; when it cannot be, the
// lock is released naming this holder as abandoned instead of deleted.
func (l *Lock) ReleaseAndDelete(ctx context.Context) error {
	l.drain()
	if err := l.held.Valid(); err != nil {
		// Lost: nothing is written (the lock may be on a revision that
		// landed meanwhile, which the next client must find).
		return err
	}
	if done, err := l.settleOwn(ctx); done {
		return err
	}
	return l.held.ReleaseAndDelete(ctx)
}

// settleOwn resolves the holder's own revisions left unsettled (see
// Release). done reports that it released the lock itself (naming this
// holder as abandoned), or must not release it (the lock was lost), with
// err saying how that went; otherwise the caller releases as usual.
func (l *Lock) settleOwn(ctx context.Context) (done bool, err error) {
	l.mu.Lock()
	revs := make([]int, 0, len(l.unsettled))
	for rev := range l.unsettled {
		revs = append(revs, rev)
	}
	l.mu.Unlock()
	if len(revs) == 0 {
		return false, nil
	}
	recs, rerr := l.conn.Records()
	if rerr != nil {
		return false, nil // a driver that keeps no record here: nothing to resolve
	}
	slices.Sort(revs)
	var failed []error
	left := 0
	for _, rev := range revs {
		if err := l.settleRevision(ctx, recs, rev); err != nil {
			if errors.Is(err, lock.ErrLost) {
				return true, err // write nothing more; the lock runs out
			}
			failed = append(failed, err)
			left = rev
			continue
		}
		l.OwnRecordWrite(rev, true)
	}
	if left == 0 {
		return false, nil
	}
	cause := errors.Join(failed...)
	a := l.held.Record()
	a.Revision = left
	// This holder stops writing with its release: the next client need
	// not wait for its LOCKED TILL either.
	a.Stopped = true
	if now, err := l.conn.ServerNow(ctx); err == nil && now.Latest.Before(a.LockedTill) {
		// Its tenure ends now: every write of helm's was answered before,
		// and nothing is written under this lock after its release. The
		// next client need not wait for the LOCKED TILL it would have
		// renewed to.
		a.LockedTill = now.Latest
	}
	if err := l.held.ReleaseAbandoning(ctx, &a); err != nil {
		return true, fmt.Errorf("release %q in namespace %q: revision %d, which this operation wrote, may still be pending: %w; and releasing the lock naming this session as its abandoned holder failed too (%w): the next operation recovers it once the lock has expired",
			l.release, l.namespace, left, cause, err)
	}
	l.noteResolved("release %q in namespace %q: revision %d, which this operation wrote, may still be pending (%v); the lock was released naming this session as its abandoned holder, so the next operation recovers it at once", l.release, l.namespace, left, cause)
	return true, nil
}

// settleRevision marks the holder's own revision rev failed when it is
// still pending and carries this lock; nil when it is not pending (any
// more), gone, or not this holder's.
func (l *Lock) settleRevision(ctx context.Context, recs helmx.Records, rev int) error {
	name := helmx.ReleaseSecretName(l.release, rev)
	subject := fmt.Sprintf("revision %d of release %q in namespace %q", rev, l.release, l.namespace)
	for range maxSettleAttempts {
		if err := l.held.Valid(); err != nil {
			return fmt.Errorf("%s: stopped before resolving it: %w", subject, err)
		}
		cur, err := recs.Get(ctx, l.namespace, name)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: reading %s %q to resolve it: %w", subject, recs.Kind(), name, err)
		}
		s, err := helmx.SummarizeRecord(cur)
		if err != nil {
			return fmt.Errorf("%s: %w", subject, err)
		}
		if !recovery.IsPending(s.Status) || s.LockSession != l.Session() {
			return nil
		}
		var at time.Time
		if now, err := l.conn.ServerNow(ctx); err == nil {
			at = now.Latest
		}
		desc := fmt.Sprintf(DescriptionOwnUnsettled, s.Status, l.Session(), at.UTC().Format(time.RFC3339))
		if p := l.Preempted(); p != nil {
			desc = fmt.Sprintf(DescriptionPreempted, s.Status, Asker(p.By), l.Session(), at.UTC().Format(time.RFC3339))
		}
		// Checked again right before the write, and the write bounded by
		// the renew deadline: the reads above may have taken long (the
		// simulation, seed 1997, found a holder that slept during them
		// write after its lock had been claimed; the write is conditional
		// on the record as read, which the claim had not changed).
		if err := l.held.Valid(); err != nil {
			return fmt.Errorf("%s: stopped before resolving it: %w", subject, err)
		}
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if d := l.Deadline(); !d.IsZero() {
			wctx, cancel = context.WithDeadline(ctx, d)
		}
		written, err := recovery.MarkFailedHeld(recovery.WithBeforeWrite(wctx, l.held.Valid), recs, l.namespace, s, l.Session(), desc, at)
		cancel()
		switch {
		case err == nil:
			// The release is written where this write left the lock,
			// conditional on its resourceVersion, without a conflict
			// and a read first.
			l.RecordWritten(written.Meta)
			if l.Preempted() == nil {
				l.noteResolved("release %q in namespace %q: helm's operation left revision %d %s (its final write did not land); it was marked failed, so the next operation proceeds", l.release, l.namespace, rev, s.Status)
			}
			return nil
		case errors.Is(err, recovery.ErrNotPending):
			return nil
		case !errors.Is(err, recovery.ErrConflict):
			return err
		}
	}
	return fmt.Errorf("%s: it kept changing while its own holder marked it failed", subject)
}

// Recover runs the recovery procedure (Conn.Recover) under this lock, for
// what the holder it was taken from left behind.
func (l *Lock) Recover(ctx context.Context, p Procedure) (Outcome, error) {
	p.Release, p.Namespace = l.release, l.namespace
	p.Lock = l.Previous()
	p.Writer = l
	out, err := l.conn.Recover(ctx, p)
	if err == nil && out.Decision.Verdict != recovery.Blocked {
		l.mu.Lock()
		l.handOn = false
		l.mu.Unlock()
	}
	return out, err
}

// IsLocked reports whether err says another live client holds the lock.
func IsLocked(err error) (*lock.LockedError, bool) {
	var le *lock.LockedError
	if errors.As(err, &le) {
		return le, true
	}
	return nil, false
}

// Hold renews the lock while the caller works under it (a lock command, the
// controller's recovery); the function it returns stops renewing and
// releases the lock, within 10 s of the fence's drain even when ctx has
// ended. It returns the
// release's error, nil for a lock already lost (it is not written: it runs
// out by itself).
func (l *Lock) Hold(ctx context.Context) (release func() error) {
	keepCtx, stopKeep := context.WithCancel(ctx)
	go l.Keep(keepCtx, func(error) {})
	return func() error {
		stopKeep()
		var err error
		l.End(ctx, Guarded{Released: func(e error) { err = e }}, nil)
		return err
	}
}
