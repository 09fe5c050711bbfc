package lock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
	"github.com/helm-autorecover/helm-autorecover/internal/version"
)

// DefaultLeaseDuration is the lease of a lock when the request sets none.
// The holder renews every third of it.
const DefaultLeaseDuration = 15 * time.Second

// MaxLeaseDuration bounds a lock's lease: a holder that dies keeps the
// release locked for one lease, and a longer one buys nothing a renewal
// every third of it does not (a process frozen longer than that loses its
// lock and stops before it writes again).
const MaxLeaseDuration = 10 * time.Minute

// maxConflicts bounds how often one call re-reads the Lease after a write
// conflict before giving up; every conflict means another client made
// progress, so hitting it means heavy contention, not a livelock.
const maxConflicts = 50

// Request describes the operation that wants a release's lock.
type Request struct {
	Release   string
	Namespace string
	Operation Operation
	// Revision is the revision the operation will write, when known; see
	// part.SetRevision.
	Revision int
	// onConfirm, when set, is told when TryAcquire waits for an expired
	// lock to be confirmed (see Confirm): the holder, and for how long.
	onConfirm func(holder *Record, in time.Duration)
	// sightLater, when set, reads the lock's later parts (Acquire)
	// whenever this part is found held by another session while the
	// client waits, or waiting to be confirmed, so that their
	// confirmations run alongside this one's rather than after it: a
	// dead holder's Lease is seen unchanged from the first read on, not
	// from the moment its gate's expiry is due (the simulation, seed 370,
	// found a joint lock recovered two leases after the kill). A free
	// part reads nothing more.
	sightLater func(ctx context.Context)
	// nextRevision is the revision a part taken first (Acquire) found
	// the operation will write, for the parts after it (see nextRevision).
	nextRevision int
	// arrived, when set (TryAcquire, after its first read), holds the
	// sessions queued when this client first read the lock: only they
	// came before it. A waiter that queued while this client waited for
	// an expired lock to be confirmed came after it, and is not ahead of
	// it (the simulation, seeds 1280, 1790, 2254, 2534, 4828: a client
	// that does not wait was refused for a waiter that arrived seconds
	// after it). Told by what this client read, not by comparing clocks.
	arrived map[string]bool
	// Timeout is the operation's --timeout, recorded for humans.
	Timeout time.Duration
	// LeaseDuration defaults to DefaultLeaseDuration and must exceed twice
	// the backend's margin.
	LeaseDuration time.Duration
	// MaxHold, when positive, bounds how long the lock is held: the holder
	// stops renewing and is told to abort (ErrMaxHold) once it has held the
	// lock that long.
	MaxHold time.Duration
	// Session defaults to NewSession(); Who to DefaultWho(); PID to this
	// process; ToolVersion to this build; CIJobURL to DetectCIJobURL.
	Session     string
	Who         string
	PID         int
	ToolVersion string
	CIJobURL    string
	// Backend is the --lock-backend the holder chose, recorded for humans.
	Backend string
	// Preempt, while waiting, marks this client's queue entry as a request
	// that the holder stop (Waiter.Preempt). It changes nothing else: the
	// client still waits in arrival order and takes the lock only once it
	// is Free or Expired.
	Preempt bool
}

// Backend runs the lock protocol (acquire, renew, wait in arrival order,
// release, inspect) over one store (Store): coordination.k8s.io/v1 Leases
// (package leasestore), the release's own records (package releasestore),
// or the sql driver's lock rows (package sqlstore). The
// protocol, its time rules and its conditional writes are the same for all;
// each store reads a lock into a Snapshot and writes it conditionally on
// one.
type Backend struct {
	client kubernetes.Interface
	time   *servertime.Estimator
	clock  clock.Clock
	// kind is where the locks are kept; stores opens that store in a
	// namespace.
	kind   StoreKind
	stores func(ns string) Store
	// Margin is added to another holder's LOCKED TILL before this backend
	// takes over (TakeoverMargin unless set before first use).
	Margin time.Duration
	// RenewMargin is taken off this backend's own renew deadline
	// (RenewMargin unless set before first use).
	RenewMargin time.Duration
	// Sightings remembers when this process first saw each lock's latest
	// renewal (see Confirm). The constructors give each backend its own;
	// set a shared one before first use so that every backend of a
	// process, and each operation's, remembers alike.
	Sightings *Sightings
	// TrustServerTime judges locks by server time alone, without Confirm:
	// only for tests whose fake clocks stand still.
	TrustServerTime bool
}

// StoreKind names where a backend keeps its locks.
type StoreKind string

// The stores.
const (
	// StoreLease: a coordination.k8s.io/v1 Lease per release.
	StoreLease StoreKind = "lease"
	// StoreRelease: an annotation on the release's latest storage record
	// (helm's Secret or ConfigMap of the newest revision).
	StoreRelease StoreKind = "release"
	// StoreSQL: a row per release in helm's sql database, beside helm's
	// release rows (package sqlstore). It holds a Lease's fields and is
	// judged as a Lease is; the database refuses helm's writes made for a
	// session that does not hold it.
	StoreSQL StoreKind = "sql"
)

// NewBackend returns a backend that keeps its locks in the stores of kind
// that stores opens, one per namespace (package leasestore and
// releasestore build them). client must be built from a configuration
// instrumented by est (servertime.Estimator.Instrument or WrapTransport)
// so that its responses feed est, whatever the store: every client of a
// release talks to its cluster, whose clock judges the lock; clk must be
// the clock est reads (clock.RealClock{} in production).
func NewBackend(client kubernetes.Interface, est *servertime.Estimator, clk clock.Clock, kind StoreKind, stores func(ns string) Store) *Backend {
	return &Backend{
		client: client, time: est, clock: clk, Margin: TakeoverMargin, RenewMargin: RenewMargin, kind: kind,
		Sightings: NewSightings(), stores: stores,
	}
}

// Kind tells where this backend keeps its locks.
func (b *Backend) Kind() StoreKind { return b.kind }

func (b *Backend) margin() time.Duration {
	if b.Margin <= 0 {
		return TakeoverMargin
	}
	return b.Margin
}

func (b *Backend) renewMargin() time.Duration {
	if b.RenewMargin <= 0 {
		return RenewMargin
	}
	return b.RenewMargin
}

func (b *Backend) store(ns string) Store {
	return b.stores(ns)
}

// serverNow returns the server-time bounds, syncing once if nothing has been
// observed yet.
func (b *Backend) serverNow(ctx context.Context) (servertime.Bounds, error) {
	if now, ok := b.time.Now(); ok {
		return now, nil
	}
	if err := b.time.Sync(ctx, b.client.Discovery()); err != nil {
		return servertime.Bounds{}, err
	}
	now, _ := b.time.Now()
	return now, nil
}

// complete fills the defaults of req and validates it.
func (b *Backend) complete(req Request) (Request, error) {
	if err := ValidateReleaseName(req.Release); err != nil {
		return req, fmt.Errorf("lock release %q in namespace %q: %w", req.Release, req.Namespace, err)
	}
	if req.Namespace == "" {
		return req, fmt.Errorf("lock release %q: namespace is empty", req.Release)
	}
	if !req.Operation.valid() {
		return req, fmt.Errorf("lock release %q in namespace %q: unknown operation %q", req.Release, req.Namespace, req.Operation)
	}
	if req.LeaseDuration == 0 {
		req.LeaseDuration = DefaultLeaseDuration
	}
	if req.LeaseDuration <= 2*b.renewMargin() {
		return req, fmt.Errorf("lock release %q in namespace %q: lease duration %s must be longer than %s (twice the renew margin)", req.Release, req.Namespace, req.LeaseDuration, 2*b.renewMargin())
	}
	if req.LeaseDuration > MaxLeaseDuration {
		return req, fmt.Errorf("lock release %q in namespace %q: lease duration %s must be at most %s (a holder that dies keeps the release locked for one lease)", req.Release, req.Namespace, req.LeaseDuration, MaxLeaseDuration)
	}
	if req.Session == "" {
		req.Session = NewSession()
	}
	if req.Who == "" {
		req.Who = DefaultWho()
	}
	if req.PID == 0 {
		req.PID = os.Getpid()
	}
	if req.ToolVersion == "" {
		req.ToolVersion = version.Version
	}
	if req.CIJobURL == "" {
		req.CIJobURL = DetectCIJobURL(os.Getenv)
	}
	return req, nil
}

// TryAcquire takes the release's lock if it is Free or Expired and no live
// waiter is queued first. When a live holder has it, it returns that holder's
// record (nil if unreadable) and a *LockedError; it never waits.
//
// A takeover of an Expired lock is reported in part.PreviousState and
// part.Previous, so the caller can recover the revision the previous holder
// abandoned.
func (b *Backend) TryAcquire(ctx context.Context, req Request) (*part, *Record, error) {
	req, err := b.complete(req)
	if err != nil {
		return nil, nil, err
	}
	maybe := &maybeTaken{}
	res, err := b.attempt(ctx, &req, nil, maybe)
	if err == nil && res.seen != nil {
		req.arrived = map[string]bool{}
		for _, w := range res.seen.Queue {
			req.arrived[w.Session] = true
		}
	}
	if err == nil && res.locked != nil && b.Settled(ctx, res.locked.State, res.locked.LockedTill) {
		// The holder's lock had already expired; the first look could not
		// tell yet.
		res, err = b.attempt(ctx, &req, nil, maybe)
	}
	if err == nil && res.locked != nil && res.locked.awaitsConfirmation() && res.locked.Ahead == 0 {
		res, err = b.confirmTake(ctx, &req, res, maybe)
	}
	if err != nil {
		return nil, nil, err
	}
	if res.locked != nil {
		return nil, res.locked.Holder, res.locked
	}
	return res.held, nil, nil
}

// confirmTake is TryAcquire's wait for a lock Expired in server time, or
// live there only by a LOCKED TILL stamped ahead of it (StampedAhead), to
// be confirmed on this process's clock (Confirm): it reads the lock again
// every third of a lease until then, and takes it once confirmed. A
// renewal seen meanwhile shows the holder alive, whatever the Date headers
// say: the lock is refused at once then, as any live lock is. Without it,
// a client that does not wait was refused by a dead holder whose Date
// headers ran 30 s ahead until the server's clock caught up with its
// stamp (the simulation, seed 95473).
func (b *Backend) confirmTake(ctx context.Context, req *Request, res attemptResult, maybe *maybeTaken) (attemptResult, error) {
	if req.onConfirm != nil {
		req.onConfirm(res.locked.Holder, res.locked.Left)
	}
	for res.locked != nil && res.locked.awaitsConfirmation() {
		at := res.locked.confirmAt
		step := min(at.Sub(b.clock.Now()), max(req.LeaseDuration/3, time.Second))
		if err := b.sleep(ctx, step); err != nil {
			return attemptResult{}, fmt.Errorf("lock release %q in namespace %q: %w", req.Release, req.Namespace, err)
		}
		next, err := b.attempt(ctx, req, nil, maybe)
		if err != nil {
			return attemptResult{}, err
		}
		// A renewal restarts the count from when it was first seen:
		// confirmAt less the stamp's uncertainty (a renewal stamped
		// with a narrower estimate than the take may otherwise move
		// confirmAt back, and a live holder would be waited for as
		// long as it renews).
		if next.locked != nil && next.locked.awaitsConfirmation() && next.locked.seenFrom().After(res.locked.seenFrom()) {
			next.locked.Renewing = true
			return next, nil
		}
		res = next
	}
	return res, nil
}

// sleep waits d on the backend's clock, or until ctx ends.
func (b *Backend) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := b.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C():
		return nil
	}
}

// Settled is for a lock judged Live only because this process's estimate of
// server time is still too wide to tell (a fresh process knows it to about a
// second): it waits until the estimate can tell, at most that width (see
// servertime.Estimator.Settle), and reports whether the lock expiring at
// lockedTill has by then certainly expired, so that reading it again will
// judge it Expired. It returns false at once for any other lock, and when
// the wait fails. Without it, a client asking just after a lock expired
// could be refused although another, luckier one would not.
func (b *Backend) Settled(ctx context.Context, state State, lockedTill time.Time) bool {
	if state != Live || lockedTill.IsZero() {
		return false
	}
	expiry := lockedTill.Add(b.margin())
	now, ok := b.time.Now()
	if !ok || !now.Latest.After(expiry) || now.Earliest.After(expiry) {
		// Not expired yet, or already certainly: a lock Live then is
		// waiting to be confirmed (Confirm), which no estimate speeds.
		return false
	}
	past, err := b.time.Settle(ctx, b.clock, expiry, b.time.ProbeFunc(b.client.Discovery()))
	return err == nil && past
}

// view is a snapshot of the lock as judged by one client.
type view struct {
	snap   *Snapshot
	rec    *Record
	recErr error
	state  State
	live   []Waiter
	// queue is what a write of the queue keeps: live, and the entries
	// expired in server time that this process has not seen unchanged
	// for their lease (judgeWaiters).
	queue []Waiter
	// confirmAt is, on this process's clock, when the judgement of a held
	// lock by its own elapsed time will change unless the lock does
	// (Confirm); zero when it will not.
	confirmAt time.Time
	// confirming is set when the lock is Expired in server time but not
	// yet confirmed (Confirm): it is Live until confirmAt.
	confirming bool
	// stampedAhead is set when the lock is Live in server time only by
	// a LOCKED TILL further ahead of this process's upper bound of the
	// server's clock than its holder could have stamped through Date
	// headers that agree with ours (stampedAhead): its holder's ran ahead,
	// or ours run behind, and only its confirmation on this process's
	// clock, at confirmAt, tells whether it has stopped.
	stampedAhead bool
	// uncertain is, for a lock live in server time, the uncertainty of its
	// stamp that Confirm counted in confirmAt: it is also taken once
	// Expired in server time and seen for that much less (takeoverIn).
	uncertain time.Duration
	// claim is another session's claim in flight on a release lock's beat
	// (see package releasestore): the lock is Live, held by it, until it lands on the
	// gate or expires.
	claim *Record
}

// decode judges l for the client of session self ("" for a reader that
// takes nothing).
func (b *Backend) decode(l *Snapshot, now servertime.Bounds, self string) view {
	v := view{snap: l, rec: l.Record, recErr: l.RecordErr}
	judged := v.rec
	if v.recErr != nil {
		judged = nil
	}
	v.state = Judge(judged, &l.Spec, now, b.margin())
	v.confirmAt = b.confirm(&v, judged, l, self, now)
	gateSession := ""
	if v.rec != nil {
		gateSession = v.rec.Session
	}
	// A claim counts only while it is against the gate as it stands: a beat
	// left by an earlier holder, or by a claim that lost, names another
	// gate than the current one. It is judged as a holder is (Confirm),
	// whatever the gate's state, so that its confirmation runs while the
	// gate's does.
	if c := claimOf(l); c != nil && c.Session != self && c.ReleasedAt.IsZero() &&
		l.Claim.From == gateSession && claimAgainstGate(l) {
		cc := b.confirmClaim(l, c, now)
		switch st, at := cc.state, cc.at; {
		case v.state != Live && st == Live:
			v.state, v.claim, v.confirmAt, v.confirming, v.uncertain = Live, c, at, cc.confirming, cc.uncertain
		case v.confirming && st == Live && at.After(v.confirmAt):
			// The gate's holder and the claim both wait to be confirmed:
			// the lock is free once both are, so the later time is when
			// its judgement changes (a take waiting for it does not
			// take the claim's time for a renewal of the holder).
			v.confirmAt = at
		}
	} else if b.Sightings != nil {
		b.Sightings.forgetClaim(b.sightKey(l.Namespace, l.Name))
	}
	v.live, v.queue = b.judgeWaiters(l, l.Queue, now, self)
	return v
}

// confirmClaim judges another session's claim in flight on a release
// lock's beat as confirm judges a holder: by server time, then by how long
// this process has seen the claim unchanged (Confirm), since its writer,
// like any holder, stops writing a lease after it sent it. It returns the
// confirmation (see confirmSeen).
func (b *Backend) confirmClaim(l *Snapshot, c *Record, now servertime.Bounds) confirmation {
	st := Live
	if !now.IsZero() && now.Earliest.After(c.LockedTill.Add(b.margin())) {
		st = Expired
	}
	if b.TrustServerTime || b.clock == nil || b.Sightings == nil {
		return confirmation{state: st}
	}
	lease := c.LeaseDuration.Duration
	if lease <= 0 {
		lease = DefaultLeaseDuration
	}
	s := Sighting{Lease: lease, Bounded: bounded(c, c.Session, c.RenewedAt, c.LockedTill, lease), Uncertain: uncertainty(c, c.Session)}
	return b.confirmSeen(b.sightKey(l.Namespace, l.Name)+claimSight, c.Session, c.RenewedAt, c.LockedTill, st, s)
}

// confirmSeen remembers, under key, that this process read the lock (or a
// claim) held as seenAs, renewed at renewed until till, and judges state
// again by how long it has seen it so (Confirm). It returns the state,
// when on this process's clock that judgement changes unless the lock does
// (zero when it will not), and whether a lock Expired in server time is
// not yet confirmed. With no clock or no Sightings the lock counts as
// first seen now.
func (b *Backend) confirmSeen(key, seenAs string, renewed, till time.Time, state State, s Sighting) confirmation {
	var localNow time.Time
	if b.clock != nil && b.Sightings != nil {
		// One reading of the clock: the moment judged, and what the
		// confirmation is counted from, so that the time returned is the
		// same on every read of an unchanged lock (confirmTake tells a
		// renewal by it moving).
		localNow = b.clock.Now()
		s.SeenFor = localNow.Sub(b.Sightings.mark(key, seenAs, renewed, till, localNow))
	}
	st, in := Confirm(state, s, b.margin())
	c := confirmation{state: st, confirming: state == Expired && st == Live, seenFor: s.SeenFor}
	if in > 0 && !localNow.IsZero() {
		c.at = localNow.Add(in)
		if state == Live && s.Bounded {
			c.uncertain = liveUncertainty(s)
		}
	}
	return c
}

// confirmation is what confirmSeen returns: the state, when on this
// process's clock that judgement changes unless the lock does (zero when
// it will not), whether a lock Expired in server time is not yet
// confirmed, and, for a lock live in server time, the uncertainty of its
// stamp that Confirm counted in at (see takeoverIn).
type confirmation struct {
	state      State
	at         time.Time
	confirming bool
	uncertain  time.Duration
	// seenFor is how long this process has seen the lock so (Sighting).
	seenFor time.Duration
}

// judgeWaiters returns the entries of queue ws that come before a take
// (live: not expired in server time, liveWaiters) and those a write of
// the queue keeps, in order. An entry this process has seen unchanged for
// its waiter's lease and the margin is dropped from both
// (waiterStopped): one written through a Date header running ahead would
// otherwise hold the queue for the difference after its waiter died.
// self's own entry is never dropped so: it refreshes it.
//
// An entry expired in server time alone is skipped, not dropped: its
// stamps are its waiter's estimate of server time, and a waiter whose
// Date headers run behind stamps its entries that far in the past. Dropped
// from every queue another waiter wrote, it lost its place in arrival
// order at each of their writes and queued anew behind them, waiting for
// whoever came after it (the simulation, seeds 4160 and 19421: a waiter
// whose Date ran 30 s behind waited 30.8 s for a lock expired since it
// queued, behind a later waiter that went to sleep). Kept, it keeps its
// place; both may find the lock theirs to take, and the take, a
// conditional write, decides. A dead waiter's entry goes at the first
// write of a process that has seen it unchanged for its lease.
func (b *Backend) judgeWaiters(l *Snapshot, ws []Waiter, now servertime.Bounds, self string) (live, queue []Waiter) {
	live = liveWaiters(ws, now, b.margin())
	if b.TrustServerTime || b.clock == nil || b.Sightings == nil {
		return live, live
	}
	localNow := b.clock.Now()
	since := b.Sightings.queue(b.sightKey(l.Namespace, l.Name), ws, localNow)
	live = live[:0:0]
	for i, w := range ws {
		if w.Session != self && waiterStopped(w, localNow.Sub(since[i]), b.margin()) {
			continue
		}
		isLive := len(liveWaiters(ws[i:i+1], now, b.margin())) > 0
		if !isLive && !leaseKnown(w) {
			// An entry of unknown lease (its waiter wrote no heartbeat
			// time) is judged by server time alone: never seen stopped,
			// it would be kept for ever (found by review).
			continue
		}
		queue = append(queue, w)
		if isLive {
			live = append(live, w)
		}
	}
	return live, queue
}

// confirm applies Confirm to the judgement of l in v: it remembers the
// holder's latest renewal in the backend's Sightings, judges the lock again
// by how long this process has seen it unchanged, and returns when, on this
// process's clock, that judgement will change unless the lock does (zero
// when it will not). v.confirming is set for a lock Expired in server time
// but not yet confirmed. A lock held by self (our own take whose answer was
// lost) is judged in server time alone: this process knows it is not
// writing.
func (b *Backend) confirm(v *view, judged *Record, l *Snapshot, self string, now servertime.Bounds) time.Time {
	key := b.sightKey(l.Namespace, l.Name)
	holder, renewed := RenewalOf(l)
	if v.state == Free || holder == "" {
		if b.Sightings != nil {
			b.Sightings.forget(key)
		}
		return time.Time{}
	}
	if holder == self || b.TrustServerTime {
		return time.Time{}
	}
	till, _ := LockedTill(judged, &l.Spec)
	lease := leaseOf(judged, &l.Spec)
	// A gate whose beat says nothing of its holder is bounded by the
	// holder's lease on this clock: a live holder's next renewal writes
	// its beat back, which changes the lock as seen here. Found by the
	// simulation (seed 439): the loser of a first install's race left its
	// beat over the winner's, the winner stopped, and its gate was judged
	// by the 24 h bound.
	silent := l.Silent && judged != nil && judged.Session == holder && judged.LeaseDuration.Duration > 0
	s := Sighting{Lease: lease, Bounded: silent || bounded(judged, holder, renewed, till, lease), Uncertain: uncertainty(judged, holder)}
	seenAs := holder
	if silent {
		// Seen unchanged means the beat's heartbeat unchanged too: a
		// holder's renewal that a third client's heartbeat then hid (the
		// loser of a first install's race) must still start the count
		// anew (found by review). The queue is not part of it: a waiter's
		// own refreshes must not restart its count (the simulation, seed
		// 414). A beat deleted twice in a row shows as missing both times
		// (docs/protocol.md, "Residual risks").
		claim, from := "", ""
		if l.Claim != nil {
			claim, from = l.Claim.Encoded, l.Claim.From
		}
		seenAs += "\x00beat@" + claim + "@" + from
	}
	state := v.state
	if silent && state == Live && !now.IsZero() && now.Earliest.After(judged.RenewedAt.Add(judged.LeaseDuration.Duration+b.margin())) {
		// A silent gate is judged by the long bound it was written with
		// in server time, but its holder, if alive, writes its beat back
		// within a third of its lease: past its own renewedAt + lease in
		// server time it is Expired there too, to be confirmed on this
		// process's clock like any expired lock (seen unchanged, its
		// beat included, for a lease and the margin). A client that
		// does not wait then waits for that confirmation (confirmTake)
		// instead of being refused for 24 hours (the simulation, seed
		// 170: a first install's holder that never wrote its beat and
		// stopped); a waiter took it after that confirmation already.
		state = Expired
	}
	c := b.confirmSeen(key, seenAs, renewed, till, state, s)
	v.state, v.confirming, v.uncertain = c.state, c.confirming, c.uncertain
	s.SeenFor = c.seenFor
	v.stampedAhead = c.state == Live && state == Live && !c.at.IsZero() && stampedAhead(till, now, s, b.margin())
	return c.at
}

// bounded tells whether the lock held by holder, renewed at renewed until
// till, is bounded for Confirm: its own readable record (a Lease's, or a
// gate with its beat merged in) says LOCKED TILL is one lease after its
// renewal, and so does the whole judgement. A lock judged from its spec
// alone (a record of a newer schema, none at all) or by the long bound a
// gate carries for earlier versions is not.
func bounded(rec *Record, holder string, renewed, till time.Time, lease time.Duration) bool {
	if rec == nil || rec.Session != holder || rec.LeaseDuration.Duration <= 0 || rec.RenewedAt.IsZero() || renewed.IsZero() || till.IsZero() {
		return false
	}
	return !rec.LockedTill.After(rec.RenewedAt.Add(rec.LeaseDuration.Duration)) && !till.After(renewed.Add(lease))
}

// claimOf is the beat of a release lock that names another session than
// the gate's holder, or was marked released (nil when none).
func claimOf(l *Snapshot) *Record {
	if l.Claim == nil {
		return nil
	}
	return l.Claim.Record
}

// waitState is a waiter's memory between attempts.
type waitState struct {
	enqueuedAt time.Time // server time of the first enqueue
	lastBeat   time.Time // local time of the last successful queue write's send
	// maybe remembers takes whose answer was lost.
	maybe maybeTaken
}

type attemptResult struct {
	held   *part
	locked *LockedError
	// seen is the lock as last read or written; a waiter watches from it.
	seen *Snapshot
}

// attempt makes one decision on fresh data: take the lock, or report who has
// it (and, for a waiter, make sure it is queued and its entry fresh).
//
// A take whose answer was lost (a timeout, a 5xx) may have committed: maybe
// remembers it, the lock is read again at once, and a lock found held by
// our own session is adopted (see adopt), never waited for.
func (b *Backend) attempt(ctx context.Context, req *Request, w *waitState, maybe *maybeTaken) (attemptResult, error) {
	name := LeaseName(req.Release)
	reread := false
	retry := func(err error) bool {
		if errors.Is(err, errMaybeCommitted) && !reread {
			reread = true
			return true
		}
		return false
	}
	for range maxConflicts {
		if err := ctx.Err(); err != nil {
			return attemptResult{}, fmt.Errorf("lock release %q in namespace %q: %w", req.Release, req.Namespace, err)
		}
		cur, err := b.store(req.Namespace).Read(ctx, name)
		if apierrors.IsNotFound(err) {
			h, err := b.create(ctx, req, maybe)
			if apierrors.IsAlreadyExists(err) || retry(err) || errors.Is(err, errLate) {
				continue
			}
			if err != nil {
				return attemptResult{}, err
			}
			return attemptResult{held: h, seen: h.snap}, nil
		}
		if err != nil {
			return attemptResult{}, fmt.Errorf("lock release %q in namespace %q: read %s: %w", req.Release, req.Namespace, b.object(name), err)
		}
		now, err := b.serverNow(ctx)
		if err != nil {
			return attemptResult{}, fmt.Errorf("lock release %q in namespace %q: %w", req.Release, req.Namespace, err)
		}
		v := b.decode(cur, now, req.Session)
		live := v.live
		if req.arrived != nil {
			live = slices.DeleteFunc(slices.Clone(live), func(w Waiter) bool { return !req.arrived[w.Session] })
		}
		ahead := waitersAhead(live, req.Session)
		// While this part keeps us waiting (a holder, or waiters ahead of
		// us, dead ones included), the later parts are read too, so that
		// a dead holder's expiry there is confirmed meanwhile, not only
		// once this part is ours (seeds 92122, 96108); so is a holder's
		// stamped ahead (StampedAhead) that a client that does not wait
		// confirms (review of 0eec072: one confirmation per part).
		if req.sightLater != nil && HolderOf(&cur.Spec) != req.Session && (v.confirming || v.stampedAhead || v.state == Expired || (w != nil && (v.state == Live || ahead > 0))) {
			req.sightLater(ctx)
		}
		// Our own lock whose take may have committed is adopted while it is
		// live; once expired it is taken again only in its turn, as any
		// expired lock is (waiters that queued meanwhile come first).
		if maybe.any() && HolderOf(&cur.Spec) == req.Session && (v.state == Live || ahead == 0) {
			h, err := b.adopt(ctx, req, v, now, maybe)
			if changed(err) || retry(err) || errors.Is(err, errLate) {
				continue
			}
			if err != nil {
				return attemptResult{}, err
			}
			return attemptResult{held: h, seen: h.snap}, nil
		}
		if v.state != Live && ahead == 0 {
			h, err := b.take(ctx, req, v, maybe)
			if changed(err) || retry(err) || errors.Is(err, errLate) {
				continue
			}
			if err != nil {
				return attemptResult{}, err
			}
			return attemptResult{held: h, seen: h.snap}, nil
		}
		locked := b.lockedError(req, v, now, ahead)
		if w == nil {
			return attemptResult{locked: locked, seen: cur}, nil
		}
		seen, err := b.enqueue(ctx, req, w, v)
		if changed(err) {
			continue
		}
		if err != nil {
			return attemptResult{}, err
		}
		return attemptResult{locked: locked, seen: seen}, nil
	}
	return attemptResult{}, fmt.Errorf("lock release %q in namespace %q: %s changed %d times while deciding; retry", req.Release, req.Namespace, b.object(name), maxConflicts)
}

// changed reports a write that found the lock changed since it was read:
// updated (a conflict) or deleted (its holder released it by deleting it,
// after an uninstall or an operation on a release that does not exist).
// The caller reads it again and decides anew.
func changed(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsNotFound(err)
}

func (b *Backend) lockedError(req *Request, v view, now servertime.Bounds, ahead int) *LockedError {
	e := &LockedError{
		Release:        req.Release,
		Namespace:      req.Namespace,
		State:          v.state,
		HolderIdentity: HolderOf(&v.snap.Spec),
		Ahead:          ahead,
	}
	if v.state != Live {
		return e
	}
	if c := v.claim; c != nil {
		e.HolderIdentity, e.Holder, e.LockedTill = c.Session, c, c.LockedTill
		e.confirmAt, e.Confirming, e.uncertain = v.confirmAt, v.confirming, v.uncertain
		e.Left = b.takeoverIn(e.LockedTill, e.confirmAt, e.uncertain, now)
		return e
	}
	e.StampedAhead = v.stampedAhead
	if v.recErr == nil && v.rec != nil && v.rec.Session == e.HolderIdentity {
		e.Holder = v.rec
	}
	var judged *Record
	if e.Holder != nil {
		judged = v.rec
	}
	if till, ok := LockedTill(judged, &v.snap.Spec); ok {
		e.LockedTill = till
	}
	e.confirmAt, e.Confirming, e.uncertain = v.confirmAt, v.confirming, v.uncertain
	e.Left = b.takeoverIn(e.LockedTill, e.confirmAt, e.uncertain, now)
	return e
}

// takeoverIn is how long from now until this client takes over a lock
// held until lockedTill unless its holder renews it: the moment this
// process's own clock confirms it (confirmAt, Confirm: a lock seen
// unchanged for a lease and the margin) when that is known, which is when
// the take happens whatever the API server's clock says; otherwise when the
// API server's clock certainly passes lockedTill and the margin. Every
// message and countdown that announces a takeover says this one time, so
// that none announces a moment the tool will not act at.
func (b *Backend) takeoverIn(lockedTill, confirmAt time.Time, uncertain time.Duration, now servertime.Bounds) time.Duration {
	if !confirmAt.IsZero() && b.clock != nil {
		in := max(0, confirmAt.Sub(b.clock.Now()))
		if uncertain > 0 && !lockedTill.IsZero() && !now.IsZero() {
			// Live in server time: confirmAt counts the uncertainty of
			// its stamp in; once Expired there, a lock is taken after a
			// lease and the margin seen, which is that much sooner.
			in = min(in, max(b.expiresIn(lockedTill, now), in-uncertain))
		}
		return in
	}
	return b.expiresIn(lockedTill, now)
}

// expiresIn is how long until the lower bound of the server's clock, now,
// passes lockedTill and the margin: a lock held till then is Expired in
// server time from then on. Zero when it has, or cannot be told.
func (b *Backend) expiresIn(lockedTill time.Time, now servertime.Bounds) time.Duration {
	if lockedTill.IsZero() || now.IsZero() {
		return 0
	}
	return max(0, lockedTill.Add(b.margin()).Sub(now.Earliest))
}

// stamp fills the time fields of a record written now. All of them come from
// the upper bound of server time, so LockedTill is never early, except
// RenewedAfter, the lower bound: how early the write may have been sent.
// The upper bound can shrink as the estimate narrows; a renewal never stamps
// a time before the record's previous ones (a later LockedTill only makes
// others wait longer, never shorter), and stamps at least a millisecond after
// the previous renewal, so every write of one holder has its own RenewedAt
// and an older copy of its record is told from the current one (see
// part.vanished).
func stamp(rec *Record, now servertime.Bounds) {
	t := ceilMilli(now.Latest)
	if !rec.RenewedAt.IsZero() && !t.After(rec.RenewedAt) {
		t = rec.RenewedAt.Add(time.Millisecond)
	}
	if t.Before(rec.AcquiredAt) {
		t = rec.AcquiredAt
	}
	rec.RenewedAt = t
	rec.LockedTill = t.Add(rec.LeaseDuration.Duration)
	rec.RenewedAfter = now.Earliest.Truncate(time.Millisecond).UTC()
	if rec.RenewedAfter.After(t) {
		rec.RenewedAfter = t
	}
}

func ceilMilli(t time.Time) time.Time {
	r := t.Truncate(time.Millisecond)
	if r.Before(t) {
		r = r.Add(time.Millisecond)
	}
	return r.UTC()
}

// SettledStatus reports whether a release revision with helm status
// status is settled: deployed, failed, superseded or uninstalled, no
// operation writing it. Pending statuses, uninstalling, unknown and none
// are not.
func SettledStatus(status string) bool {
	switch status {
	case "deployed", "failed", "superseded", "uninstalled":
		return true
	}
	return false
}

// nextRevision is the revision req's operation will write, as the lock
// (the newest record it was read on) shows it before any recovery:
// on a record lock, the one after the newest record's as this take read
// it, when that record is settled (deployed, failed, superseded,
// uninstalled: no operation is writing it); on a Lease, which shows no
// record, req's hint (Request.nextRevision, from the record lock taken
// just before). 0 when unknown: an uninstall or a recovery writes no new
// revision, and a pending newest record may be recovered first (the
// holder names its revision once it knows it).
func nextRevision(req *Request, newest *Newest) int {
	switch req.Operation {
	case OpInstall, OpUpgrade, OpRollback:
	default:
		return 0
	}
	if newest == nil {
		// A Lease shows no record: the hint of the record lock taken
		// just before, in the same Acquire, if any.
		return req.nextRevision
	}
	if !SettledStatus(newest.Status) {
		return 0
	}
	n := newest.Revision
	if n <= 0 || n == math.MaxInt {
		// No next revision to name (the one after the largest int
		// would be negative).
		return 0
	}
	return n + 1
}

func newRecord(req *Request, now servertime.Bounds) Record {
	rec := Record{
		Schema:        SchemaVersion,
		Session:       req.Session,
		Operation:     req.Operation,
		Release:       req.Release,
		Namespace:     req.Namespace,
		Revision:      req.Revision,
		Who:           req.Who,
		PID:           req.PID,
		ToolVersion:   req.ToolVersion,
		CIJobURL:      req.CIJobURL,
		Backend:       req.Backend,
		Timeout:       metav1.Duration{Duration: req.Timeout},
		LeaseDuration: metav1.Duration{Duration: req.LeaseDuration},
	}
	stamp(&rec, now)
	rec.AcquiredAt = rec.RenewedAt
	if req.MaxHold > 0 {
		rec.MaxHoldUntil = rec.AcquiredAt.Add(req.MaxHold)
	}
	return rec
}

func ptr[T any](v T) *T { return &v }

// create makes the Lease with the caller as holder. It fails with
// AlreadyExists when someone else created it first. A failure that leaves
// the outcome unknown is noted in maybe.
func (b *Backend) create(ctx context.Context, req *Request, maybe *maybeTaken) (*part, error) {
	sent := b.clock.Now()
	now, err := b.serverNow(ctx)
	if err != nil {
		return nil, fmt.Errorf("lock release %q in namespace %q: %w", req.Release, req.Namespace, err)
	}
	rec := newRecord(req, now)
	if rec.Revision == 0 {
		rec.Revision = nextRevision(req, nil)
		if b.kind == StoreRelease && rec.Revision == 0 && (req.Operation == OpInstall || req.Operation == OpUpgrade) {
			// The release has no record: the operation writes its first
			// revision, named now (part.SetRevision then writes nothing).
			rec.Revision = 1
		}
	}
	name := LeaseName(req.Release)
	h := b.newHeld(req, nil, rec, sent, nil, Free)
	wctx, cancel, late := b.takeFence(ctx, h) // as take's
	defer cancel()
	if err := Fenced(wctx); err != nil {
		return nil, late(err)
	}
	created, err := b.store(req.Namespace).Create(wctx, name, rec)
	if err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, err
		}
		if err := late(err); errors.Is(err, errLate) {
			return nil, err
		}
		err = maybe.note(err, maybeWrite{sent: sent, rec: rec, prevState: Free})
		return nil, fmt.Errorf("lock release %q in namespace %q: create %s: %w", req.Release, req.Namespace, b.object(name), err)
	}
	h.snap = created
	return h, nil
}

// take updates a Free or Expired Lease to name the caller as holder,
// conditional on the resourceVersion of v. A failure that leaves the outcome
// unknown is noted in maybe.
func (b *Backend) take(ctx context.Context, req *Request, v view, maybe *maybeTaken) (*part, error) {
	sent := b.clock.Now()
	now, err := b.serverNow(ctx)
	if err != nil {
		return nil, fmt.Errorf("lock release %q in namespace %q: %w", req.Release, req.Namespace, err)
	}
	rec := newRecord(req, now)
	if v.recErr == nil {
		// Taking over from a holder that abandoned a revision: until this
		// holder recovers it (and names a revision of its own, or
		// releases), its record names that holder too, so that if it dies
		// recovering, the next client still recovers the revision at once.
		rec.Abandoned = HandedOn(v.rec, v.state)
	}
	if rec.Revision == 0 && rec.Abandoned == nil {
		// Nothing to recover: the revision the operation writes is known
		// now, and named in the take (part.SetRevision then writes nothing).
		rec.Revision = nextRevision(req, v.snap.Newest)
	}
	rest := slices.DeleteFunc(slices.Clone(v.queue), func(w Waiter) bool { return w.Session == req.Session })
	prev := v.rec
	if v.recErr != nil {
		prev = nil
	}
	// The take is held to its own renew deadline from its first request
	// to its last: on the release store it claims the beat, then writes
	// the gate, and a gate written after the claim expired would take a
	// release someone else may have taken since (the simulation, seed
	// 302: a system sleep between the two).
	h := b.newHeld(req, nil, rec, sent, prev, v.state)
	wctx, cancel, late := b.takeFence(ctx, h)
	defer cancel()
	if err := Fenced(wctx); err != nil {
		return nil, late(err)
	}
	updated, err := b.store(req.Namespace).Take(wctx, v.snap, rec, rest)
	if err != nil {
		if apierrors.IsConflict(err) {
			return nil, err
		}
		if err := late(err); errors.Is(err, errLate) {
			return nil, err
		}
		err = maybe.note(err, maybeWrite{sent: sent, rec: rec, prev: prev, prevState: v.state})
		return nil, fmt.Errorf("lock release %q in namespace %q: update %s: %w", req.Release, req.Namespace, b.object(v.snap.Name), err)
	}
	h.snap = updated
	return h, nil
}

// errLate marks a take that stopped before one of its writes because its
// renew deadline had passed (on this process's clock, or in the API
// server's): it sent nothing more, and the caller reads the lock again and
// decides anew.
var errLate = errors.New("its renew deadline passed before its next write was sent")

// takeFence bounds the writes of a take whose lock h stands for (not yet
// stored) by h's renew deadline: each write request is checked against it
// right before it is sent (withFence), and the context ends at it, so that
// no request is sent or retried after it. late turns the error of a write
// that the check stopped into one marked errLate, and leaves any other as
// it is.
func (b *Backend) takeFence(ctx context.Context, h *part) (context.Context, context.CancelFunc, func(error) error) {
	stopped := false
	fence := func() error {
		err := h.Valid()
		if err != nil {
			stopped = true
		}
		return err
	}
	wctx, cancel := b.withDeadline(withFence(ctx, fence), h.Deadline())
	late := func(err error) error {
		if !stopped {
			return err
		}
		return fmt.Errorf("take the lock of release %q in namespace %q: %w (%w)", h.req.Release, h.req.Namespace, errLate, err)
	}
	return wctx, cancel, late
}

// enqueue makes sure the waiter has a fresh entry in the queue, writing only
// when it is missing or its heartbeat is due. It returns the lock as
// written (or as read, when nothing had to be written).
func (b *Backend) enqueue(ctx context.Context, req *Request, w *waitState, v view) (*Snapshot, error) {
	i := slices.IndexFunc(v.live, func(x Waiter) bool { return x.Session == req.Session })
	sent := b.clock.Now()
	asks := ""
	if req.Preempt {
		asks = holderAsked(v)
	}
	if i >= 0 && !w.lastBeat.IsZero() && sent.Sub(w.lastBeat) < req.LeaseDuration/3 && v.live[i].Preempt == req.Preempt && v.live[i].PreemptHolder == asks {
		return v.snap, nil
	}
	now, err := b.serverNow(ctx)
	if err != nil {
		return nil, fmt.Errorf("queue for release %q in namespace %q: %w", req.Release, req.Namespace, err)
	}
	t := ceilMilli(now.Latest)
	ws := slices.Clone(v.queue)
	i = slices.IndexFunc(ws, func(x Waiter) bool { return x.Session == req.Session })
	if i < 0 {
		if w.enqueuedAt.IsZero() {
			w.enqueuedAt = t
		}
		ws = append(ws, Waiter{Session: req.Session, Who: req.Who, Operation: req.Operation, EnqueuedAt: w.enqueuedAt, Preempt: req.Preempt})
		i = len(ws) - 1
	}
	// A waiter that asks to preempt asks the holder it sees now: each new
	// holder in turn, while it waits.
	ws[i].Preempt, ws[i].PreemptHolder = req.Preempt, asks
	ws[i].HeartbeatAt = t
	ws[i].ExpiresAt = t.Add(req.LeaseDuration)
	updated, err := b.store(req.Namespace).Enqueue(ctx, v.snap, ws)
	if err != nil {
		if apierrors.IsConflict(err) {
			return nil, err
		}
		return nil, fmt.Errorf("queue for release %q in namespace %q: update %s: %w", req.Release, req.Namespace, b.object(v.snap.Name), err)
	}
	w.lastBeat = sent
	return updated, nil
}

// holderAsked is the session a waiter that asks to preempt asks to stop:
// the lock's live holder as v judged it (a claim in flight on a release
// lock's beat is its holder-to-be), "" when none is live.
func holderAsked(v view) string {
	switch {
	case v.state != Live:
		return ""
	case v.claim != nil:
		return v.claim.Session
	case v.rec != nil:
		return v.rec.Session
	}
	return ""
}

// dequeue removes session from the queue, best effort, when a waiter gives
// up.
func (b *Backend) dequeue(ctx context.Context, req *Request) error {
	name := LeaseName(req.Release)
	for range maxConflicts {
		cur, err := b.store(req.Namespace).Read(ctx, name)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		ws := cur.Queue
		rest := slices.DeleteFunc(slices.Clone(ws), func(w Waiter) bool { return w.Session == req.Session })
		if len(rest) == len(ws) {
			return nil
		}
		_, err = b.store(req.Namespace).Enqueue(ctx, cur, rest)
		if apierrors.IsConflict(err) {
			continue
		}
		return err
	}
	return errors.New("too many conflicts")
}

// Status is what Inspect and List report about one lock.
type Status struct {
	Release   string
	Namespace string
	// Store is where this lock lives (a Lease or the release record).
	Store StoreKind
	// Object names the object the lock is stored on as kubectl does:
	// lease/NAME, or secret/NAME or configmap/NAME (the newest release
	// record). Empty when there is none.
	Object string
	// Exists is false when there is no Lease; State is then Free.
	Exists bool
	State  State
	// Record is the record on the Lease: the holder's while Live or
	// Expired, the last holder's once released. RecordErr is set when it
	// could not be read.
	Record         *Record
	RecordErr      error
	HolderIdentity string
	LockedTill     time.Time
	// ConfirmIn, when set, is how long until this process's own clock
	// judges the held lock expired unless it changes (see Confirm): it has
	// then seen it unchanged for a lease. Confirming is set when LOCKED TILL
	// has passed in server time already (State is then Expired, as shown
	// to people) but a take still waits those ConfirmIn.
	ConfirmIn  time.Duration
	Confirming bool
	// Waiters are the live queued waiters, first first.
	Waiters []Waiter
	// Now is the server time the state was judged at.
	Now servertime.Bounds
}

// Inspect reads and judges the lock of one release without changing it.
func (b *Backend) Inspect(ctx context.Context, namespace, release string) (*Status, error) {
	l, err := b.store(namespace).Read(ctx, LeaseName(release))
	if apierrors.IsNotFound(err) {
		if b.Sightings != nil {
			b.Sightings.forgetAll(b.sightKey(namespace, LeaseName(release)))
		}
		now, _ := b.time.Now()
		return &Status{Release: release, Namespace: namespace, Store: b.kind, State: Free, Now: now}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("inspect lock of release %q in namespace %q: %w", release, namespace, err)
	}
	now, err := b.serverNow(ctx)
	if err != nil {
		return nil, fmt.Errorf("inspect lock of release %q in namespace %q: %w", release, namespace, err)
	}
	return b.status(l, now), nil
}

// List reports every lock in namespace ("" for all namespaces).
func (b *Backend) List(ctx context.Context, namespace string) ([]Status, error) {
	ls, err := b.store(namespace).List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list locks %s: %w", InNamespace(namespace), err)
	}
	now, err := b.serverNow(ctx)
	if err != nil {
		return nil, fmt.Errorf("list locks %s: %w", InNamespace(namespace), err)
	}
	out := make([]Status, 0, len(ls))
	for _, l := range ls {
		out = append(out, *b.status(l, now))
	}
	return out, nil
}

func (b *Backend) status(l *Snapshot, now servertime.Bounds) *Status {
	v := b.decode(l, now, "")
	st := &Status{
		Release:        l.Release,
		Namespace:      l.Namespace,
		Store:          b.kind,
		Object:         l.Object,
		Exists:         true,
		State:          v.state,
		Record:         v.rec,
		RecordErr:      v.recErr,
		HolderIdentity: HolderOf(&l.Spec),
		Waiters:        v.live,
		Now:            now,
	}
	if !v.confirmAt.IsZero() {
		st.ConfirmIn = max(0, v.confirmAt.Sub(b.clock.Now()))
	}
	if v.confirming {
		// Shown as the API server's clock has it; a take still waits for
		// the confirmation (Confirming).
		st.State, st.Confirming = Expired, true
	}
	if st.Release == "" && v.rec != nil {
		st.Release = v.rec.Release
	}
	switch {
	case v.claim != nil:
		// Another session is taking the lock over (its claim is on the
		// beat, its gate write not yet): it is the one to wait for.
		st.HolderIdentity, st.Record, st.RecordErr, st.LockedTill = v.claim.Session, v.claim, nil, v.claim.LockedTill
	case st.HolderIdentity != "":
		judged := v.rec
		if v.recErr != nil {
			judged = nil
		}
		st.LockedTill, _ = LockedTill(judged, &l.Spec)
	}
	return st
}

// ForceRelease releases the lock of release on behalf of by (a person), but
// only while session still holds it, so a lock taken since the caller looked
// is never broken. It returns the record of the session it released. Use it
// for a holder known to be dead; the record left hands that holder on
// (Record.Abandoned), so the next client to take the lock recovers the
// revision it left pending at once, as after an expiry.
func (b *Backend) ForceRelease(ctx context.Context, namespace, release, session, by string) (*Record, error) {
	name := LeaseName(release)
	for range maxConflicts {
		cur, err := b.store(namespace).Read(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("release lock of release %q in namespace %q: %w", release, namespace, err)
		}
		if h := HolderOf(&cur.Spec); h != session {
			return nil, fmt.Errorf("release lock of release %q in namespace %q: session %s does not hold it (holder: %q)", release, namespace, session, h)
		}
		now, err := b.serverNow(ctx)
		if err != nil {
			return nil, fmt.Errorf("release lock of release %q in namespace %q: %w", release, namespace, err)
		}
		rec, recErr := DecodeRecord(cur.Raw)
		if recErr != nil || rec.Session != session {
			// Keep what can be told about the holder and mark it released.
			rec = &Record{Schema: SchemaVersion, Session: session, Release: release, Namespace: namespace}
		} else {
			// The holder is declared dead: its record is handed on
			// (Record.Abandoned), so whoever takes the lock next recovers
			// the revision it left pending at once.
			// Not Stopped: that holder may still be writing until its
			// LOCKED TILL, which recovery waits for.
			abandoned := *rec
			if p, _ := Found(rec, Expired); p != rec {
				// It was recovering what an earlier holder abandoned
				// (Found): that holder's revision is the one pending, and
				// is handed on, waiting out this holder's LOCKED TILL too
				// (found by review: handing on this holder alone lost the
				// earlier one).
				abandoned = *p
				if abandoned.Stopped {
					// That holder has stopped: only this one may still
					// write (found by review: the later of the two kept a
					// stopped holder's 24 h bound).
					abandoned.LockedTill = rec.LockedTill
				} else {
					abandoned.LockedTill = later(abandoned.LockedTill, rec.LockedTill)
				}
			}
			abandoned.Abandoned, abandoned.Stopped = nil, false
			rec.Abandoned = &abandoned
		}
		rec.ReleasedAt = ceilMilli(now.Latest)
		rec.ReleasedBy = by
		_, err = b.store(namespace).ForceRelease(ctx, cur, *rec)
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("release lock of release %q in namespace %q: %w", release, namespace, err)
		}
		return rec, nil
	}
	return nil, fmt.Errorf("release lock of release %q in namespace %q: %s changed %d times; retry", release, namespace, b.object(name), maxConflicts)
}

// InNamespace names a namespace in a message: `in namespace "x"`, or `in
// all namespaces` for "".
func InNamespace(ns string) string {
	if ns == "" {
		return "in all namespaces"
	}
	return fmt.Sprintf("in namespace %q", ns)
}

// object names the store's object called name in a message: the Lease, or,
// for the release store, the lock on the release's records (its gate on the
// newest record and its beat object of that name).
func (b *Backend) object(name string) string {
	if b.kind == StoreRelease {
		return "the lock on its release records (beat " + name + ")"
	}
	if b.kind == StoreSQL {
		return "lock row " + name
	}
	return "lease " + name
}
