package lock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

const ns = "prod"

// world is one fake API server shared by several clients, each with its own
// (possibly skewed) fake clock. True server time is t0 + elapsed.
type world struct {
	t       *testing.T
	store   *casLeases
	backend func(skew time.Duration) *client
	// dated makes a client whose server-time estimate starts from a Date
	// header shifted by dateShift, and that confirms recent expiries on its
	// own clock as in production (Confirm).
	dated func(skew, dateShift time.Duration) *client
	// datedRTT is dated with a first answer that took rtt to arrive: the
	// client's estimate starts rtt wider.
	datedRTT func(skew, dateShift, rtt time.Duration) *client
	clients  []*client
}

type client struct {
	skew time.Duration
	clk  *clocktesting.FakeClock
	est  *servertime.Estimator
	b    *Backend
}

func newWorld(t *testing.T) *world {
	cs, store := newCASClient()
	w := &world{t: t, store: store}
	w.datedRTT = func(skew, dateShift, rtt time.Duration) *client {
		elapsed := time.Duration(0)
		if len(w.clients) > 0 {
			c0 := w.clients[0]
			elapsed = c0.clk.Now().Sub(t0.Add(c0.skew))
		}
		clk := clocktesting.NewFakeClock(t0.Add(skew + elapsed))
		est := servertime.New(clk)
		// One response, generated at true time t0+elapsed (its Date shifted
		// by dateShift), seen at once.
		est.Observe(clk.Now().Add(-rtt), clk.Now(), t0.Add(elapsed+dateShift).Truncate(time.Second))
		c := &client{skew: skew, clk: clk, est: est, b: NewLeaseBackend(cs, est, clk)}
		c.b.Margin = time.Second
		w.clients = append(w.clients, c)
		return c
	}
	w.dated = func(skew, dateShift time.Duration) *client { return w.datedRTT(skew, dateShift, 0) }
	w.backend = func(skew time.Duration) *client {
		c := w.dated(skew, 0)
		// The clients of this world judge expiry by server time alone, as
		// the tests below were written for; Confirm's elapsed-time rule is
		// tested with clients made by dated (confirm_test.go).
		c.b.TrustServerTime = true
		return c
	}
	return w
}

// advance moves every client's clock forward by d.
func (w *world) advance(d time.Duration) {
	for _, c := range w.clients {
		c.clk.Step(d)
	}
}

// fakeClocked makes b judge locks by server time alone (TrustServerTime):
// for tests on fake clocks that stand still, which test other rules than
// Confirm's (confirm_test.go tests it with clocks that move).
func fakeClocked(b *Backend) *Backend {
	b.TrustServerTime = true
	return b
}

func req(op Operation, lease time.Duration) Request {
	return Request{Release: "web", Namespace: ns, Operation: op, LeaseDuration: lease, Who: "tester@host", ToolVersion: "test"}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestTryAcquireCreatesThenBlocks(t *testing.T) {
	w := newWorld(t)
	a, b := w.backend(0), w.backend(10*time.Minute)
	ctx := context.Background()

	held, holder, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil || holder != nil {
		t.Fatalf("TryAcquire = %v, %v", holder, err)
	}
	if held.PreviousState != Free || held.Previous != nil {
		t.Errorf("previous = %v %+v, want free and none", held.PreviousState, held.Previous)
	}
	l := w.store.get(ns, LeaseName("web"))
	if got := HolderOf(&l.Spec); got != held.Session() {
		t.Errorf("holderIdentity = %q, want %q", got, held.Session())
	}
	if l.Labels[LabelManagedBy] != ManagedBy || l.Labels[LabelRelease] != "web" {
		t.Errorf("labels = %v", l.Labels)
	}
	r := held.Record()
	// Server time was known to lie in [t0, t0+1s]; the record uses the
	// upper bound.
	if !r.AcquiredAt.Equal(at(time.Second)) || !r.LockedTill.Equal(at(4*time.Second)) {
		t.Errorf("acquiredAt %v lockedTill %v, want %v and %v", r.AcquiredAt, r.LockedTill, at(time.Second), at(4*time.Second))
	}
	if *l.Spec.LeaseDurationSeconds != 3 || !l.Spec.RenewTime.Time.Equal(r.RenewedAt) {
		t.Errorf("spec mirror = %+v", l.Spec)
	}

	_, holder, err = b.b.TryAcquire(ctx, req(OpRollback, 3*time.Second))
	var le *LockedError
	if !errors.As(err, &le) || !errors.Is(err, ErrLocked) {
		t.Fatalf("second TryAcquire err = %v, want *LockedError", err)
	}
	if holder == nil || holder.Session != held.Session() || le.Holder.Who != "tester@host" || le.State != Live {
		t.Errorf("holder = %+v, locked error = %+v", holder, le)
	}
}

// TestTakeoverOnlyAfterServerTimeExpiry: the holder stops renewing; another
// client, whose clock is 10 minutes ahead, takes over only once its own
// estimate of server time has certainly passed LOCKED TILL + margin.
func TestTakeoverOnlyAfterServerTimeExpiry(t *testing.T) {
	w := newWorld(t)
	a, b := w.backend(0), w.backend(10*time.Minute)
	ctx := context.Background()
	held, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := held.SetRevision(ctx, 8); err != nil {
		t.Fatal(err)
	}
	// LOCKED TILL is t0+4s; b's lower bound passes t0+5s a moment after
	// 5s, its upper bound at 4s. Before that, b is refused at once.
	w.advance(3900 * time.Millisecond)
	if _, _, err := b.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second)); !errors.Is(err, ErrLocked) {
		t.Fatalf("took over before LOCKED TILL + margin: err = %v", err)
	}
	// Between the two, the lock may have expired: TryAcquire waits until
	// b's estimate can tell, and takes over only then.
	w.advance(1100 * time.Millisecond)
	type result struct {
		held *part
		err  error
	}
	done := make(chan result, 1)
	go func() {
		h, _, err := b.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
		done <- result{h, err}
	}()
	eventually(t, "TryAcquire waiting for the estimate", b.clk.HasWaiters)
	select {
	case r := <-done:
		t.Fatalf("TryAcquire returned before b's estimate could tell: %+v", r)
	default:
	}
	w.advance(10 * time.Millisecond)
	var r result
	select {
	case r = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("TryAcquire still waiting after b's lower bound passed LOCKED TILL + margin")
	}
	if r.err != nil {
		t.Fatalf("no takeover after expiry: %v", r.err)
	}
	taken := r.held
	if now, _ := b.est.Now(); !now.Earliest.After(at(5 * time.Second)) {
		t.Errorf("took over when b's lower bound was %v, not past LOCKED TILL + margin %v", now.Earliest, at(5*time.Second))
	}
	if taken.PreviousState != Expired || taken.Previous == nil || taken.Previous.Session != held.Session() || taken.Previous.Revision != 8 {
		t.Errorf("previous = %v %+v", taken.PreviousState, taken.Previous)
	}
	if err := held.Valid(); !errors.Is(err, ErrLost) {
		t.Errorf("old holder Valid() = %v, want ErrLost", err)
	}
	if err := held.Renew(ctx); !errors.Is(err, ErrLost) {
		t.Errorf("old holder Renew() = %v, want ErrLost", err)
	}
	if err := held.Release(ctx); !errors.Is(err, ErrLost) {
		t.Errorf("old holder Release() = %v, want ErrLost", err)
	}
	if got := HolderOf(&w.store.get(ns, LeaseName("web")).Spec); got != taken.Session() {
		t.Errorf("holder after the old holder's release attempt = %q, want %q", got, taken.Session())
	}
}

func TestRenewDetectsTakeover(t *testing.T) {
	w := newWorld(t)
	a := w.backend(0)
	ctx := context.Background()
	held, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l := w.store.get(ns, LeaseName("web"))
	l.Spec.HolderIdentity = ptr("intruder")
	w.store.put(l)
	err = held.Renew(ctx)
	if !errors.Is(err, ErrLost) {
		t.Fatalf("Renew() = %v, want ErrLost", err)
	}
	select {
	case <-held.Done():
	default:
		t.Error("Done() not closed after loss")
	}
	if got := HolderOf(&w.store.get(ns, LeaseName("web")).Spec); got != "intruder" {
		t.Errorf("Renew overwrote the new holder: %q", got)
	}
}

func TestRenewKeepsQueueWrittenConcurrently(t *testing.T) {
	w := newWorld(t)
	a := w.backend(0)
	ctx := context.Background()
	held, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l := w.store.get(ns, LeaseName("web"))
	if err := setQueue(l, []Waiter{{Session: "w1", ExpiresAt: at(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	w.store.put(l)
	w.advance(5 * time.Second)
	before := held.Record().RenewedAt
	if err := held.Renew(ctx); err != nil {
		t.Fatalf("Renew after a queue write: %v", err)
	}
	if !held.Record().RenewedAt.After(before) {
		t.Error("renewedAt did not move")
	}
	got := w.store.get(ns, LeaseName("web"))
	if q := DecodeQueue(got.Annotations[AnnotationQueue]); len(q) != 1 || q[0].Session != "w1" {
		t.Errorf("queue after renew = %+v", q)
	}
	if w.store.calls["update"] != 2 {
		t.Errorf("expected one conflicting update and one retry, saw %d updates", w.store.calls["update"])
	}
}

func TestReleaseThenAcquire(t *testing.T) {
	w := newWorld(t)
	a, b := w.backend(0), w.backend(-10*time.Minute)
	ctx := context.Background()
	held, _, err := a.b.TryAcquire(ctx, req(OpInstall, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := held.Release(ctx); err != nil {
		t.Errorf("second Release: %v", err)
	}
	if err := held.Valid(); !errors.Is(err, ErrLost) {
		t.Errorf("Valid after release = %v, want ErrLost", err)
	}
	st, err := b.b.Inspect(ctx, ns, "web")
	if err != nil || st.State != Free || st.Record == nil || st.Record.ReleasedAt.IsZero() {
		t.Fatalf("Inspect = %+v, %v", st, err)
	}
	next, _, err := b.b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if next.PreviousState != Free || next.Previous == nil || next.Previous.Session != held.Session() {
		t.Errorf("previous = %v %+v", next.PreviousState, next.Previous)
	}
	if l := w.store.get(ns, LeaseName("web")); *l.Spec.LeaseTransitions != 1 {
		t.Errorf("leaseTransitions = %d, want 1", *l.Spec.LeaseTransitions)
	}
}

func TestReleaseAndDelete(t *testing.T) {
	w := newWorld(t)
	a := w.backend(0)
	ctx := context.Background()

	held, _, err := a.b.TryAcquire(ctx, req(OpUninstall, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := held.ReleaseAndDelete(ctx); err != nil {
		t.Fatal(err)
	}
	if l := w.store.get(ns, LeaseName("web")); l != nil {
		t.Fatalf("lease still there: %+v", l)
	}

	// With a live waiter queued, the Lease stays (released) so the queue
	// survives.
	held, _, err = a.b.TryAcquire(ctx, req(OpUninstall, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l := w.store.get(ns, LeaseName("web"))
	if err := setQueue(l, []Waiter{{Session: "w1", ExpiresAt: at(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	w.store.put(l)
	if err := held.ReleaseAndDelete(ctx); err != nil {
		t.Fatal(err)
	}
	l = w.store.get(ns, LeaseName("web"))
	if l == nil || HolderOf(&l.Spec) != "" || l.Annotations[AnnotationQueue] == "" {
		t.Fatalf("lease after ReleaseAndDelete with a waiter = %+v", l)
	}
}

func TestTryAcquireRespectsQueue(t *testing.T) {
	w := newWorld(t)
	a := w.backend(0)
	ctx := context.Background()
	held, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := w.store.get(ns, LeaseName("web"))
	if err := setQueue(l, []Waiter{{Session: "w1", ExpiresAt: at(10 * time.Second)}}); err != nil {
		t.Fatal(err)
	}
	w.store.put(l)
	_, _, err = a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	var le *LockedError
	if !errors.As(err, &le) || le.State != Free || le.Ahead != 1 {
		t.Fatalf("TryAcquire with a live waiter ahead = %v", err)
	}
	w.advance(11*time.Second + 10*time.Millisecond)
	if _, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second)); err != nil {
		t.Fatalf("TryAcquire after the waiter expired: %v", err)
	}
	if l := w.store.get(ns, LeaseName("web")); l.Annotations[AnnotationQueue] != "" {
		t.Errorf("dead waiter not pruned: %s", l.Annotations[AnnotationQueue])
	}
}

// waitTimers blocks until the fake clock has at least n timers.
func waitTimers(t *testing.T, c *client, n int) {
	t.Helper()
	eventually(t, "timers", func() bool { return c.clk.Waiters() >= n })
}

func TestKeepRenewsAndReportsLoss(t *testing.T) {
	w := newWorld(t)
	a := w.backend(0)
	ctx := context.Background()
	held, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan error, 1)
	go held.Keep(ctx, func(err error) { lost <- err })

	for i := 1; i <= 3; i++ {
		waitTimers(t, a, 1)
		w.advance(time.Second)
		want := at(time.Duration(i+1) * time.Second)
		eventually(t, "renewal", func() bool { return !held.Record().RenewedAt.Before(want) })
	}
	// The API server stops answering: the holder must report loss at its
	// renew deadline (last send + 3s - 1s margin) and not later.
	w.store.setFail(func(verb string) error { return errors.New("connection refused") })
	lastSend := a.clk.Now()
	for a.clk.Now().Sub(lastSend) < 2*time.Second {
		select {
		case err := <-lost:
			t.Fatalf("lost after %v, before the deadline: %v", a.clk.Now().Sub(lastSend), err)
		default:
		}
		waitTimers(t, a, 1)
		w.advance(50 * time.Millisecond)
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-lost:
		if !errors.Is(err, ErrLost) {
			t.Errorf("onLost(%v), want ErrLost", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("onLost not called at the renew deadline")
	}
	if err := held.Valid(); !errors.Is(err, ErrLost) {
		t.Errorf("Valid after the deadline = %v", err)
	}
}

func TestKeepStopsAtMaxHold(t *testing.T) {
	w := newWorld(t)
	a := w.backend(0)
	ctx := context.Background()
	r := req(OpUpgrade, 3*time.Second)
	r.MaxHold = 2500 * time.Millisecond
	held, _, err := a.b.TryAcquire(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if got := held.Record().MaxHoldUntil; !got.Equal(at(3500 * time.Millisecond)) {
		t.Errorf("maxHoldUntil = %v", got)
	}
	lost := make(chan error, 1)
	go held.Keep(ctx, func(err error) { lost <- err })
	for range 5 {
		waitTimers(t, a, 1)
		w.advance(500 * time.Millisecond)
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-lost:
		if !errors.Is(err, ErrMaxHold) {
			t.Fatalf("onLost(%v), want ErrMaxHold", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("onLost not called at max hold")
	}
	if err := held.Valid(); err != nil {
		t.Errorf("Valid right after max hold = %v; the lock is still held until its deadline", err)
	}
	if err := held.Renew(ctx); !errors.Is(err, ErrMaxHold) {
		t.Errorf("Renew after max hold = %v", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Errorf("Release after max hold = %v", err)
	}
}

func TestWaitServesInArrivalOrder(t *testing.T) {
	w := newWorld(t)
	a, c1, c2 := w.backend(0), w.backend(7*time.Minute), w.backend(-7*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	held, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		name string
		h    *part
		err  error
	}
	got := make(chan result, 2)
	var progress sync.Map
	start := func(name string, c *client) {
		go func() {
			h, err := c.b.Wait(ctx, req(OpUpgrade, 15*time.Second), func(holder *Record, left time.Duration) {
				progress.Store(name, holder)
			})
			got <- result{name, h, err}
		}()
	}
	queued := func(n int) func() bool {
		return func() bool {
			return len(DecodeQueue(w.store.get(ns, LeaseName("web")).Annotations[AnnotationQueue])) == n
		}
	}
	start("first", c1)
	eventually(t, "first waiter queued", queued(1))
	start("second", c2)
	eventually(t, "second waiter queued", queued(2))
	if h, ok := progress.Load("first"); !ok || h.(*Record).Session != held.Session() {
		t.Errorf("progress did not name the holder: %v", h)
	}

	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil || r.name != "first" {
		t.Fatalf("after release: %s got %v", r.name, r.err)
	}
	select {
	case r2 := <-got:
		t.Fatalf("%s acquired while first holds the lock (err %v)", r2.name, r2.err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := r.h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r = <-got
	if r.err != nil || r.name != "second" {
		t.Fatalf("after the first released: %s got %v", r.name, r.err)
	}
	if q := w.store.get(ns, LeaseName("web")).Annotations[AnnotationQueue]; q != "" {
		t.Errorf("queue left behind: %s", q)
	}
}

// TestWaitTakesOverAtExpiry: the holder dies; the waiter takes over when the
// lock expires in server time, by timer and not earlier.
func TestWaitTakesOverAtExpiry(t *testing.T) {
	w := newWorld(t)
	a, c := w.backend(0), w.backend(10*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dead, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan *part, 1)
	go func() {
		h, err := c.b.Wait(ctx, req(OpUpgrade, 3*time.Second), nil)
		if err != nil {
			t.Error(err)
		}
		done <- h
	}()
	// LOCKED TILL t0+4s, taken over just after t0+5s.
	for elapsed := time.Duration(0); ; elapsed += 100 * time.Millisecond {
		select {
		case h := <-done:
			if elapsed < 5*time.Second {
				t.Fatalf("taken over at +%v, before LOCKED TILL + margin", elapsed)
			}
			if h.PreviousState != Expired || h.Previous.Session != dead.Session() {
				t.Errorf("previous = %v %+v", h.PreviousState, h.Previous)
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
		if elapsed > 6*time.Second {
			t.Fatal("waiter did not take over after expiry")
		}
		waitTimers(t, c, 2)
		w.advance(100 * time.Millisecond)
	}
}

func TestWaitGivesUpAndLeavesQueue(t *testing.T) {
	w := newWorld(t)
	a, c := w.backend(0), w.backend(0)
	held, _, err := a.b.TryAcquire(context.Background(), req(OpUpgrade, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = c.b.Wait(ctx, req(OpUpgrade, 15*time.Second), nil)
	if !errors.Is(err, ErrLocked) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want ErrLocked and DeadlineExceeded", err)
	}
	var le *LockedError
	if !errors.As(err, &le) || le.Holder == nil || le.Holder.Session != held.Session() {
		t.Errorf("locked error does not name the holder: %v", err)
	}
	if q := w.store.get(ns, LeaseName("web")).Annotations[AnnotationQueue]; q != "" {
		t.Errorf("queue entry left behind: %s", q)
	}
}

// TestReleaseAbandoningHandsOn: a holder that took over an expired lock and
// failed to recover leaves a record that names the expired holder, so the
// next client finds that holder's revision abandoned (Expired), not a
// revision pending under a released lock; a plain release does not.
func TestReleaseAbandoningHandsOn(t *testing.T) {
	w := newWorld(t)
	a, b, c := w.backend(0), w.backend(0), w.backend(0)
	ctx := context.Background()
	dead, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := dead.SetRevision(ctx, 8); err != nil {
		t.Fatal(err)
	}
	w.advance(6 * time.Second)
	failed, _, err := b.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if failed.PreviousState != Expired {
		t.Fatalf("takeover found %v, want expired", failed.PreviousState)
	}
	if err := (&Held{parts: []*part{failed}}).ReleaseAfterFailedRecovery(ctx); err != nil {
		t.Fatal(err)
	}
	next, _, err := c.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if next.PreviousState != Free || next.Previous == nil || next.Previous.Session != failed.Session() {
		t.Fatalf("next found %v %+v, want the failed holder's released record", next.PreviousState, next.Previous)
	}
	rec, st := (&Held{parts: []*part{next}}).Previous()
	if st != Expired || rec == nil || rec.Session != dead.Session() || rec.Revision != 8 || rec.Abandoned != nil {
		t.Errorf("Held.Previous = %v %+v, want the dead holder's expired record of revision 8", st, rec)
	}
	// A plain release hands nothing on.
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
	last, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if rec, st := Found(last.Previous, last.PreviousState); st != Free || rec == nil || rec.Session != next.Session() {
		t.Errorf("after a plain release, found %v %+v, want the released record", st, rec)
	}
}

// TestRecovererDiesHandsOn: a holder that took over an expired lock names
// the expired holder in its own record until it names a revision of its
// own; if it dies recovering, the next client still finds the holder whose
// revision was abandoned, not the recoverer's lock of no revision.
func TestRecovererDiesHandsOn(t *testing.T) {
	w := newWorld(t)
	a, b, c := w.backend(0), w.backend(0), w.backend(0)
	ctx := context.Background()
	dead, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := dead.SetRevision(ctx, 8); err != nil {
		t.Fatal(err)
	}
	w.advance(6 * time.Second)
	recoverer, _, err := b.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if r := recoverer.Record(); r.Abandoned == nil || r.Abandoned.Session != dead.Session() {
		t.Fatalf("the recoverer's record names %+v, want the dead holder", r.Abandoned)
	}
	// It dies before naming a revision: its lock expires.
	w.advance(6 * time.Second)
	next, _, err := c.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if rec, st := Found(next.Previous, next.PreviousState); st != Expired || rec == nil || rec.Session != dead.Session() || rec.Revision != 8 {
		t.Fatalf("found %v %+v, want the dead holder's record of revision 8", st, rec)
	}
	// Once a holder names a revision of its own, the hand-on is cleared.
	if err := next.SetRevision(ctx, 9); err != nil {
		t.Fatal(err)
	}
	if r := next.Record(); r.Abandoned != nil {
		t.Errorf("after SetRevision the record still names %+v", r.Abandoned)
	}
	w.advance(6 * time.Second)
	last, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if rec, st := Found(last.Previous, last.PreviousState); st != Expired || rec == nil || rec.Session != next.Session() || rec.Revision != 9 {
		t.Errorf("found %v %+v, want the holder of revision 9", st, rec)
	}
}
