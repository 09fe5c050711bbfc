package sim

import (
	"fmt"
	"math/rand"
	"strings"
	"time"

	"github.com/helm-autorecover/helm-autorecover/pkg/autorecover"
)

// Schedule is one run of the simulation: an optional install before
// everything (Setup), the clients (Plans), and the network's faults. After
// every client has ended, a clean client with no fault runs the operation
// a user would run next and must succeed (S2).
type Schedule struct {
	Seed   int64
	Setup  bool
	Faults Faults
	Plans  []Plan
}

// The choices a random schedule draws from.
var (
	leases  = []time.Duration{3 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second}
	offsets = []time.Duration{-10 * time.Minute, -90 * time.Second, 90 * time.Second, 10 * time.Minute}
	shifts  = []time.Duration{-10 * time.Minute, -30 * time.Second, -5 * time.Second, 5 * time.Second, 30 * time.Second, 10 * time.Minute}
	ops     = []autorecover.Operation{autorecover.OpUpgrade, autorecover.OpUpgrade, autorecover.OpUpgrade, autorecover.OpRollback, autorecover.OpInstall, autorecover.OpUninstall}
)

// maxCrashAt bounds the request a client is crashed, paused or put to
// sleep at; a client makes about 10 to 40 requests.
const maxCrashAt = 40

// Draw returns the random schedule of seed: drawBase's, with what issue
// 34 added drawn from a source of its own, so that a seed draws the same
// clients, faults and times as before (drawBase replays the regressions
// found before). Half the clients that wait ask the holder to stop
// (Plan.Preempt); a sixth of the installs and upgrades run a hook of the
// chart (Plan.Hook), during which their holder declines to stop.
func Draw(seed int64) Schedule {
	s := drawBase(seed)
	q := rand.New(rand.NewSource(seed ^ preemptSalt))
	for i := range s.Plans {
		p := &s.Plans[i]
		if p.Wait > 0 && q.Intn(2) == 0 {
			p.Preempt = true
		}
		if (p.Op == autorecover.OpInstall || p.Op == autorecover.OpUpgrade) && q.Intn(6) == 0 {
			p.Hook = time.Duration(1+q.Intn(int(2*p.Lease/time.Millisecond))) * time.Millisecond
		}
	}
	return s
}

// preemptSalt seeds Draw's second source (issue 34's choices).
const preemptSalt = 0x34

// drawBase returns the random schedule of seed as Draw drew it before
// issue 34: no client asks to preempt, no hook runs.
func drawBase(seed int64) Schedule {
	r := rand.New(rand.NewSource(seed))
	s := Schedule{Seed: seed, Setup: r.Float64() < 0.85}
	s.Faults.MaxLatency = time.Duration(1+r.Intn(100)) * time.Millisecond
	if r.Float64() < 0.5 {
		s.Faults.MaxLatency = time.Duration(1+r.Intn(3000)) * time.Millisecond
		s.Faults.Reset = r.Float64() * 0.05
		s.Faults.Lost = r.Float64() * 0.05
		s.Faults.Throttle = r.Float64() * 0.05
		s.Faults.Unavailable = r.Float64() * 0.05
		s.Faults.Conflict = r.Float64() * 0.03
	}
	n := 2 + r.Intn(3)
	for i := range n {
		p := Plan{
			ID:      fmt.Sprintf("c%d", i+1),
			Op:      ops[r.Intn(len(ops))],
			Backend: autorecover.BackendLease,
			Lease:   leases[r.Intn(len(leases))],
			Start:   time.Duration(r.Int63n(int64(20 * time.Second))),
		}
		if !s.Setup && i == 0 {
			p.Op = autorecover.OpInstall
		}
		if r.Intn(2) == 0 {
			p.Backend = autorecover.BackendRelease
		}
		if r.Intn(2) == 0 {
			p.Wait = 5 * time.Minute
		}
		p.Work = time.Duration(r.Int63n(int64(2 * p.Lease)))
		if r.Float64() < 0.3 {
			p.Offset = offsets[r.Intn(len(offsets))]
		}
		if r.Float64() < 0.2 {
			p.DateShift = shifts[r.Intn(len(shifts))]
		}
		if r.Float64() < 0.4 {
			p.CrashAt = 1 + r.Intn(maxCrashAt)
			p.CrashCommits = r.Intn(2) == 0
		}
		if r.Float64() < 0.15 {
			p.PauseAt = 1 + r.Intn(maxCrashAt)
			p.PauseFor = p.Lease + time.Duration(r.Int63n(int64(2*p.Lease)))
		}
		if r.Float64() < 0.1 {
			p.SleepAt = 1 + r.Intn(maxCrashAt)
			p.SleepFor = p.Lease + time.Duration(r.Int63n(int64(2*p.Lease)))
		}
		s.Plans = append(s.Plans, p)
	}
	return s
}

// Exhaustive returns the bounded exhaustive set: two upgrades on an
// installed release, the first crashed at each of its first maxCrashAt
// requests (the request reaching the server or not), under each backend,
// with the second client's wall clock 10 minutes behind, right, or ahead;
// the second starts while the first holds the lock and waits for it.
// Then, under each backend, the same two with the second asking the first
// to stop (Plan.Preempt) while the first is in a long wait: the holder
// crashed at each of its requests, then the asker (issue 34).
func Exhaustive() []Schedule {
	var out []Schedule
	seed := int64(0)
	for _, backend := range []autorecover.Backend{autorecover.BackendLease, autorecover.BackendRelease} {
		for _, off := range []time.Duration{-10 * time.Minute, 0, 10 * time.Minute} {
			for at := 1; at <= maxCrashAt; at++ {
				for _, commits := range []bool{false, true} {
					seed++
					out = append(out, Schedule{
						Seed: -seed, Setup: true,
						Faults: Faults{MaxLatency: 20 * time.Millisecond},
						Plans: []Plan{
							{ID: "c1", Op: autorecover.OpUpgrade, Backend: backend, Lease: 5 * time.Second, Work: 4 * time.Second, CrashAt: at, CrashCommits: commits},
							{ID: "c2", Op: autorecover.OpUpgrade, Backend: backend, Lease: 5 * time.Second, Work: time.Second, Start: time.Second, Wait: 5 * time.Minute, Offset: off},
						},
					})
				}
			}
		}
	}
	for _, backend := range []autorecover.Backend{autorecover.BackendLease, autorecover.BackendRelease} {
		for _, asker := range []bool{false, true} {
			for at := 1; at <= maxCrashAt; at++ {
				for _, commits := range []bool{false, true} {
					seed++
					holder := Plan{ID: "c1", Op: autorecover.OpUpgrade, Backend: backend, Lease: 5 * time.Second, Work: 10 * time.Second}
					preemptor := Plan{ID: "c2", Op: autorecover.OpUpgrade, Backend: backend, Lease: 5 * time.Second, Work: time.Second, Start: 2 * time.Second, Wait: 5 * time.Minute, Preempt: true}
					crashed := &holder
					if asker {
						crashed = &preemptor
					}
					crashed.CrashAt, crashed.CrashCommits = at, commits
					out = append(out, Schedule{
						Seed: -seed, Setup: true,
						Faults: Faults{MaxLatency: 20 * time.Millisecond},
						Plans:  []Plan{holder, preemptor},
					})
				}
			}
		}
	}
	return out
}

// String describes the schedule.
func (s Schedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "schedule seed=%d setup=%t faults{latency<%s reset=%.3f lost=%.3f 429=%.3f 5xx=%.3f 409=%.3f}\n",
		s.Seed, s.Setup, s.Faults.MaxLatency, s.Faults.Reset, s.Faults.Lost, s.Faults.Throttle, s.Faults.Unavailable, s.Faults.Conflict)
	for _, p := range s.Plans {
		fmt.Fprintf(&b, "  %s\n", p)
	}
	return b.String()
}

// String describes a plan.
func (p Plan) String() string {
	s := fmt.Sprintf("%s: %s backend=%s lease=%s wait=%s start=+%s work=%s", p.ID, p.Op, p.Backend, p.Lease, p.Wait, p.Start.Round(time.Millisecond), p.Work.Round(time.Millisecond))
	if p.Offset != 0 {
		s += fmt.Sprintf(" clock%+v", p.Offset)
	}
	if p.DateShift != 0 {
		s += fmt.Sprintf(" date%+v", p.DateShift)
	}
	if p.CrashAt > 0 {
		s += fmt.Sprintf(" crash@%d(commits=%t)", p.CrashAt, p.CrashCommits)
	}
	if p.PauseAt > 0 {
		s += fmt.Sprintf(" pause@%d(%s)", p.PauseAt, p.PauseFor.Round(time.Millisecond))
	}
	if p.SleepAt > 0 {
		s += fmt.Sprintf(" sleep@%d(%s)", p.SleepAt, p.SleepFor.Round(time.Millisecond))
	}
	if p.Preempt {
		s += " preempt"
	}
	if p.Hook > 0 {
		s += fmt.Sprintf(" hook=%s", p.Hook)
	}
	return s
}
