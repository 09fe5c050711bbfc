package lock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
	"github.com/helm-autorecover/helm-autorecover/internal/sleepclock"
)

// TestHolderThatSleptStopsWriting: a holder whose machine slept past its
// lease wakes with its monotonic clock where it was. Its lock must read as
// lost (Valid, Deadline) before it writes again, its keeper must report the
// loss without renewing, and the next holder must be able to take over.
func TestHolderThatSleptStopsWriting(t *testing.T) {
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

	clk.Step(500 * time.Millisecond)
	if err := held.Valid(); err != nil {
		t.Fatalf("Valid before the sleep: %v", err)
	}
	updates := leaseUpdates(store)

	clk.Suspend(10 * time.Second) // the laptop lid closes, and opens
	if err := held.Valid(); !errors.Is(err, ErrLost) {
		t.Fatalf("Valid after sleeping past the lease = %v, want ErrLost", err)
	}
	if d := held.Deadline(); clk.Now().Before(d) {
		t.Errorf("Deadline %v still ahead of now %v after sleeping past the lease", d, clk.Now())
	}
	if err := held.SetRevision(ctx, 2); !errors.Is(err, ErrLost) {
		t.Errorf("SetRevision after the sleep = %v, want ErrLost", err)
	}
	// The keeper's timers did not fire during the sleep; once one does it
	// reports the loss rather than renewing.
	for steps := 0; ; steps++ {
		if steps > 100 {
			t.Fatalf("no loss reported %v after the sleep", 100*100*time.Millisecond)
		}
		select {
		case err := <-lost:
			if !errors.Is(err, ErrLost) {
				t.Errorf("onLost(%v), want ErrLost", err)
			}
			if n := leaseUpdates(store); n != updates {
				t.Errorf("%d lease updates after the sleep, want none", n-updates)
			}
			return
		default:
		}
		if clk.HasWaiters() {
			clk.Step(100 * time.Millisecond)
		} else {
			time.Sleep(time.Millisecond)
		}
	}
}

func leaseUpdates(s *casLeases) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls["update"]
}
