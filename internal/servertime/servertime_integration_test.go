package servertime_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// skewedClock is the real clock read as if this machine's wall clock were
// off by skew. It notes the true instant of its last reading, so that a
// test compares the estimator's bounds with the server's clock at the very
// instant the estimator read its clock (the API server runs on this
// machine: its clock is this machine's true clock).
type skewedClock struct {
	clock.RealClock
	skew time.Duration

	mu   sync.Mutex
	last time.Time
}

func (c *skewedClock) Now() time.Time {
	now := time.Now()
	c.mu.Lock()
	c.last = now
	c.mu.Unlock()
	return now.Add(c.skew)
}

func (c *skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// lastTrue is the true instant of the last reading.
func (c *skewedClock) lastTrue() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// TestIntegrationBoundsHoldServerClock: against the real API server, clients
// whose clocks are 10 minutes off either way bracket the server clock, after
// one request and at every step of probing. How narrow probing makes the
// bracket is a figure (printed; TestProbingNarrowsBounds asserts that
// probing narrows it, on a simulated clock).
func TestIntegrationBoundsHoldServerClock(t *testing.T) {
	env := testenv.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, skew := range []time.Duration{10 * time.Minute, -10 * time.Minute} {
		clk := &skewedClock{skew: skew}
		est := servertime.New(clk)
		cs, err := kubernetes.NewForConfig(est.Instrument(env.Config))
		if err != nil {
			t.Fatal(err)
		}
		if err := est.Sync(ctx, cs.Discovery()); err != nil {
			t.Fatal(err)
		}
		check := func(when string) servertime.Bounds {
			// Nothing else reads clk meanwhile: requests are made by this
			// goroutine only.
			b, ok := est.Now()
			truth := clk.lastTrue()
			if !ok || truth.Before(b.Earliest) || truth.After(b.Latest) {
				t.Fatalf("skew %v, %s: server clock %v outside [%v, %v]", skew, when, truth, b.Earliest, b.Latest)
			}
			return b
		}
		first := check("after one request")
		probes := 0
		for probes < 15 {
			at, ok := est.ProbeAt(clk.Now(), 20*time.Millisecond)
			if !ok {
				break
			}
			time.Sleep(at.Sub(clk.Now())) // the instant the probe is meant for, not a synchronisation
			if err := est.Probe(ctx, cs.Discovery()); err != nil {
				t.Fatal(err)
			}
			probes++
			check("while probing")
		}
		last := check("after probing")
		t.Logf("FIGURE skew %v: bounds %v wide after one request, %v after %d probes", skew, first.Width(), last.Width(), probes)
	}
}
