package servertime

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/sleepclock"
)

// TestSuspendAdvancesOnlyLatest: while this machine sleeps the server's
// clock runs on, but the local monotonic clock does not. After the machine
// wakes, the upper bound must count the sleep (or a holder would believe
// its lock valid), while the lower bound must not run ahead of what the
// monotonic clock justifies (or another holder's live lock would look
// expired too soon).
func TestSuspendAdvancesOnlyLatest(t *testing.T) {
	clk := sleepclock.NewFake(serverEpoch.Add(7 * time.Minute)) // local clock off
	est := New(clk)
	sent := clk.Now()
	clk.Step(100 * time.Millisecond)
	recv := clk.Now()
	est.Observe(sent, recv, serverEpoch)
	clk.Step(2 * time.Second)
	before, _ := est.Now()

	const sleep = 10 * time.Minute
	clk.Suspend(sleep)
	after, _ := est.Now()

	mono := clk.Now().Sub(recv)
	if limit := serverEpoch.Add(mono); after.Earliest.After(limit) {
		t.Errorf("after the sleep Earliest = %v, ahead of the %v the monotonic clock justifies", after.Earliest, limit)
	}
	if after.Earliest.Sub(before.Earliest) > time.Nanosecond {
		t.Errorf("the sleep moved Earliest by %v", after.Earliest.Sub(before.Earliest))
	}
	if got := after.Latest.Sub(before.Latest); got < sleep {
		t.Errorf("the sleep moved Latest by %v, want at least %v", got, sleep)
	}
	// The truth (the server ran on for the sleep) lies within the bounds.
	truth := serverEpoch.Add(50*time.Millisecond + clk.Now().Sub(sent) + sleep)
	if truth.Before(after.Earliest) || truth.After(after.Latest) {
		t.Errorf("true server time %v outside [%v, %v]", truth, after.Earliest, after.Latest)
	}

	// The next response brings the lower bound up to date.
	sent = clk.Now()
	est.Observe(sent, sent, truth.Truncate(time.Second))
	if b, _ := est.Now(); b.Earliest.Before(truth.Add(-time.Second)) || b.Width() > time.Second {
		t.Errorf("after a fresh response bounds = [%v, %v], truth %v", b.Earliest, b.Latest, truth)
	}
}

// TestBoundsHoldTrueTimeAcrossSuspend is TestBoundsAlwaysHoldTrueTime on a
// machine that sleeps now and then: the server's clock runs on during every
// sleep, the local monotonic clock does not.
func TestBoundsHoldTrueTimeAcrossSuspend(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := 0; trial < 200; trial++ {
		localStart := serverEpoch.Add(time.Duration(rng.Int64N(int64(48*time.Hour))) - 24*time.Hour)
		clk := sleepclock.NewFake(localStart)
		est := New(clk)
		var slept time.Duration
		serverAt := func(local time.Time) time.Time { return serverEpoch.Add(local.Sub(localStart) + slept) }
		check := func(i int, what string) {
			b, ok := est.Now()
			if !ok {
				return
			}
			if truth := serverAt(clk.Now()); truth.Before(b.Earliest) || truth.After(b.Latest) {
				t.Fatalf("trial %d step %d %s: true server time %v outside [%v, %v]", trial, i, what, truth, b.Earliest, b.Latest)
			}
		}
		for i := 0; i < 20; i++ {
			clk.Step(time.Duration(rng.Int64N(int64(3 * time.Second))))
			sent := clk.Now()
			gen := time.Duration(rng.Int64N(int64(300 * time.Millisecond)))
			clk.Step(gen)
			if rng.IntN(4) == 0 { // asleep while the request is out
				d := time.Duration(rng.Int64N(int64(10 * time.Minute)))
				clk.Suspend(d)
				slept += d
			}
			date := serverAt(clk.Now()).Truncate(time.Second)
			clk.Step(time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
			est.Observe(sent, clk.Now(), date)
			check(i, "after a response")
			if rng.IntN(3) == 0 {
				d := time.Duration(rng.Int64N(int64(10 * time.Minute)))
				clk.Suspend(d)
				slept += d
				check(i, "after a sleep")
			}
		}
	}
}
