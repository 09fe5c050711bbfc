package lock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestCountdownNamesTheTake is issue 35 item 3: every time a wait
// announces (the countdown of --lock-timeout, the refusal's "can be taken
// over in") is the time the client then takes the lock over, and a
// countdown never goes up. A client that first sees a dead holder's lock
// after its LOCKED TILL confirms the expiry on its own clock for a lease
// and the margin (Confirm); it used to announce the API server's expiry,
// then count up again when the confirmation started.
func TestCountdownNamesTheTake(t *testing.T) {
	const lease = 3 * time.Second
	const step = 100 * time.Millisecond
	w := newWorld(t)
	a := w.dated(0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, _, err := a.b.TryAcquire(ctx, req(OpUpgrade, lease)); err != nil {
		t.Fatal(err)
	}
	// The holder dies at once; the waiter starts a second later, so it
	// first sees the lock live and then watches it expire.
	w.advance(time.Second)
	c := w.dated(0, 0)

	_, _, err := c.b.TryAcquire(ctx, req(OpUpgrade, lease))
	var locked *LockedError
	if !errors.As(err, &locked) {
		t.Fatalf("the first try: %v; want refused", err)
	}
	refusedAt := c.clk.Now()
	announced := refusedAt.Add(locked.Left)

	type mark struct {
		at   time.Time
		left time.Duration
	}
	var mu sync.Mutex
	var marks []mark
	done := make(chan *part, 1)
	go func() {
		h, err := c.b.Wait(ctx, req(OpUpgrade, lease), func(_ *Record, left time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			marks = append(marks, mark{c.clk.Now(), left})
		})
		if err != nil {
			t.Error(err)
		}
		done <- h
	}()
	var tookAt time.Time
	for tookAt.IsZero() {
		select {
		case h := <-done:
			if h == nil {
				t.FailNow()
			}
			tookAt = c.clk.Now()
			continue
		case <-time.After(20 * time.Millisecond):
		}
		if c.clk.Now().Sub(refusedAt) > 30*time.Second {
			t.Fatal("the waiter did not take the lock over")
		}
		waitTimers(t, c, 1)
		w.advance(step)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(marks) == 0 {
		t.Fatal("no countdown")
	}
	// The refusal named the take, to the step the clocks moved by.
	if d := tookAt.Sub(announced); d < 0 || d > step+time.Millisecond {
		t.Errorf("refused at +0 with \"can be taken over in %v\"; taken over %v after that", locked.Left, tookAt.Sub(refusedAt))
	}
	for i, m := range marks {
		if i > 0 && m.left > marks[i-1].left {
			t.Errorf("the countdown went up: %v at %v, then %v at %v", marks[i-1].left, marks[i-1].at.Sub(refusedAt), m.left, m.at.Sub(refusedAt))
		}
		if d := tookAt.Sub(m.at.Add(m.left)); d < 0 || d > step+time.Millisecond {
			t.Errorf("at +%v the countdown said %v; taken over at +%v", m.at.Sub(refusedAt), m.left, tookAt.Sub(refusedAt))
		}
	}
}
