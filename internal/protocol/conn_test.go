package protocol

import (
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/sleepclock"
)

// TestConnectCountsSleep: the real clock a caller passes (or none) becomes
// the one that counts time the machine spends asleep; an injected clock is
// kept as it is.
func TestConnectCountsSleep(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:1"}
	for _, clk := range []clock.Clock{nil, clock.RealClock{}, &clock.RealClock{}} {
		c, err := Connect(cfg, clk, "")
		if err != nil {
			t.Fatal(err)
		}
		if c.Clock() != sleepclock.System() || c.Estimator().Clock() != sleepclock.System() {
			t.Errorf("Connect(%T): clock %T, estimator's %T; want sleepclock.System()", clk, c.Clock(), c.Estimator().Clock())
		}
	}
	fake := clocktesting.NewFakeClock(time.Now())
	c, err := Connect(cfg, fake, "")
	if err != nil {
		t.Fatal(err)
	}
	if c.Clock() != fake || c.Estimator().Clock() != fake {
		t.Errorf("Connect(fake): clock %T, want the fake", c.Clock())
	}
}
