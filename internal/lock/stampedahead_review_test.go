package lock

import (
	"context"
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// Tests of the review of 0eec072 (LockedError.StampedAhead) and 13428ba.

// TestNoWaitTakerStampedAheadByLittleIsNotRefusedUnrenewed: the dead
// holder's Date ran 5 s ahead (its lease 3 s, its stamp a second wide, the
// margin 1 s), so its LOCKED TILL stands ahead of the taker's upper bound
// of server time by more than a lease, the uncertainty and the margin, but
// by less than that plus the confirmation's own wait. The client that does
// not wait starts to wait for the confirmation (StampedAhead); while it
// waits, the server's clock catches up with the stamp far enough that the
// lock no longer counts as stamped ahead, though it is still live in server
// time and nothing was renewed. It must go on waiting and take the lock at
// its confirmation (a lease, the margin and the stamp's second seen
// unchanged), not be refused as if a renewal had been seen: no write of
// the holder came after it started to wait.
func TestNoWaitTakerStampedAheadByLittleIsNotRefusedUnrenewed(t *testing.T) {
	w := newWorld(t)
	a, b := w.dated(0, 5*time.Second), w.dated(0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dead, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	done := tryAsync(ctx, b, req(OpUpgrade, 3*time.Second))
	if res, ok := settle(t, b, done); ok {
		t.Fatalf("the client did not wait for the confirmation: %+v, %v", res.held, res.err)
	}
	res, elapsed := stepUntilDone(t, done, 7*time.Second, func() { waitTimers(t, b, 1) }, w.advance, "the dead holder's lock stamped ahead was not taken over")
	if res.err != nil {
		t.Fatalf("refused after waiting %v with no renewal of the dead holder seen (its confirmation was due at 5 s): %v", elapsed, res.err)
	}
	if elapsed < 5*time.Second || res.held.PreviousState != Expired || res.held.Previous.Session != dead.Session() {
		t.Errorf("taken over after %v (want a lease, the margin and the stamp's second, 5 s), from %v %+v", elapsed, res.held.PreviousState, res.held.Previous)
	}
}

// TestJointNoWaitTakerConfirmsEveryPartStampedAheadAtOnce: a dead holder
// of a lock in two parts (two stores) whose Date ran 10 s ahead. A client
// that does not wait confirms the first part on its own clock
// (StampedAhead); the second part must be confirmed meanwhile, as for a
// lock Expired in server time (attempt's sightLater, seeds 92122 and
// 96108), so that the whole take comes after one confirmation, not one per
// part.
func TestJointNoWaitTakerConfirmsEveryPartStampedAheadAtOnce(t *testing.T) {
	const lease = 3 * time.Second
	cs1, _ := newCASClient()
	cs2, _ := newCASClient()
	clkA := clocktesting.NewFakeClock(t0)
	estA := servertime.New(clkA)
	estA.Observe(clkA.Now(), clkA.Now(), t0.Add(10*time.Second).Truncate(time.Second))
	clkB := clocktesting.NewFakeClock(t0)
	estB := servertime.New(clkB)
	estB.Observe(clkB.Now(), clkB.Now(), t0.Truncate(time.Second))
	backends := func(clk *clocktesting.FakeClock, est *servertime.Estimator) []*Backend {
		b1, b2 := NewLeaseBackend(cs1, est, clk), NewLeaseBackend(cs2, est, clk)
		b1.Margin, b2.Margin = time.Second, time.Second
		return []*Backend{b1, b2}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dead, err := Acquire(ctx, req(OpUpgrade, lease), false, nil, backends(clkA, estA)...)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		h   *Held
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := Acquire(ctx, req(OpUpgrade, lease), false, nil, backends(clkB, estB)...)
		done <- result{h, err}
	}()
	res, elapsed := stepUntilDone(t, done, 15*time.Second, func() { eventually(t, "timers", func() bool { return clkB.HasWaiters() }) },
		func(d time.Duration) { clkA.Step(d); clkB.Step(d) }, "the dead holder's lock stamped ahead was not taken over")
	if res.err != nil {
		t.Fatalf("refused after %v: %v", elapsed, res.err)
	}
	defer func() { _ = res.h.Release(context.Background()) }()
	// One confirmation: a lease, the margin and the stamp's second, 5 s.
	if elapsed < 5*time.Second || elapsed > 6*time.Second {
		t.Errorf("the dead holder (session %s) was taken over after %v; want one confirmation, 5 s (to 6 s), for both parts", dead.Session(), elapsed)
	}
}

// TestStampedAheadFromFirstSight: a stamp is judged against the upper
// bound of server time when this process first saw it (SeenFor ago): the
// holder sent it before then. Seen for 3 s, a LOCKED TILL 2 s short of the
// threshold by now's upper bound is still stamped ahead.
func TestStampedAheadFromFirstSight(t *testing.T) {
	const (
		lease  = 5 * time.Second
		margin = 250 * time.Millisecond
	)
	now := servertime.Bounds{Earliest: at(10 * time.Second), Latest: at(11 * time.Second)}
	till := at(16*time.Second + margin - 2*time.Second)
	for _, tc := range []struct {
		seenFor time.Duration
		want    bool
	}{{0, false}, {2 * time.Second, false}, {2*time.Second + time.Millisecond, true}, {3 * time.Second, true}} {
		s := Sighting{Lease: lease, Bounded: true, SeenFor: tc.seenFor}
		if got := stampedAhead(till, now, s, margin); got != tc.want {
			t.Errorf("seen for %v: stampedAhead = %t, want %t", tc.seenFor, got, tc.want)
		}
	}
}

// TestNoWaitTakerSeesARenewalThatNarrowedItsStamp: a live holder whose
// Date runs 30.9 s ahead first stamped its lock through a slow answer (its
// stamp 2.5 s wide), then narrowed its estimate and renewed, its stamp
// 0.6 s wide. The client that does not wait and confirms the lock stamped
// ahead reads it again a second after it first saw it and must see that
// renewal: its confirmation, counted from the renewal with the narrower
// stamp, comes 0.9 s sooner than the first one, and a test of a renewal by
// the confirmation moving later misses it (confirmTake).
func TestNoWaitTakerSeesARenewalThatNarrowedItsStamp(t *testing.T) {
	w := newWorld(t)
	b := w.dated(0, 0)
	clkA := clocktesting.NewFakeClock(b.clk.Now())
	estA := servertime.New(clkA)
	shift := 30*time.Second + 900*time.Millisecond
	// Sent 1.5 s before its answer, dated when it was sent.
	sent := clkA.Now().Add(-1500 * time.Millisecond)
	estA.Observe(sent, clkA.Now(), sent.Add(shift).Truncate(time.Second))
	a := NewLeaseBackend(b.b.client, estA, clkA)
	a.Margin = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held, _, err := a.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	done := tryAsync(ctx, b, req(OpUpgrade, 3*time.Second))
	if res, ok := settle(t, b, done); ok {
		t.Fatalf("the client did not wait for the confirmation: %+v, %v", res.held, res.err)
	}
	step := func(d time.Duration) { clkA.Step(d); b.clk.Step(d) }
	step(100 * time.Millisecond)
	// An answer dated just after the server's clock turned a second.
	estA.Observe(clkA.Now(), clkA.Now(), clkA.Now().Add(shift).Truncate(time.Second))
	if err := held.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if r := held.Record(); r.RenewedAt.Sub(r.RenewedAfter) > time.Second {
		t.Fatalf("the renewal's stamp is %v wide; the test wants it narrowed", r.RenewedAt.Sub(r.RenewedAfter))
	}
	step(900 * time.Millisecond)
	res, ok := settle(t, b, done)
	if !ok {
		t.Fatal("the client read the lock after the holder renewed it and still waits for its confirmation (the renewal, its stamp narrower, was not seen)")
	}
	var le *LockedError
	if !errors.As(res.err, &le) || !le.Renewing {
		t.Fatalf("the taker's result = %+v, %v; want refused, seen renewing", res.held, res.err)
	}
}
