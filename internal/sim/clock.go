package sim

import (
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/sleepclock"
)

// Clock is a simulated client's clock (a sleepclock.Clock) on the
// bubble's virtual time: its readings are off by a fixed wall-clock offset,
// and a system sleep (Suspend) stops them (the monotonic clock stands still
// while the machine sleeps) while Elapsed's upper bound counts the sleep,
// as sleepclock.System does on Linux. Its timers are the bubble's.
type Clock struct {
	clock.RealClock
	offset time.Duration

	mu     sync.Mutex
	sleeps []sleepSpan // in order
}

// sleepSpan is one system sleep, in bubble time.
type sleepSpan struct{ from, to time.Time }

var _ sleepclock.Clock = (*Clock)(nil)

// NewClock returns a clock whose readings are offset from the bubble's.
func NewClock(offset time.Duration) *Clock { return &Clock{offset: offset} }

// Suspend puts the machine to sleep from now for d.
func (c *Clock) Suspend(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	c.sleeps = append(c.sleeps, sleepSpan{from: now, to: now.Add(d)})
}

// slept is the time the machine has slept by bubble instant t.
func (c *Clock) slept(t time.Time) time.Duration {
	var total time.Duration
	for _, s := range c.sleeps {
		switch {
		case !t.After(s.from):
		case t.Before(s.to):
			total += t.Sub(s.from)
		default:
			total += s.to.Sub(s.from)
		}
	}
	return total
}

// Now reads the clock: the bubble's time plus the offset, less the time
// slept so far.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	return now.Add(c.offset - c.slept(now))
}

// Since is Now().Sub(t).
func (c *Clock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// Elapsed implements sleepclock.Meter: lo is b.Sub(a); hi adds the sleeps
// that ended between the two readings. The clock stands still while the
// machine sleeps, so the reading taken as a sleep starts is also the one
// taken as it ends: a sleep read at a or at b counts, or hi would fall
// short of the time between a reading before it and one after (the
// bubble's time does not move between a request that ends with the sleep
// and the next reading; seed 4136: a write sent at the instant a 4.5 s
// sleep ended was judged on the clock's reading alone, 1.6 s after the
// lock expired).
func (c *Clock) Elapsed(a, b time.Time) (lo, hi time.Duration) {
	d := b.Sub(a)
	c.mu.Lock()
	defer c.mu.Unlock()
	var extra time.Duration
	var sleptBefore time.Duration
	for _, s := range c.sleeps {
		// The reading at the end of this sleep.
		at := s.from.Add(c.offset - sleptBefore)
		length := s.to.Sub(s.from)
		if !at.After(b) && !at.Before(a) {
			extra += length
		}
		sleptBefore += length
	}
	if d < 0 {
		return d, d
	}
	return d, d + extra
}

// extend adds to d what is left of a sleep the machine is in: a suspended
// process runs no timer, so one started during a sleep (by a goroutine the
// simulation still runs, unlike a real suspended process) fires only after
// it, its readings standing still meanwhile.
func (c *Clock) extend(d time.Duration) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	for _, s := range c.sleeps {
		if !now.Before(s.from) && now.Before(s.to) {
			d = max(d, 0) + s.to.Sub(now)
		}
	}
	return d
}

// After is the bubble's, started after any sleep in progress.
func (c *Clock) After(d time.Duration) <-chan time.Time { return c.RealClock.After(c.extend(d)) }

// NewTimer is the bubble's, started after any sleep in progress.
func (c *Clock) NewTimer(d time.Duration) clock.Timer { return c.RealClock.NewTimer(c.extend(d)) }

// Sleep is the bubble's, started after any sleep in progress.
func (c *Clock) Sleep(d time.Duration) { c.RealClock.Sleep(c.extend(d)) }
