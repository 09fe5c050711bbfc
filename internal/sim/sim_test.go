package sim

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

var (
	flagN        = flag.Int("sim.n", 0, "random schedules to explore (0: 2000, or 200 with -short)")
	flagFrom     = flag.Int64("sim.seed", 1, "the first random schedule's seed")
	flagShard    = flag.String("sim.shard", "0/1", "explore only the seeds i mod n (i/n), to spread them over processes")
	flagTrace    = flag.Bool("sim.trace", false, "print every schedule's trace")
	flagStuck    = flag.Duration("sim.stuck", 3*time.Minute, "real time after which a schedule counts as stuck")
	flagProgress = flag.Bool("sim.progress", false, "print each seed as it starts, to stderr")
	flagOut      = flag.String("sim.report", "", "append the figures as one line of key=value pairs to this file")
)

// runOne runs s in a bubble of its own.
func runOne(t *testing.T, s Schedule) Outcome {
	t.Helper()
	var out Outcome
	// A schedule runs in milliseconds; one that runs for minutes is stuck
	// outside virtual time (a goroutine blocked on something synctest does
	// not count as durable, such as a sync.Mutex held across a request):
	// print every goroutine and stop, naming the schedule.
	watchdog := time.AfterFunc(*flagStuck, func() {
		buf := make([]byte, 1<<24)
		n := runtime.Stack(buf, true)
		fmt.Fprintf(os.Stderr, "sim: schedule %d is stuck after %s of real time:\n%s\n%s\n", s.Seed, *flagStuck, s, buf[:n])
		os.Exit(2)
	})
	defer watchdog.Stop()
	synctest.Test(t, func(*testing.T) { out = Run(s) })
	return out
}

// tally sums the figures of many outcomes.
type tally struct {
	schedules, violations                                 int
	crashes, crashesCommitted, pauses, sleeps, offs, date int
	faults                                                Counts
	requests                                              int
	maxRecovery                                           time.Duration
	firstBad                                              []string
}

func (ty *tally) add(o Outcome) {
	ty.schedules++
	ty.violations += len(o.Violations)
	for _, r := range o.Results {
		p := r.Plan
		if r.Crashed {
			ty.crashes++
			if p.CrashCommits {
				ty.crashesCommitted++
			}
		}
		if p.PauseAt > 0 && p.PauseAt <= r.Counts.Requests {
			ty.pauses++
		}
		if p.SleepAt > 0 && p.SleepAt <= r.Counts.Requests {
			ty.sleeps++
		}
		if p.Offset != 0 {
			ty.offs++
		}
		if p.DateShift != 0 {
			ty.date++
		}
		c := r.Counts
		ty.faults.Requests += c.Requests
		ty.faults.Reset += c.Reset
		ty.faults.Lost += c.Lost
		ty.faults.Throttle += c.Throttle
		ty.faults.Unavailable += c.Unavailable
		ty.faults.Conflict += c.Conflict
	}
	for _, n := range o.Requests {
		ty.requests += n
	}
	ty.maxRecovery = max(ty.maxRecovery, o.Recovery)
}

func (ty *tally) String() string {
	return fmt.Sprintf("schedules=%d violations=%d crashes=%d crashes_committed=%d pauses=%d sleeps=%d clock_offsets=%d date_shifts=%d requests=%d resets=%d lost_answers=%d throttled=%d unavailable=%d conflicts=%d max_final_recovery=%s",
		ty.schedules, ty.violations, ty.crashes, ty.crashesCommitted, ty.pauses, ty.sleeps, ty.offs, ty.date, ty.requests,
		ty.faults.Reset, ty.faults.Lost, ty.faults.Throttle, ty.faults.Unavailable, ty.faults.Conflict, ty.maxRecovery.Round(time.Millisecond))
}

func report(t *testing.T, name string, ty *tally, elapsed time.Duration) {
	t.Helper()
	line := fmt.Sprintf("group=%s %s wall=%s", name, ty, elapsed.Round(time.Second))
	t.Log(line)
	fmt.Println("sim:", line)
	if *flagOut != "" {
		f, err := os.OpenFile(*flagOut, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := fmt.Fprintln(f, line); err != nil {
			t.Fatal(err)
		}
	}
}

func shard() (int64, int64) {
	i, n, ok := strings.Cut(*flagShard, "/")
	a, err1 := strconv.ParseInt(i, 10, 64)
	b, err2 := strconv.ParseInt(n, 10, 64)
	if !ok || err1 != nil || err2 != nil || b < 1 || a < 0 || a >= b {
		panic("-sim.shard must be i/n with 0 <= i < n")
	}
	return a, b
}

// TestSimRandom explores random schedules (make sim: 100,000 of them).
func TestSimRandom(t *testing.T) {
	n := *flagN
	if n == 0 {
		n = 2000
		if testing.Short() {
			n = 200
		}
	}
	i, of := shard()
	var ty tally
	start := time.Now()
	for seed := *flagFrom; seed < *flagFrom+int64(n); seed++ {
		if seed%of != i {
			continue
		}
		if *flagProgress {
			fmt.Fprintf(os.Stderr, "sim: seed %d\n", seed)
		}
		o := runOne(t, Draw(seed))
		ty.add(o)
		if *flagTrace {
			t.Log(o.Trace())
		}
		if len(o.Violations) > 0 {
			t.Errorf("seed %d: %d violations (replay: go test ./internal/sim -run 'TestSimRandom$' -sim.seed=%d -sim.n=1 -sim.trace):\n%s", seed, len(o.Violations), seed, o.Trace())
		}
	}
	report(t, "random", &ty, time.Since(start))
}

// TestSimExhaustive runs the bounded exhaustive set.
func TestSimExhaustive(t *testing.T) {
	var ty tally
	start := time.Now()
	for _, s := range Exhaustive() {
		o := runOne(t, s)
		ty.add(o)
		if len(o.Violations) > 0 {
			t.Errorf("exhaustive schedule %d: %d violations:\n%s", -s.Seed, len(o.Violations), o.Trace())
		}
	}
	report(t, "exhaustive", &ty, time.Since(start))
}
