package sleepclock

import (
	"slices"
	"sort"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/chaos"
)

// Meter is implemented by clocks that can tell how much time passed between
// two of their readings, with and without the time the machine may have
// spent asleep.
type Meter interface {
	// Elapsed returns two estimates of the time from reading a to reading
	// b, lo <= hi: lo counts only time the machine certainly ran, hi also
	// any time it may have spent suspended (or that a stepped wall clock
	// claims). For a reading b after a, lo <= b.Sub(a) <= hi.
	Elapsed(a, b time.Time) (lo, hi time.Duration)
}

// Clock is a clock.Clock that is also a Meter.
type Clock interface {
	clock.Clock
	Meter
}

// Elapsed returns lower and upper estimates of the time from reading a to
// reading b of clk: clk's own when it is a Meter, else b.Sub(a) for both.
func Elapsed(clk clock.PassiveClock, a, b time.Time) (lo, hi time.Duration) {
	if m, ok := clk.(Meter); ok {
		return m.Elapsed(a, b)
	}
	d := b.Sub(a)
	return d, d
}

// IsReal reports whether clk reads the system's clock with time.Now and
// counts no sleep: clock.RealClock, whose place System takes.
func IsReal(clk clock.PassiveClock) bool {
	switch clk.(type) {
	case clock.RealClock, *clock.RealClock:
		return true
	}
	return false
}

// threshold is the least growth of the suspended total that is noted as a
// suspension: smaller changes are the jitter of sampling two clocks. The
// suspended time hi counts is thus at most this much short.
const threshold = time.Millisecond

var (
	systemOnce sync.Once
	systemClk  *system
)

// System returns the process's real clock: clock.RealClock whose Elapsed
// also counts time spent suspended (see the package documentation). There
// is one per process so that every reading's suspensions are noted in one
// place.
func System() Clock {
	systemOnce.Do(func() { systemClk = newSystem(chaosSuspended(suspendedSampler())) })
	return systemClk
}

// chaosSuspended returns sample, plus in chaos builds the simulated system
// sleeps of HELM_AUTORECOVER_CHAOS_SUSPEND_AT (see internal/chaos).
func chaosSuspended(sample func() (time.Duration, bool)) func() (time.Duration, bool) {
	if !chaos.Enabled || sample == nil {
		return sample
	}
	return func() (time.Duration, bool) {
		d, ok := sample()
		return d + chaos.Suspended(), ok
	}
}

// system is the real clock. With suspended set it notes, at each reading,
// the total time the machine has spent suspended; without it Elapsed
// cross-checks the wall clock.
type system struct {
	clock.RealClock
	// start is the reading monotonic offsets are measured from.
	start time.Time
	// suspended returns the total time the machine has been suspended
	// (boot time less monotonic time), false when it cannot tell.
	suspended func() (time.Duration, bool)

	mu sync.Mutex
	// sleeps are the readings, by monotonic offset from start, at which
	// the suspended total was seen to grow, both increasing.
	sleeps []sleep
}

type sleep struct {
	at, total time.Duration
}

func newSystem(suspended func() (time.Duration, bool)) *system {
	return &system{start: time.Now(), suspended: suspended}
}

// maxTries bounds Now's retries when the machine is suspended around a
// reading (each retry needs another suspension within microseconds).
const maxTries = 8

// Now returns time.Now(), having noted how long the machine had been
// suspended at that instant.
func (c *system) Now() time.Time {
	if chaos.Enabled {
		return c.now().Add(chaos.ClockOffset())
	}
	return c.now()
}

func (c *system) now() time.Time {
	if c.suspended == nil {
		return reading()
	}
	for i := 0; ; i++ {
		s1, ok1 := c.suspended()
		t := reading()
		s2, ok2 := c.suspended()
		if !ok1 || !ok2 {
			return t
		}
		// A suspension between the two samples cannot be placed before or
		// after t: read again.
		if s2-s1 < threshold || i == maxTries {
			c.note(t.Sub(c.start), s1)
			return t
		}
	}
}

// reading is time.Now(), less in chaos builds the time this process's clocks
// stood still in simulated stops of a virtual machine
// (HELM_AUTORECOVER_CHAOS_FREEZE_AT, see internal/chaos): monotonic and
// boot time stop alike, so the suspended total is not changed.
func reading() time.Time {
	if chaos.Enabled {
		return chaos.Now()
	}
	return time.Now()
}

// Since returns the monotonic time since t, as clock.RealClock does.
func (c *system) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// note records that the reading at monotonic offset off saw a suspended
// total of s. Readings from several goroutines may arrive out of order; the
// later of two readings never saw less suspension, so the notes stay a
// nondecreasing step function of the offset.
func (c *system) note(off, s time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := sort.Search(len(c.sleeps), func(i int) bool { return c.sleeps[i].at > off })
	var cur time.Duration
	if i > 0 {
		cur = c.sleeps[i-1].total
	}
	if s < cur+threshold {
		return
	}
	// Later notes that say no more than s are superseded by this one.
	j := i
	for j < len(c.sleeps) && c.sleeps[j].total <= s {
		j++
	}
	c.sleeps = slices.Replace(c.sleeps, i, j, sleep{at: off, total: s})
}

// sleptAt is the suspended total noted for the reading t, which must carry a
// monotonic reading.
func (c *system) sleptAt(t time.Time) time.Duration {
	off := t.Sub(c.start)
	c.mu.Lock()
	defer c.mu.Unlock()
	i := sort.Search(len(c.sleeps), func(i int) bool { return c.sleeps[i].at > off })
	if i == 0 {
		return 0
	}
	return c.sleeps[i-1].total
}

// Elapsed implements Meter. Readings without a monotonic component (not
// taken by time.Now, or stripped by Round(0)) tell nothing beyond b.Sub(a).
func (c *system) Elapsed(a, b time.Time) (lo, hi time.Duration) {
	d := b.Sub(a)
	if !hasMonotonic(a) || !hasMonotonic(b) {
		return d, d
	}
	if c.suspended == nil {
		return span(d, b.Round(0).Sub(a.Round(0)))
	}
	return span(d, d+c.sleptAt(b)-c.sleptAt(a))
}

// hasMonotonic reports whether t carries a monotonic clock reading, which
// Round(0) strips.
func hasMonotonic(t time.Time) bool {
	return t != t.Round(0)
}

func span(x, y time.Duration) (lo, hi time.Duration) {
	return min(x, y), max(x, y)
}
