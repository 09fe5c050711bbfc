package lock

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
	"github.com/helm-autorecover/helm-autorecover/internal/sleepclock"
)

// TestServerPassedLockedTill is the rule that stops a holder by the API
// server's clock: by its lower bound only, at LOCKED TILL less the margin.
func TestServerPassedLockedTill(t *testing.T) {
	till := at(10*time.Second + 400*time.Millisecond)
	const margin = time.Second
	// b is an estimate whose lower bound is at d, as a Date header of
	// second d read just now gives (the server's clock is in [d, d+1s)).
	b := func(d time.Duration) servertime.Bounds {
		return servertime.Bounds{Earliest: at(d), Latest: at(d + time.Second)}
	}
	for _, c := range []struct {
		name  string
		till  time.Time
		now   servertime.Bounds
		known bool
		want  bool
	}{
		{"nothing observed yet", till, servertime.Bounds{}, false, false},
		{"no LOCKED TILL recorded", time.Time{}, b(time.Hour), true, false},
		{"well before", till, b(0), true, false},
		{"Date of the second before the threshold's", till, b(9 * time.Second), true, false},
		{"a millisecond before LOCKED TILL less the margin", till, b(9*time.Second + 399*time.Millisecond), true, false},
		{"at LOCKED TILL less the margin", till, b(9*time.Second + 400*time.Millisecond), true, true},
		{"Date of LOCKED TILL's own second", till, b(10 * time.Second), true, true},
		{"long past (a VM stopped for minutes)", till, b(10 * time.Minute), true, true},
		{"the upper bound alone past it counts for nothing", till, servertime.Bounds{Earliest: at(8 * time.Second), Latest: at(20 * time.Second)}, true, false},
		{"a Date header behind the holder's clock cannot extend it", till, b(-10 * time.Minute), true, false},
	} {
		if got := ServerPassedLockedTill(c.till, c.now, c.known, margin); got != c.want {
			t.Errorf("%s: ServerPassedLockedTill(%s, [%s, %s], %t) = %t, want %t", c.name,
				c.till.Format(time.StampMilli), c.now.Earliest.Format(time.StampMilli), c.now.Latest.Format(time.StampMilli), c.known, got, c.want)
		}
	}
}

// TestServerPassedLockedTillOneDateSuffices: whenever a taker may have
// taken the lock over (its own lower bound past LOCKED TILL plus the
// takeover margin, so the server's clock too), any Date header the holder
// reads afterwards, truncated to its second, already stops it.
func TestServerPassedLockedTillOneDateSuffices(t *testing.T) {
	till := at(10*time.Second + 400*time.Millisecond)
	for server := till.Add(TakeoverMargin); server.Before(till.Add(3 * time.Second)); server = server.Add(7 * time.Millisecond) {
		date := server.Truncate(servertime.DateResolution)
		now := servertime.Bounds{Earliest: date, Latest: date.Add(servertime.DateResolution)}
		if !ServerPassedLockedTill(till, now, true, RenewMargin) {
			t.Fatalf("server clock at %s, past LOCKED TILL %s plus the takeover margin; a Date header of %s does not stop the holder",
				server.Format(time.StampMilli), till.Format(time.StampMilli), date.Format(time.Stamp))
		}
	}
}

// TestFrozenHolderStopsByServerTime: a holder whose clocks stood still (a
// VM stopped and resumed: monotonic and boot time alike) reads as lost as
// soon as it sees one answer from the API server dated past its LOCKED
// TILL, though its renew deadline is not due on its own clock; its keeper
// reports the loss and renews nothing.
func TestFrozenHolderStopsByServerTime(t *testing.T) {
	cs, store := newCASClient()
	clk := sleepclock.NewFake(t0)
	est := servertime.New(clk)
	est.Observe(clk.Now(), clk.Now(), t0)
	b := fakeClocked(NewLeaseBackend(cs, est, clk))
	ctx := context.Background()
	held, _, err := b.TryAcquire(ctx, req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan error, 1)
	go held.Keep(ctx, func(err error) { lost <- err })
	deadline := held.Deadline()
	updates := leaseUpdates(store)

	// The VM is stopped for a minute and resumed: no local clock moved,
	// but the first answer it reads is dated a minute on.
	est.Observe(clk.Now(), clk.Now(), t0.Add(time.Minute))
	if !clk.Now().Before(deadline) {
		t.Fatal("the renew deadline passed on the local clock: the test does not freeze it")
	}
	err = held.Valid()
	if !errors.Is(err, ErrLost) {
		t.Fatalf("Valid after the server's clock passed LOCKED TILL = %v, want ErrLost", err)
	}
	if err := held.SetRevision(ctx, 2); !errors.Is(err, ErrLost) {
		t.Errorf("SetRevision = %v, want ErrLost", err)
	}
	for steps := 0; ; steps++ {
		if steps > 100 {
			t.Fatal("the keeper reported no loss")
		}
		select {
		case err := <-lost:
			if !errors.Is(err, ErrLost) {
				t.Errorf("onLost(%v), want ErrLost", err)
			}
			if n := leaseUpdates(store); n != updates {
				t.Errorf("%d lease updates after the loss, want none", n-updates)
			}
			return
		default:
		}
		if clk.HasWaiters() {
			clk.Step(10 * time.Millisecond)
		} else {
			time.Sleep(time.Millisecond)
		}
	}
}

// TestServerTimeNeverExtendsAHolder: a Date header far behind (a lying
// proxy, a server clock stepped back) resets the estimate but does not
// keep a holder valid past its own renew deadline.
func TestServerTimeNeverExtendsAHolder(t *testing.T) {
	cs, _ := newCASClient()
	clk := sleepclock.NewFake(t0)
	est := servertime.New(clk)
	est.Observe(clk.Now(), clk.Now(), t0)
	b := fakeClocked(NewLeaseBackend(cs, est, clk))
	held, _, err := b.TryAcquire(context.Background(), req(OpUpgrade, 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	est.Observe(clk.Now(), clk.Now(), t0.Add(-10*time.Minute))
	if err := held.Valid(); err != nil {
		t.Fatalf("Valid after a Date header from the past: %v", err)
	}
	clk.SetTime(held.Deadline())
	if err := held.Valid(); !errors.Is(err, ErrLost) {
		t.Fatalf("Valid at the local renew deadline = %v, want ErrLost", err)
	}
}

// TestOwnClockTakeStopsAFrozenHolder: a client that takes a lock still
// live in server time because it has seen it unchanged long enough on its
// own clock (Confirm) does so no earlier than the holder's LOCKED TILL
// plus the takeover margin in the server's clock, whatever the width of
// the holder's estimate when it stamped its renewal; so any Date header a
// holder whose clocks stood still reads afterwards stops it. Counting the
// lease alone, a take came up to a second before that, and the frozen
// holder wrote after it (test/e2e TestFrozenClocksHolderStopsAfterTakeover
// failed one run in five). A stamp more uncertain than a taker counts (a
// second) makes the holder stop by its renewedAfter instead (StopTill).
func TestOwnClockTakeStopsAFrozenHolder(t *testing.T) {
	const lease = 6 * time.Second
	send := at(10*time.Second + 300*time.Millisecond) // the server's clock when the renewal was sent
	widths := []time.Duration{}
	for w := time.Duration(0); w <= 1500*time.Millisecond; w += 50 * time.Millisecond {
		widths = append(widths, w)
	}
	widths = append(widths, 2*time.Second, 5*time.Second, 23*time.Second, time.Minute)
	for _, width := range widths {
		step := max(width/150, 10*time.Millisecond)
		for below := time.Duration(0); below <= width; below += step {
			rec := Record{LeaseDuration: metav1.Duration{Duration: lease}, Session: "holder"}
			stamp(&rec, servertime.Bounds{Earliest: send.Add(-below), Latest: send.Add(width - below)})
			// The earliest a taker can see the renewal is when it was
			// sent; it takes once it has seen it unchanged for what
			// Confirm asks of a bounded lock live in server time.
			st, in := Confirm(Live, Sighting{Lease: lease, Bounded: true, Uncertain: uncertainty(&rec, "holder")}, TakeoverMargin)
			if st != Live {
				t.Fatalf("a lock first seen now confirmed expired")
			}
			take := send.Add(in)
			for after := time.Duration(0); after < 2*time.Second; after += 100 * time.Millisecond {
				date := take.Add(after).Truncate(servertime.DateResolution)
				now := servertime.Bounds{Earliest: date, Latest: date.Add(servertime.DateResolution)}
				if !ServerPassedLockedTill(StopTill(&rec, RenewMargin), now, true, RenewMargin) {
					t.Fatalf("estimate %s wide, %s below the server's clock: taken over at %s, LOCKED TILL %s; a Date header of %s does not stop the holder",
						width, below, take.Format(time.StampMilli), rec.LockedTill.Format(time.StampMilli), date.Format(time.Stamp))
				}
			}
		}
	}
}

// TestOwnClockTakeStopsAFrozenHolderWhateverTheTakersRate: as
// TestOwnClockTakeStopsAFrozenHolder, with the taker's clock running
// faster than the server's by NTP's largest slew (500 ppm), which the
// takeover margin covers (docs/protocol.md, "Time"): a taker counts a
// lease, the margin and the uncertainty of the stamp on its own clock, a
// little less in the server's. StopTill must leave the holder's bound that
// margin below the take for every stamp's width, as LOCKED TILL does for a
// stamp up to a second wide; it left none for a stamp more than 1.25 s
// wide (review of 58c4010), and a frozen holder resumed on a Date header
// of the second before its bound wrote after the take.
func TestOwnClockTakeStopsAFrozenHolderWhateverTheTakersRate(t *testing.T) {
	const ppm = 500
	for _, lease := range []time.Duration{3 * time.Second, DefaultLeaseDuration} {
		for _, width := range []time.Duration{0, 500 * time.Millisecond, time.Second, 1100 * time.Millisecond, 1250 * time.Millisecond, 1300 * time.Millisecond, 2 * time.Second, 23 * time.Second} {
			// The lower bound a few milliseconds below the server's clock
			// at most (a stamp wide by its upper bound: a wall clock
			// stepped forward, a renewal stamped a millisecond after a
			// previous one far ahead), at every phase of the second.
			for i := range 20 * 1000 {
				below, send := min(time.Duration(i/1000)*time.Millisecond, width), at(10*time.Second+time.Duration(i%1000)*time.Millisecond)
				rec := Record{LeaseDuration: metav1.Duration{Duration: lease}, Session: "holder"}
				stamp(&rec, servertime.Bounds{Earliest: send.Add(-below), Latest: send.Add(width - below)})
				_, in := Confirm(Live, Sighting{Lease: lease, Bounded: true, Uncertain: uncertainty(&rec, "holder")}, TakeoverMargin)
				// in on the taker's clock is this much in the server's.
				take := send.Add(in - in*ppm/1_000_000)
				date := take.Truncate(servertime.DateResolution)
				now := servertime.Bounds{Earliest: date, Latest: date.Add(servertime.DateResolution)}
				if !ServerPassedLockedTill(StopTill(&rec, RenewMargin), now, true, RenewMargin) {
					t.Fatalf("lease %s, estimate %s wide, %s below the server's clock, taker's clock %d ppm fast: taken over at %s, the holder's bound %s; a Date header of %s does not stop the holder",
						lease, width, below, ppm, take.Format(time.StampMilli), StopTill(&rec, RenewMargin).Format(time.StampMilli), date.Format(time.Stamp))
				}
			}
		}
	}
}
