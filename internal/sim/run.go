package sim

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/releasestore"
	"github.com/helm-autorecover/helm-autorecover/pkg/autorecover"
)

// Outcome is one schedule's run: every client's result, the model's
// committed writes, and the violations Check found.
type Outcome struct {
	Schedule   Schedule
	Start      time.Time
	Setup      *Result
	Results    []Result
	Final      Result
	Writes     []Write
	Requests   map[string]int
	Violations []Violation
	// Recovery is how long the final client took, from its start to its
	// end (S2).
	Recovery time.Duration
}

// Violation is one broken invariant.
type Violation struct {
	Invariant string // S1, S2, S3, S5, S7
	Detail    string
}

func (v Violation) String() string { return v.Invariant + ": " + v.Detail }

// FinalLease is the lease of the final client.
const FinalLease = 15 * time.Second

// runLimit ends a schedule that has not ended (a client that never
// returns is reported, not waited for).
const runLimit = 2 * time.Hour

// Run runs s in the calling goroutine's time (a synctest bubble, for
// virtual time) and checks it.
func Run(s Schedule) Outcome {
	m := NewModel()
	out := Outcome{Schedule: s, Start: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), runLimit)
	defer cancel()
	if s.Setup {
		r := setup(ctx, m)
		out.Setup = &r
	}
	out.Results = make([]Result, len(s.Plans))
	var wg sync.WaitGroup
	for i, p := range s.Plans {
		wg.Go(func() { out.Results[i] = runClient(ctx, m, p, s.Faults, s.Seed*31+int64(i)) })
	}
	wg.Wait()
	backend := autorecover.BackendLease
	if s.Seed%2 != 0 {
		backend = autorecover.BackendRelease
	}
	final := Plan{ID: "final", Op: nextOp(m), Backend: backend, Lease: FinalLease, Wait: 10 * time.Minute, Clean: true}
	out.Final = runClient(ctx, m, final, Faults{}, 0)
	out.Recovery = out.Final.Ended.Sub(out.Final.Started)
	m.Close()
	m.mu.Lock()
	out.Writes = append([]Write(nil), m.Writes...)
	out.Requests = map[string]int{}
	for k, v := range m.Requests {
		out.Requests[k] = v
	}
	m.mu.Unlock()
	out.Violations = Check(out)
	return out
}

// setupPlan is the setup's client: a clean install, alone.
var setupPlan = Plan{ID: "setup", Op: autorecover.OpInstall, Backend: autorecover.BackendLease, Lease: FinalLease, Clean: true}

// setups keeps what the setup did, once per process. The setup is the same
// in every schedule: one clean client alone, on an empty model, from the
// bubble's fixed start time. Its outcome is restored in every later
// schedule instead of run again (TestSetupRestored holds the two equal).
var setups struct {
	sync.Mutex
	done    bool
	state   modelState
	result  Result
	elapsed time.Duration
}

// setup runs the setup's install on the empty model m, or restores its
// outcome: the model's state, the client's result, and the virtual time it
// took.
func setup(ctx context.Context, m *Model) Result {
	setups.Lock()
	done, state, r, elapsed := setups.done, setups.state, setups.result, setups.elapsed
	setups.Unlock()
	if done {
		m.restore(state)
		time.Sleep(elapsed)
		return r
	}
	start := time.Now()
	r = runClient(ctx, m, setupPlan, Faults{}, 0)
	if r.Err != nil || r.Crashed {
		return r
	}
	setups.Lock()
	defer setups.Unlock()
	setups.done, setups.state, setups.result, setups.elapsed = true, m.save(), r, time.Since(start)
	return r
}

// record is a release record as the model holds it.
type record struct {
	name    string
	version int
	status  string
}

// isRecord reports whether name is one of the release's records.
func isRecord(res, name string) bool {
	return (res == "secrets" || res == "configmaps") && strings.HasPrefix(name, recordPrefix)
}

const recordPrefix = "sh.helm.release.v1." + Release + ".v"

func recordOf(name string, obj map[string]any) record {
	v, _ := strconv.Atoi(strings.TrimPrefix(name, recordPrefix))
	r := record{name: name, version: v}
	if l, ok := metaOf(obj)["labels"].(map[string]any); ok {
		r.status, _ = l["status"].(string)
	}
	return r
}

// records returns the release's records the model holds, oldest first.
func (m *Model) records() []record {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []record
	for k, o := range m.objs {
		if k.ns == Namespace && isRecord(k.res, k.name) {
			out = append(out, recordOf(k.name, o.body))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out
}

// nextOp is what a user runs next: an install when the release has no
// history or was uninstalled, else an upgrade.
func nextOp(m *Model) autorecover.Operation {
	recs := m.records()
	if len(recs) == 0 || recs[len(recs)-1].status == "uninstalled" {
		return autorecover.OpInstall
	}
	return autorecover.OpUpgrade
}

// lockRecords returns the lock records a write carries: the Lease's or the
// release record's (AnnotationRecord), or the beat's (AnnotationBeat).
func lockRecords(w Write) []*lock.Record {
	ann, _ := metaOf(w.Object)["annotations"].(map[string]any)
	var out []*lock.Record
	if s, _ := ann[lock.AnnotationRecord].(string); s != "" {
		if r, err := lock.DecodeRecord(s); err == nil && r != nil {
			out = append(out, r)
		}
	}
	if s, _ := ann[releasestore.AnnotationBeat].(string); s != "" {
		if r := releasestore.DecodeBeat(s, Release, w.NS); r != nil {
			out = append(out, r)
		}
	}
	return out
}

// Trace renders the outcome readably: the schedule, every client's end, and
// every committed write with its time from the start.
func (o Outcome) Trace() string {
	var b strings.Builder
	b.WriteString(o.Schedule.String())
	at := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return fmt.Sprintf("+%s", t.Sub(o.Start).Round(time.Millisecond))
	}
	results := append([]Result(nil), o.Results...)
	if o.Setup != nil {
		results = append([]Result{*o.Setup}, results...)
	}
	results = append(results, o.Final)
	for _, r := range results {
		fmt.Fprintf(&b, "  %s started %s ended %s", r.Plan.ID, at(r.Started), at(r.Ended))
		if r.Crashed {
			fmt.Fprintf(&b, " CRASHED %s", at(r.CrashAt))
		}
		fmt.Fprintf(&b, " [%s] err=%v\n", r.Counts, r.Err)
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "    %s: %s\n", r.Plan.ID, n)
		}
	}
	b.WriteString("  writes:\n")
	for _, w := range o.Writes {
		fmt.Fprintf(&b, "    %s #%d %s %s %s/%s", at(w.At), w.Seq, w.Client, w.Verb, w.Res, w.Name)
		if w.Sent.Before(w.At.Add(-time.Second)) {
			fmt.Fprintf(&b, " sent=%s", at(w.Sent))
		}
		if w.Cond == "" {
			b.WriteString(" blind")
		}
		if isRecord(w.Res, w.Name) {
			fmt.Fprintf(&b, " status=%s", recordOf(w.Name, w.Object).status)
		}
		for _, r := range lockRecords(w) {
			fmt.Fprintf(&b, " lock{%s rev=%d till=%s", r.Session, r.Revision, at(r.RenewedAt.Add(r.LeaseDuration.Duration)))
			if !r.ReleasedAt.IsZero() {
				b.WriteString(" released")
			}
			b.WriteString("}")
		}
		b.WriteString("\n")
	}
	for _, v := range o.Violations {
		fmt.Fprintf(&b, "  VIOLATION %s\n", v)
	}
	return b.String()
}
