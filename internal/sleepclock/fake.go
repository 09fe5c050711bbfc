package sleepclock

import (
	"sync"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// Fake is a fake clock (k8s.io/utils/clock/testing.FakeClock) whose machine
// can be suspended. Its readings and timers stand for the monotonic clock:
// Step and SetTime move them as usual, and Elapsed gives lo == hi == b.Sub(a)
// across them. Suspend puts the machine to sleep: the readings and the
// timers stand still, while the sleep-counting clock (hi) jumps ahead. The
// same model fits a wall clock stepped forward where the wall clock is the
// sleep-counting one.
type Fake struct {
	*clocktesting.FakeClock

	mu sync.Mutex
	// sleeps are the suspensions so far, by the first reading they precede.
	sleeps []fakeSleep
}

// fakeSleep is a suspension: total is the time suspended by the readings
// from at on.
type fakeSleep struct {
	at    time.Time
	total time.Duration
}

var _ Clock = (*Fake)(nil)

// NewFake returns a Fake reading t.
func NewFake(t time.Time) *Fake {
	return &Fake{FakeClock: clocktesting.NewFakeClock(t)}
}

// Suspend simulates the machine sleeping for d: between a reading taken
// before the call and one taken after it, Elapsed's hi counts d more than
// lo. To tell those readings apart, the clock moves on by one nanosecond
// (no real clock reads the same across a suspension); no timer fires for
// the sleep itself.
func (f *Fake) Suspend(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Step(time.Nanosecond)
	var total time.Duration
	if n := len(f.sleeps); n > 0 {
		total = f.sleeps[n-1].total
	}
	f.sleeps = append(f.sleeps, fakeSleep{at: f.Now(), total: total + d})
}

// Elapsed implements Meter: lo is b.Sub(a), hi adds the suspensions between
// the two readings.
func (f *Fake) Elapsed(a, b time.Time) (lo, hi time.Duration) {
	d := b.Sub(a)
	return span(d, d+f.sleptAt(b)-f.sleptAt(a))
}

func (f *Fake) sleptAt(t time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var total time.Duration
	for _, s := range f.sleeps {
		if !s.at.After(t) {
			total = s.total
		}
	}
	return total
}
