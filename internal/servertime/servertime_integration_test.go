package servertime_test

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type skewedClock struct {
	clock.RealClock
	skew time.Duration
}

func (c skewedClock) Now() time.Time                  { return time.Now().Add(c.skew) }
func (c skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// TestIntegrationBoundsHoldServerClock: against the real API server (which
// runs on this machine, so its clock is this machine's true clock), clients
// whose clocks are 10 minutes off either way bracket the server clock, and
// probing narrows the bracket from a second to a few milliseconds.
func TestIntegrationBoundsHoldServerClock(t *testing.T) {
	env := testenv.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, skew := range []time.Duration{10 * time.Minute, -10 * time.Minute} {
		clk := skewedClock{skew: skew}
		est := servertime.New(clk)
		cs, err := kubernetes.NewForConfig(est.Instrument(env.Config))
		if err != nil {
			t.Fatal(err)
		}
		if err := est.Sync(ctx, cs.Discovery()); err != nil {
			t.Fatal(err)
		}
		check := func(when string) servertime.Bounds {
			b, ok := est.Now()
			truth := time.Now()
			if !ok || truth.Before(b.Earliest) || truth.After(b.Latest) {
				t.Fatalf("skew %v, %s: server clock %v outside [%v, %v]", skew, when, truth, b.Earliest, b.Latest)
			}
			return b
		}
		first := check("after one request")
		probes := 0
		for {
			at, ok := est.ProbeAt(clk.Now(), 20*time.Millisecond)
			if !ok {
				break
			}
			time.Sleep(at.Sub(clk.Now()))
			if err := est.Probe(ctx, cs.Discovery()); err != nil {
				t.Fatal(err)
			}
			probes++
			check("while probing")
			if probes > 15 {
				break
			}
		}
		last := check("after probing")
		t.Logf("skew %v: bounds %v wide after one request, %v after %d probes", skew, first.Width(), last.Width(), probes)
		if last.Width() > 100*time.Millisecond {
			t.Errorf("skew %v: bounds still %v wide after %d probes", skew, last.Width(), probes)
		}
	}
}
