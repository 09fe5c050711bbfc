package servertime

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
)

// serverEpoch is the API server's true time at the start of every case.
var serverEpoch = time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)

type obsSpec struct {
	// at is the local offset from the start at which the request is sent;
	// rtt is its round trip; gen is when, after sending, the server wrote
	// the response.
	at, rtt, gen time.Duration
	// serverStep moves the true server clock before this request.
	serverStep time.Duration
}

func drift(d time.Duration) time.Duration { return d / driftDivisor }

func TestEstimator(t *testing.T) {
	cases := []struct {
		name string
		// skew is how far the local wall clock is off the server's.
		skew time.Duration
		obs  []obsSpec
		// after is how long after the last observation's receipt Now is read.
		after        time.Duration
		wantEarliest time.Duration // offset from serverEpoch
		wantLatest   time.Duration
		wantResets   int
	}{
		{
			name:         "one response, read at once",
			obs:          []obsSpec{{at: 300 * time.Millisecond, rtt: 100 * time.Millisecond, gen: 50 * time.Millisecond}},
			wantEarliest: 0, // Date says :26, received 0.4 s in
			wantLatest:   time.Second + 100*time.Millisecond + drift(100*time.Millisecond),
		},
		{
			name:         "one response, local clock 10 minutes ahead",
			skew:         10 * time.Minute,
			obs:          []obsSpec{{at: 300 * time.Millisecond, rtt: 100 * time.Millisecond, gen: 50 * time.Millisecond}},
			wantEarliest: 0,
			wantLatest:   time.Second + 100*time.Millisecond + drift(100*time.Millisecond),
		},
		{
			name:         "one response, local clock 10 minutes behind",
			skew:         -10 * time.Minute,
			obs:          []obsSpec{{at: 300 * time.Millisecond, rtt: 100 * time.Millisecond, gen: 50 * time.Millisecond}},
			wantEarliest: 0,
			wantLatest:   time.Second + 100*time.Millisecond + drift(100*time.Millisecond),
		},
		{
			name:         "bounds advance with local elapsed time, widened by drift",
			skew:         -10 * time.Minute,
			obs:          []obsSpec{{at: 300 * time.Millisecond, rtt: 100 * time.Millisecond, gen: 50 * time.Millisecond}},
			after:        10 * time.Second,
			wantEarliest: 10*time.Second - drift(10*time.Second),
			wantLatest:   11*time.Second + 100*time.Millisecond + drift(10*time.Second+100*time.Millisecond),
		},
		{
			name: "intersection keeps the largest lower and smallest upper bound",
			obs: []obsSpec{
				// Sent at 0.95, generated at 1.0: Date :27, a tight lower bound.
				{at: 950 * time.Millisecond, rtt: 200 * time.Millisecond, gen: 50 * time.Millisecond},
				// Sent at 1.99, generated at 1.995: Date :27, a tight upper bound.
				{at: 1990 * time.Millisecond, rtt: 10 * time.Millisecond, gen: 5 * time.Millisecond},
			},
			// Read at local 2.0 s: lower bound from the first (1.0 + 0.85 s
			// elapsed since its receipt), upper from the second.
			wantEarliest: 1850*time.Millisecond - drift(850*time.Millisecond),
			wantLatest:   2*time.Second + 10*time.Millisecond + drift(10*time.Millisecond),
		},
		{
			name: "a server clock step backwards resets to the newest response",
			obs: []obsSpec{
				{at: 0, rtt: 100 * time.Millisecond, gen: 50 * time.Millisecond},
				{at: 5 * time.Second, rtt: 100 * time.Millisecond, gen: 50 * time.Millisecond, serverStep: -time.Minute},
			},
			wantEarliest: -55 * time.Second,
			wantLatest:   -54*time.Second + 100*time.Millisecond + drift(100*time.Millisecond),
			wantResets:   1,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := serverEpoch.Add(tc.skew)
			clk := clocktesting.NewFakeClock(start)
			est := New(clk)
			if _, ok := est.Now(); ok {
				t.Fatal("Now() reported a time before any observation")
			}
			var serverOffset time.Duration
			for _, o := range tc.obs {
				serverOffset += o.serverStep
				clk.SetTime(start.Add(o.at))
				sent := clk.Now()
				genServer := serverEpoch.Add(o.at + o.gen + serverOffset)
				clk.SetTime(start.Add(o.at + o.rtt))
				est.Observe(sent, clk.Now(), genServer.Truncate(time.Second))
			}
			clk.Step(tc.after)
			b, ok := est.Now()
			if !ok {
				t.Fatal("Now() reported no time after observations")
			}
			if got := b.Earliest.Sub(serverEpoch); got != tc.wantEarliest {
				t.Errorf("Earliest = epoch%+v, want epoch%+v", got, tc.wantEarliest)
			}
			if got := b.Latest.Sub(serverEpoch); got != tc.wantLatest {
				t.Errorf("Latest = epoch%+v, want epoch%+v", got, tc.wantLatest)
			}
			if est.resets != tc.wantResets {
				t.Errorf("resets = %d, want %d", est.resets, tc.wantResets)
			}
		})
	}
}

func TestObserveIgnoresImpossibleReadings(t *testing.T) {
	clk := clocktesting.NewFakeClock(serverEpoch)
	est := New(clk)
	est.Observe(serverEpoch.Add(time.Second), serverEpoch, serverEpoch)  // received before sent
	est.Observe(serverEpoch, serverEpoch.Add(time.Hour), serverEpoch)    // received in the future
	est.Observe(serverEpoch.Add(-time.Second), serverEpoch, time.Time{}) // no date
	if b, ok := est.Now(); ok {
		t.Fatalf("Now() = %+v, true; want no estimate", b)
	}
}

// TestBoundsAlwaysHoldTrueTime simulates many requests against a server whose
// clock is offset arbitrarily from the local one and checks that the bounds
// always contain the true server time.
func TestBoundsAlwaysHoldTrueTime(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 200; trial++ {
		localStart := serverEpoch.Add(time.Duration(rng.Int64N(int64(48*time.Hour))) - 24*time.Hour)
		clk := clocktesting.NewFakeClock(localStart)
		est := New(clk)
		serverAt := func(local time.Time) time.Time { return serverEpoch.Add(local.Sub(localStart)) }
		for i := 0; i < 20; i++ {
			clk.Step(time.Duration(rng.Int64N(int64(3 * time.Second))))
			sent := clk.Now()
			gen := time.Duration(rng.Int64N(int64(300 * time.Millisecond)))
			clk.Step(gen)
			date := serverAt(clk.Now()).Truncate(time.Second)
			clk.Step(time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
			est.Observe(sent, clk.Now(), date)
			clk.Step(time.Duration(rng.Int64N(int64(2 * time.Second))))
			b, _ := est.Now()
			truth := serverAt(clk.Now())
			if truth.Before(b.Earliest) || truth.After(b.Latest) {
				t.Fatalf("trial %d step %d: true server time %v outside [%v, %v]", trial, i, truth, b.Earliest, b.Latest)
			}
		}
	}
}

func TestWrapTransportAndSync(t *testing.T) {
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Date", serverEpoch.Format(http.TimeFormat))
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"major":"1","minor":"37"}`))
	}))
	defer srv.Close()

	clk := clocktesting.NewFakeClock(serverEpoch.Add(10 * time.Minute))
	est := New(clk)
	dc, err := discovery.NewDiscoveryClientForConfig(est.Instrument(&rest.Config{Host: srv.URL}))
	if err != nil {
		t.Fatal(err)
	}
	if err := est.Sync(context.Background(), dc); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	b, ok := est.Now()
	if !ok {
		t.Fatal("no estimate after Sync")
	}
	// The fake clock does not move during the request, so the bounds are
	// exactly one Date resolution wide.
	if !b.Earliest.Equal(serverEpoch) || !b.Latest.Equal(serverEpoch.Add(time.Second)) {
		t.Errorf("bounds = [%v, %v], want [%v, %v]", b.Earliest, b.Latest, serverEpoch, serverEpoch.Add(time.Second))
	}
	if err := est.Sync(context.Background(), dc); err != nil {
		t.Fatalf("second Sync: %v", err)
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("server saw %d requests, want 1 (Sync must not call again once time is known)", n)
	}
}

func TestSyncWithoutInstrumentedClientFails(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	est := New(clocktesting.NewFakeClock(serverEpoch))
	dc, err := discovery.NewDiscoveryClientForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	if err := est.Sync(context.Background(), dc); err == nil {
		t.Fatal("Sync succeeded although the client does not feed the estimator")
	}
}

// TestProbingNarrowsBounds sends requests at the instants ProbeAt picks to a
// simulated server with an arbitrary offset and checks that a handful of
// them narrow the bounds to about a round trip, never losing the truth.
func TestProbingNarrowsBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const rtt = 4 * time.Millisecond
	const want = 50 * time.Millisecond
	worst := 0
	for trial := 0; trial < 200; trial++ {
		localStart := serverEpoch.Add(time.Duration(rng.Int64N(int64(time.Hour))) - 30*time.Minute)
		clk := clocktesting.NewFakeClock(localStart)
		est := New(clk)
		serverAt := func(local time.Time) time.Time { return serverEpoch.Add(local.Sub(localStart)) }
		request := func() {
			sent := clk.Now()
			gen := time.Duration(rng.Int64N(int64(rtt)))
			clk.Step(gen)
			date := serverAt(clk.Now()).Truncate(time.Second)
			clk.Step(rtt - gen)
			est.Observe(sent, clk.Now(), date)
		}
		request()
		probes := 0
		for {
			at, ok := est.ProbeAt(clk.Now(), want)
			if !ok {
				break
			}
			if d := at.Sub(clk.Now()); d < 0 || d >= time.Second {
				t.Fatalf("ProbeAt %v from now, want within the next second", d)
			}
			clk.SetTime(at)
			request()
			probes++
			b, _ := est.Now()
			if truth := serverAt(clk.Now()); truth.Before(b.Earliest) || truth.After(b.Latest) {
				t.Fatalf("trial %d: truth %v outside [%v, %v]", trial, truth, b.Earliest, b.Latest)
			}
			if probes > 12 {
				t.Fatalf("trial %d: still %v wide after %d probes", trial, b.Width(), probes)
			}
		}
		worst = max(worst, probes)
	}
	t.Logf("at most %d probes to narrow 1s to %v", worst, want)
}

// TestSettle checks Settle against a simulated server on a fake clock: it
// never says the server passed t before the server did, it answers at once
// when the bounds already decide, while they straddle t it answers within
// the bounds' width of the true crossing, and its probes make that sooner.
func TestSettle(t *testing.T) {
	withProbes := settleTrials(t, true)
	without := settleTrials(t, false)
	t.Logf("answered on average %v after the true crossing with probes, %v without", withProbes, without)
	if withProbes >= without {
		t.Errorf("probes did not help: mean lateness %v with, %v without", withProbes, without)
	}
}

// settleTrials runs Settle on 200 random cases and returns how long after
// the server's true crossing of the target it said so, on average.
func settleTrials(t *testing.T, probing bool) time.Duration {
	rng := rand.New(rand.NewPCG(5, 6))
	var late time.Duration
	waits := 0
	for trial := 0; trial < 200; trial++ {
		localStart := serverEpoch.Add(time.Duration(rng.Int64N(int64(time.Hour))) - 30*time.Minute)
		clk := clocktesting.NewFakeClock(localStart)
		est := New(clk)
		phase := time.Duration(rng.Int64N(int64(time.Second)))
		serverAt := func(local time.Time) time.Time { return serverEpoch.Add(phase + local.Sub(localStart)) }
		probe := func(context.Context) error {
			now := clk.Now()
			est.Observe(now, now, serverAt(now).Truncate(time.Second))
			return nil
		}
		_ = probe(context.Background())
		b, _ := est.Now()
		// A target anywhere from before the bounds to after them.
		target := b.Earliest.Add(time.Duration(rng.Int64N(int64(b.Width()+time.Second))) - 500*time.Millisecond)
		start := clk.Now()
		type answer struct {
			past bool
			err  error
			at   time.Time
		}
		done := make(chan answer, 1)
		go func() {
			p := probe
			if !probing {
				p = nil
			}
			past, err := est.Settle(context.Background(), clk, target, p)
			done <- answer{past, err, clk.Now()}
		}()
		var got answer
	wait:
		for steps := 0; ; steps++ {
			select {
			case got = <-done:
				break wait
			default:
			}
			if steps > 5000 {
				t.Fatalf("trial %d: Settle still waiting after %v", trial, clk.Now().Sub(start))
			}
			if clk.HasWaiters() {
				clk.Step(time.Millisecond)
			} else {
				time.Sleep(50 * time.Microsecond)
			}
		}
		if got.err != nil {
			t.Fatalf("trial %d: %v", trial, got.err)
		}
		truth := serverAt(got.at)
		waited := got.at.Sub(start)
		switch {
		case got.past && !truth.After(target):
			t.Fatalf("trial %d: said past at server time %v, before target %v", trial, truth, target)
		case !got.past && truth.After(target):
			t.Fatalf("trial %d: said not past at server time %v, after target %v", trial, truth, target)
		case !target.Before(b.Latest) && waited > 0:
			t.Fatalf("trial %d: target after the upper bound, but waited %v", trial, waited)
		case target.Before(b.Earliest) && waited > 0:
			t.Fatalf("trial %d: target before the lower bound, but waited %v", trial, waited)
		case waited > b.Width()+10*time.Millisecond:
			t.Fatalf("trial %d: waited %v, more than the bounds' width %v", trial, waited, b.Width())
		}
		if got.past && waited > 0 {
			late += truth.Sub(target)
			waits++
		}
	}
	if waits < 20 {
		t.Fatalf("only %d of 200 trials had to wait", waits)
	}
	return late / time.Duration(waits)
}

func TestSettleEndsWithContext(t *testing.T) {
	clk := clocktesting.NewFakeClock(serverEpoch)
	est := New(clk)
	est.Observe(clk.Now(), clk.Now(), serverEpoch)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := est.Settle(ctx, clk, serverEpoch.Add(500*time.Millisecond), nil); err == nil {
		t.Fatal("Settle with an ended context returned no error")
	}
	if _, err := New(clk).Settle(context.Background(), clk, serverEpoch, nil); err == nil {
		t.Fatal("Settle without observations returned no error")
	}
}
