package sleepclock

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

var epoch = time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)

func TestElapsedOfPlainClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	a := clk.Now()
	clk.Step(3 * time.Second)
	if lo, hi := Elapsed(clk, a, clk.Now()); lo != 3*time.Second || hi != 3*time.Second {
		t.Errorf("Elapsed = %v, %v; want 3s, 3s", lo, hi)
	}
}

func TestIsReal(t *testing.T) {
	for _, c := range []struct {
		clk  clock.PassiveClock
		want bool
	}{
		{clock.RealClock{}, true},
		{&clock.RealClock{}, true},
		{System(), false},
		{NewFake(epoch), false},
		{clocktesting.NewFakeClock(epoch), false},
	} {
		if got := IsReal(c.clk); got != c.want {
			t.Errorf("IsReal(%T) = %v, want %v", c.clk, got, c.want)
		}
	}
}

// fakeSuspension stands for the kernel's suspended total.
type fakeSuspension struct{ total atomic.Int64 }

func (f *fakeSuspension) sample() (time.Duration, bool) {
	return time.Duration(f.total.Load()), true
}

func (f *fakeSuspension) suspend(d time.Duration) { f.total.Add(int64(d)) }

func TestSystemCountsSuspension(t *testing.T) {
	var s fakeSuspension
	s.suspend(time.Hour) // suspended before this process started
	c := newSystem(s.sample)
	a := c.Now()
	s.suspend(10 * time.Second)
	b := c.Now()
	s.suspend(threshold / 2) // sampling jitter, not a suspension
	d := c.Now()

	lo, hi := c.Elapsed(a, b)
	if lo != b.Sub(a) || hi != lo+10*time.Second {
		t.Errorf("across a 10s suspension: Elapsed = %v, %v; want %v, %v", lo, hi, b.Sub(a), b.Sub(a)+10*time.Second)
	}
	if lo, hi := c.Elapsed(b, d); lo != d.Sub(b) || hi != lo {
		t.Errorf("across jitter: Elapsed = %v, %v; want %v twice", lo, hi, d.Sub(b))
	}
	if lo, hi := c.Elapsed(b, a); lo != a.Sub(b)-10*time.Second || hi != a.Sub(b) {
		t.Errorf("backwards: Elapsed = %v, %v", lo, hi)
	}
	// A reading derived from one after the suspension is after it too.
	if _, hi := c.Elapsed(a, b.Add(time.Second)); hi != b.Add(time.Second).Sub(a)+10*time.Second {
		t.Errorf("derived reading: hi = %v", hi)
	}
	// Readings without a monotonic component tell nothing more.
	if lo, hi := c.Elapsed(a.Round(0), b.Round(0)); lo != hi {
		t.Errorf("stripped readings: Elapsed = %v, %v; want equal", lo, hi)
	}
}

func TestSystemNotesOutOfOrder(t *testing.T) {
	c := newSystem(func() (time.Duration, bool) { return 0, true })
	// Readings noted out of order: the one at 5s saw 10s suspended, then
	// the one at 3s reports that it had too.
	c.note(5*time.Second, 10*time.Second)
	c.note(3*time.Second, 10*time.Second)
	c.note(1*time.Second, 0)
	c.note(7*time.Second, 10*time.Second+threshold/2)
	c.note(9*time.Second, 30*time.Second)
	want := []sleep{{3 * time.Second, 10 * time.Second}, {9 * time.Second, 30 * time.Second}}
	if len(c.sleeps) != len(want) {
		t.Fatalf("sleeps = %v, want %v", c.sleeps, want)
	}
	for i := range want {
		if c.sleeps[i] != want[i] {
			t.Fatalf("sleeps = %v, want %v", c.sleeps, want)
		}
	}
}

// TestSystemConcurrentReadings: readings from several goroutines while the
// machine is suspended now and then keep lo the monotonic time, and hi counts
// no more than was suspended between them.
func TestSystemConcurrentReadings(t *testing.T) {
	var s fakeSuspension
	c := newSystem(s.sample)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				s0, _ := s.sample()
				a := c.Now()
				b := c.Now()
				s1, _ := s.sample()
				lo, hi := c.Elapsed(a, b)
				if lo != b.Sub(a) || hi < lo || hi-lo > s1-s0+threshold {
					t.Errorf("Elapsed = %v, %v for b-a = %v, %v suspended", lo, hi, b.Sub(a), s1-s0)
					return
				}
			}
		}()
	}
	for i := 0; i < 50; i++ {
		s.suspend(time.Second)
		runtime.Gosched()
	}
	wg.Wait()
}

func TestSystemClock(t *testing.T) {
	c := System()
	a := c.Now()
	b := c.Now()
	lo, hi := c.Elapsed(a, b)
	if lo < 0 || hi < lo || lo != b.Sub(a) {
		t.Errorf("Elapsed = %v, %v for b-a = %v", lo, hi, b.Sub(a))
	}
	if runtime.GOOS == "linux" {
		sys := c.(*system)
		if sys.suspended == nil {
			t.Fatal("no CLOCK_BOOTTIME on Linux")
		}
		if s, ok := sys.suspended(); !ok || s < 0 {
			t.Errorf("suspended() = %v, %v", s, ok)
		}
		// Unless the test machine slept within, nothing was suspended.
		if hi-lo >= threshold {
			t.Logf("hi - lo = %v: did the machine sleep?", hi-lo)
		}
	}
}

func TestFakeSuspend(t *testing.T) {
	f := NewFake(epoch)
	a := f.Now()
	timer := f.NewTimer(time.Second)
	f.Step(500 * time.Millisecond)
	b := f.Now()
	f.Suspend(time.Minute)
	c := f.Now()
	f.Suspend(time.Minute)
	d := f.Now()
	select {
	case <-timer.C():
		t.Fatal("a timer fired while the machine was suspended")
	default:
	}
	for _, tc := range []struct {
		name         string
		from, to     time.Time
		wantLo, want time.Duration
	}{
		{"awake", a, b, 500 * time.Millisecond, 500 * time.Millisecond},
		{"across one", b, c, time.Nanosecond, time.Nanosecond + time.Minute},
		{"across both", a, d, 500*time.Millisecond + 2*time.Nanosecond, 500*time.Millisecond + 2*time.Nanosecond + 2*time.Minute},
		{"between", c, d, time.Nanosecond, time.Nanosecond + time.Minute},
		{"at once", d, d, 0, 0},
	} {
		if lo, hi := Elapsed(f, tc.from, tc.to); lo != tc.wantLo || hi != tc.want {
			t.Errorf("%s: Elapsed = %v, %v; want %v, %v", tc.name, lo, hi, tc.wantLo, tc.want)
		}
	}
}
