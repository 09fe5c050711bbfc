package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// skewedClock is the real clock read as if this machine's wall clock were
// off by skew. Elapsed times (monotonic) are unaffected, as on a real
// machine whose clock is simply set wrong.
type skewedClock struct {
	clock.RealClock
	skew time.Duration
}

func (c skewedClock) Now() time.Time                  { return time.Now().Add(c.skew) }
func (c skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// newBackend is one independent client: its own clock, server-time
// estimator and HTTP connections.
func newBackend(t *testing.T, env *testenv.Env, skew time.Duration) *lock.Backend {
	t.Helper()
	clk := skewedClock{skew: skew}
	est := servertime.New(clk)
	cs, err := kubernetes.NewForConfig(est.Instrument(env.Config))
	if err != nil {
		t.Fatal(err)
	}
	if err := est.Sync(context.Background(), cs.Discovery()); err != nil {
		t.Fatal(err)
	}
	return storeBackend(t, cs, est, clk)
}

func request(ns, release string, lease time.Duration) lock.Request {
	return lock.Request{Release: release, Namespace: ns, Operation: lock.OpUpgrade, LeaseDuration: lease, Timeout: time.Minute}
}

// serverNow is the API server's true clock. The local control plane runs on
// this machine, so it is this machine's unskewed clock.
func serverNow() time.Time { return time.Now() }

func waitQueued(t *testing.T, b *lock.Backend, ns, release string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := b.Inspect(context.Background(), ns, release)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Waiters) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiter(s) queued, want %d", len(st.Waiters), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestIntegrationRaceOneWinner (S1): two clients, clocks 10 minutes apart
// each way, try to take the same free lock at the same instant, many times.
// Exactly one wins each round and the other is told who holds it.
func TestIntegrationRaceOneWinner(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	clients := []*lock.Backend{newBackend(t, env, 10*time.Minute), newBackend(t, env, -10*time.Minute)}
	const rounds = 20
	for round := range rounds {
		release := fmt.Sprintf("race-%d", round)
		// Half of the rounds race on Create, half on Update of a released
		// Lease.
		if round%2 == 1 {
			h, _, err := clients[0].TryAcquire(ctx, request(ns, release, 15*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		held := make([]*lock.Part, 2)
		errs := make([]error, 2)
		for i, c := range clients {
			wg.Go(func() {
				<-start
				held[i], _, errs[i] = c.TryAcquire(ctx, request(ns, release, 15*time.Second))
			})
		}
		t0 := time.Now()
		close(start)
		wg.Wait()
		elapsed := time.Since(t0) // a figure: the loser learns it lost without waiting (had it waited out the winner's lease, it would have won too)
		winners := 0
		for i := range clients {
			if errs[i] == nil {
				winners++
				continue
			}
			var le *lock.LockedError
			if !errors.As(errs[i], &le) {
				t.Fatalf("round %d: loser got %v, want *LockedError", round, errs[i])
			}
			if other := held[1-i]; other == nil || le.Holder == nil || le.Holder.Session != other.Session() {
				t.Errorf("round %d: loser was not told the winner's session: %v", round, errs[i])
			}
		}
		if winners != 1 {
			t.Fatalf("round %d: %d winners, want exactly 1 (errors %v)", round, winners, errs)
		}
		if round == 0 {
			for _, err := range errs {
				if err != nil {
					t.Logf("loser's message: %v (decided in %v)", err, elapsed)
				}
			}
		}
	}
}

// TestIntegrationTakeoverOnlyAfterExpiry (S2, S4): a holder stops renewing;
// a client whose clock is 10 minutes ahead polls. It gets the lock only once
// it has seen the holder's last renewal unchanged for a lease and the
// margin on its own clock (lock.Confirm), so never before the holder's own
// renew deadline; how long after LOCKED TILL is logged.
func TestIntegrationTakeoverOnlyAfterExpiry(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	a, b := newBackend(t, env, 0), newBackend(t, env, 10*time.Minute)
	dead, _, err := a.TryAcquire(ctx, request(ns, "web", 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := dead.SetRevision(ctx, 2); err != nil {
		t.Fatal(err)
	}
	// The holder's last write was sent before this; b reads only after it.
	lastSent := time.Now()
	till := dead.Record().LockedTill
	for {
		h, _, err := b.TryAcquire(ctx, request(ns, "web", 3*time.Second))
		now := serverNow()
		if err == nil {
			after := time.Since(lastSent)
			t.Logf("taken over %v after the holder's last write, %v after LOCKED TILL (margin %v)", after, now.Sub(till), lock.TakeoverMargin)
			if after < 3*time.Second+lock.TakeoverMargin {
				t.Errorf("taken over %v after the holder's last write, before its lease and the margin", after)
			}
			if h.PreviousState != lock.Expired || h.Previous == nil || h.Previous.Session != dead.Session() || h.Previous.Revision != 2 {
				t.Errorf("previous = %v %+v", h.PreviousState, h.Previous)
			}
			if err := dead.Renew(ctx); !errors.Is(err, lock.ErrLost) {
				t.Errorf("dead holder's Renew = %v, want ErrLost", err)
			}
			return
		}
		if !errors.Is(err, lock.ErrLocked) {
			t.Fatal(err)
		}
		if now.After(till.Add(time.Minute)) {
			t.Fatalf("still locked a minute after LOCKED TILL (generous; it is taken a lease and the margin after the holder's last write): %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestIntegrationRenewAfterTakeoverIsLost (S5): an operator breaks a live
// lock, another client takes it; the old holder's next renewal finds out and
// fails with ErrLost without overwriting the new holder.
func TestIntegrationRenewAfterTakeoverIsLost(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	a, b := newBackend(t, env, 0), newBackend(t, env, -10*time.Minute)
	old, _, err := a.TryAcquire(ctx, request(ns, "web", 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ForceRelease(ctx, ns, "web", old.Session(), "operator@desk"); err != nil {
		t.Fatal(err)
	}
	next, _, err := b.TryAcquire(ctx, request(ns, "web", 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	err = old.Renew(ctx)
	if !errors.Is(err, lock.ErrLost) {
		t.Fatalf("old holder's Renew = %v, want ErrLost", err)
	}
	t.Logf("old holder told: %v", err)
	if err := old.Valid(); !errors.Is(err, lock.ErrLost) {
		t.Errorf("old holder's Valid = %v, want ErrLost", err)
	}
	st, err := b.Inspect(ctx, ns, "web")
	if err != nil || st.HolderIdentity != next.Session() || st.State != lock.Live {
		t.Fatalf("lock after the old holder's renewal = %+v, %v", st, err)
	}
}

// TestIntegrationKeepHoldsPastManyLeases (S3): a holder that keeps renewing
// is never taken over, however long it holds: a contender tries until the
// holder's renewals have carried its LOCKED TILL three leases past the
// first one.
func TestIntegrationKeepHoldsPastManyLeases(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	a, b := newBackend(t, env, -10*time.Minute), newBackend(t, env, 10*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const lease = 3 * time.Second
	h, _, err := a.TryAcquire(ctx, request(ns, "web", lease))
	if err != nil {
		t.Fatal(err)
	}
	firstTill := h.Record().LockedTill
	go h.Keep(ctx, func(err error) { t.Errorf("lost while renewing: %v", err) })
	attempts := 0
	for !h.Record().LockedTill.After(firstTill.Add(3 * lease)) {
		if ctx.Err() != nil {
			t.Fatalf("the holder's renewals did not carry LOCKED TILL three leases on within 5 minutes: %v", h.Record().LockedTill)
		}
		if _, _, err := b.TryAcquire(ctx, request(ns, "web", lease)); !errors.Is(err, lock.ErrLocked) {
			t.Fatalf("a live, renewing lock was taken: %v", err)
		}
		attempts++
		time.Sleep(100 * time.Millisecond) // the contender's pace
	}
	if attempts == 0 {
		t.Fatal("no takeover was attempted")
	}
	t.Logf("held past 3 leases of %v against %d takeover attempts", lease, attempts)
	if err := h.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestIntegrationWaiterStartsWithinOneSecondOfRelease (S1, wait; the name
// is older than the test, which asserts no time: sqlstore_integration_test.go
// runs it by this name): a waiter whose clock is
// 10 minutes behind takes the lock once the holder releases it: it finds it
// free (not expired), in server time before the holder's LOCKED TILL (the
// holder's lease is longer than the waiter's patience, so a waiter not
// woken by the release gives up instead). How soon is a figure.
func TestIntegrationWaiterStartsWithinOneSecondOfRelease(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	a, w := newBackend(t, env, 0), newBackend(t, env, -10*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const holderLease = 10 * time.Minute
	h, _, err := a.TryAcquire(ctx, request(ns, "web", holderLease))
	if err != nil {
		t.Fatal(err)
	}
	go h.Keep(ctx, nil)
	type took struct {
		held *lock.Part
		at   time.Time
	}
	got := make(chan took, 1)
	var progress []string
	var mu sync.Mutex
	go func() {
		wh, err := w.Wait(ctx, request(ns, "web", 15*time.Second), func(holder *lock.Record, left time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			if holder != nil {
				progress = append(progress, fmt.Sprintf("%s %s left %v", holder.Who, holder.Session, left.Round(time.Second)))
			}
		})
		if err != nil {
			t.Error(err)
			got <- took{}
			return
		}
		got <- took{wh, time.Now()}
		_ = wh.Release(context.Background())
	}()
	waitQueued(t, a, ns, "web", 1)
	// The waiter has judged the lock live and reported whom it waits for.
	for {
		mu.Lock()
		n := len(progress)
		mu.Unlock()
		if n > 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the waiter reported no progress naming the holder")
		}
		time.Sleep(20 * time.Millisecond)
	}
	till := h.Record().LockedTill
	released := time.Now()
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	tk := <-got
	if tk.held == nil {
		t.FailNow()
	}
	t.Logf("FIGURE waiter acquired %v after the holder released", tk.at.Sub(released))
	if tk.held.PreviousState != lock.Free {
		t.Errorf("the waiter found the lock %v, want it free (released)", tk.held.PreviousState)
	}
	// AcquiredAt is the upper bound of the waiter's server-time estimate.
	if acq := tk.held.Record().AcquiredAt; !acq.Before(till) {
		t.Errorf("the waiter took the lock at %v, not before the holder's LOCKED TILL %v", acq, till)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("progress: %s", progress[len(progress)-1])
}

// TestIntegrationWaiterTakesOverDeadHolderAtExpiry (S2, S4): the holder
// renews for a while, then dies right after a renewal without releasing; a
// waiter whose clock is 10 minutes behind takes over once it has seen the
// holder's last renewal unchanged for a lease and the margin (lock.Confirm):
// in server time, never before that renewal's LOCKED TILL less the width of
// the holder's estimate (at most a second: LOCKED TILL is stamped from its
// upper bound) plus the margin (how soon after is logged: a wall-clock bound
// flakes on a loaded machine).
func TestIntegrationWaiterTakesOverDeadHolderAtExpiry(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	a, w := newBackend(t, env, 0), newBackend(t, env, -10*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const lease = 6 * time.Second // 3 s: a holder on a loaded machine missed its renewals
	dead, _, err := a.TryAcquire(ctx, request(ns, "web", lease))
	if err != nil {
		t.Fatal(err)
	}
	keepCtx, kill := context.WithCancel(ctx)
	go dead.Keep(keepCtx, nil)

	got := make(chan *lock.Part, 1)
	go func() {
		h, err := w.Wait(ctx, request(ns, "web", lease), nil)
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	waitQueued(t, a, ns, "web", 1)
	// Let the holder renew twice with the waiter queued, then kill it just
	// after a renewal.
	last := dead.Record().RenewedAt
	for renewals := 0; renewals < 2; {
		if ctx.Err() != nil {
			t.Fatalf("the holder renewed %d times within the test's minute, want 2 (lost its lock on a loaded machine?): %v", renewals, ctx.Err())
		}
		if r := dead.Record().RenewedAt; !r.Equal(last) {
			last = r
			renewals++
		}
		time.Sleep(time.Millisecond)
	}
	kill()
	died := serverNow()
	till := dead.Record().LockedTill

	h := <-got
	if h == nil {
		t.FailNow()
	}
	took := serverNow()
	t.Logf("waiter took over %v after the holder died (lease %v, margin %v), %v after LOCKED TILL",
		took.Sub(died), lease, lock.TakeoverMargin, took.Sub(till))
	if took.Sub(till) < lock.TakeoverMargin-time.Second {
		t.Errorf("took over %v after LOCKED TILL, before the margin less the holder's estimate width", took.Sub(till))
	}
	if h.PreviousState != lock.Expired || h.Previous.Session != dead.Session() {
		t.Errorf("previous = %v %+v", h.PreviousState, h.Previous)
	}
}

// TestIntegrationWaitersServedInArrivalOrder (S1): three waiters with skewed
// clocks queue one after another and get the lock in that order.
func TestIntegrationWaitersServedInArrivalOrder(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	holder := newBackend(t, env, 0)
	h, _, err := holder.TryAcquire(ctx, request(ns, "web", 6*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	go h.Keep(ctx, nil)

	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	skews := []time.Duration{10 * time.Minute, -10 * time.Minute, 3 * time.Second}
	for i, skew := range skews {
		b := newBackend(t, env, skew)
		wg.Go(func() {
			wh, err := b.Wait(ctx, request(ns, "web", 6*time.Second), nil)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			time.Sleep(200 * time.Millisecond)
			if err := wh.Release(ctx); err != nil {
				t.Errorf("waiter %d release: %v", i, err)
			}
		})
		waitQueued(t, holder, ns, "web", i+1)
	}
	// Let every waiter refresh its queue entry and the holder renew twice,
	// their writes conflicting, before releasing.
	waitRefreshed(ctx, t, holder, h, ns, "web")
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	t.Logf("served in order %v", order)
	if fmt.Sprint(order) != "[0 1 2]" {
		t.Errorf("served in order %v, want [0 1 2]", order)
	}
	st, err := holder.Inspect(ctx, ns, "web")
	if err != nil || st.State != lock.Free || len(st.Waiters) != 0 {
		t.Errorf("after all: %+v, %v", st, err)
	}
}

// waitRefreshed waits until every waiter queued on the lock has refreshed
// its entry (its ExpiresAt moved on) and the holder h has renewed twice.
func waitRefreshed(ctx context.Context, t *testing.T, b *lock.Backend, h *lock.Part, ns, release string) {
	t.Helper()
	st, err := b.Inspect(ctx, ns, release)
	if err != nil {
		t.Fatal(err)
	}
	first := map[string]time.Time{}
	for _, w := range st.Waiters {
		first[w.Session] = w.ExpiresAt
	}
	renewed, renewals := h.Record().RenewedAt, 0
	for {
		if r := h.Record().RenewedAt; !r.Equal(renewed) {
			renewed = r
			renewals++
		}
		st, err := b.Inspect(ctx, ns, release)
		if err != nil {
			t.Fatal(err)
		}
		refreshed := 0
		for _, w := range st.Waiters {
			if at, ok := first[w.Session]; ok && w.ExpiresAt.After(at) {
				refreshed++
			}
		}
		if refreshed == len(first) && renewals >= 2 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%d of %d waiters refreshed their entries and the holder renewed %d times, want all and 2: %v", refreshed, len(first), renewals, ctx.Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestIntegrationReleaseAndDelete: uninstall leaves no Lease (lock row)
// behind.
func TestIntegrationReleaseAndDelete(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	b := newBackend(t, env, 0)
	r := request(ns, "web", 15*time.Second)
	r.Operation = lock.OpUninstall
	h, _, err := b.TryAcquire(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.ReleaseAndDelete(ctx); err != nil {
		t.Fatal(err)
	}
	if lockObjectExists(t, env, ns, "web") {
		t.Error("the lock object is left after ReleaseAndDelete")
	}
}
