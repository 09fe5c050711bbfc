package sim

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/releasestore"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/pkg/autorecover"
)

// TestCheck is the table of the checker on hand-made histories: every
// invariant it claims (S1, S2, S3, S5, S7) fires on a history that breaks
// it, through each kind of write it reads (the Lease, a record, the beat),
// and stays silent on one that does not.
func TestCheck(t *testing.T) {
	t0 := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	lease := 2 * time.Second
	s := func(d float64) time.Duration { return time.Duration(d * float64(time.Second)) }
	// write is a conditional update of the Lease at at, carrying client's
	// record of the tenure taken at acquired, renewed at at.
	write := func(seq int64, at time.Duration, client string, acquired time.Duration, released bool) Write {
		rec := lock.Record{
			Schema: lock.SchemaVersion, Session: client, Release: Release, Namespace: "sim", Operation: lock.OpUpgrade,
			LeaseDuration: metav1.Duration{Duration: lease}, AcquiredAt: t0.Add(acquired), RenewedAt: t0.Add(at), LockedTill: t0.Add(at + lease),
		}
		if released {
			rec.ReleasedAt = t0.Add(at)
		}
		enc, err := rec.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return Write{
			Seq: seq, At: t0.Add(at), Sent: t0.Add(at), Client: client, Verb: "update", Res: "leases.coordination.k8s.io", NS: "sim", Name: lock.LeaseName(Release),
			Object: map[string]any{"metadata": map[string]any{"annotations": map[string]any{lock.AnnotationRecord: enc}}}, Cond: "rv=1",
		}
	}
	// onRecord moves a write onto the release's record of revision rev (a
	// gate), with status in its labels.
	onRecord := func(w Write, rev, status string) Write {
		w.Res, w.Name = "secrets", recordPrefix+rev
		metaOf(w.Object)["labels"] = map[string]any{"status": status}
		return w
	}
	gate := func(w Write) Write { return onRecord(w, "1", "deployed") }
	// onBeat moves a write's record onto the beat, as its heartbeat.
	onBeat := func(w Write) Write {
		r, err := lock.DecodeRecord(metaOf(w.Object)["annotations"].(map[string]any)[lock.AnnotationRecord].(string))
		if err != nil {
			t.Fatal(err)
		}
		hb := map[string]any{"s": r.Session, "d": r.LeaseDuration.Milliseconds(), "a": r.AcquiredAt.UnixMilli(), "t": r.RenewedAt.UnixMilli(), "x": r.LockedTill.UnixMilli()}
		if !r.ReleasedAt.IsZero() {
			hb["rel"] = r.ReleasedAt.UnixMilli()
		}
		b, err := json.Marshal(hb)
		if err != nil {
			t.Fatal(err)
		}
		w.Res, w.Name = "secrets", lock.LeaseName(Release)
		w.Object = map[string]any{"metadata": map[string]any{"annotations": map[string]any{releasestore.AnnotationBeat: string(b)}}}
		return w
	}
	blind := func(w Write) Write { w.Cond = ""; return w }
	verb := func(w Write, v string) Write { w.Verb = v; return w }
	sent := func(w Write, at time.Duration) Write { w.Sent = t0.Add(at); return w }
	// again is w written once more, as write seq at at, unchanged.
	again := func(w Write, seq int64, at time.Duration) Write {
		w.Seq, w.At, w.Sent = seq, t0.Add(at), t0.Add(at)
		return w
	}

	// A client's result for S2: op, started and ended at, its error.
	result := func(id string, backend autorecover.Backend, from, to time.Duration, err error) Result {
		return Result{Plan: Plan{ID: id, Op: autorecover.OpUpgrade, Backend: backend, Lease: lease}, Started: t0.Add(from), Ended: t0.Add(to), Err: err}
	}
	rel := autorecover.BackendRelease
	// paused is client id, whose plan pauses it for 5 s at its first
	// request.
	paused := func(id string) Result {
		r := result(id, rel, 0, s(10), nil)
		r.Plan.PauseAt, r.Plan.PauseFor = 1, 5*time.Second
		return r
	}
	// deadWaiter is a client that started at from, queued (it waits), and
	// crashed at crash without having taken the lock.
	deadWaiter := func(from, crash time.Duration) Result {
		r := result("q", rel, from, crash, nil)
		r.Plan.Wait, r.Crashed, r.CrashAt = time.Minute, true, t0.Add(crash)
		return r
	}
	locked := errors.New(`release "app" in namespace "sim" is locked by a`)
	// dead is a holder of the gate that took it at 0 and never renewed:
	// its lock stands expired from 2 s on.
	dead := []Write{onBeat(write(1, 0, "a", 0, false)), gate(write(2, s(0.1), "a", 0, false))}
	// takeover is b taking the gate over at at.
	takeover := func(seq int64, at time.Duration) []Write {
		return []Write{onBeat(write(seq, at, "b", at, false)), gate(write(seq+1, at+s(0.1), "b", at, false))}
	}
	// Issue 34: a, holding the gate from 0 (renewing at 1 s), is asked
	// to stop by b, and marks its revision 2 failed.
	// described is w carrying the release record of revision rev with
	// status and description desc.
	described := func(w Write, rev int, status common.Status, desc string) Write {
		r := newRelease(rev, status, t0)
		r.Info.Description = desc
		enc, err := encodeRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		w = onRecord(w, strconv.Itoa(rev), status.String())
		w.Object["data"] = map[string]any{"release": base64.StdEncoding.EncodeToString(enc)}
		return w
	}
	asker := lock.Waiter{Session: "b", Who: "b", Operation: lock.OpUpgrade}
	stoppedBy := func(by lock.Waiter) error {
		return fmt.Errorf("autorecover: %w: update: refused", &autorecover.PreemptedError{Release: Release, Namespace: Namespace, By: by})
	}
	preempted := fmt.Sprintf(protocol.DescriptionPreempted, "pending-upgrade", protocol.Asker(asker), "a", "2000-01-01T00:00:01Z")
	// stopped is a preempted holder a and its asker b, as clients.
	stopped := func(by lock.Waiter, preempt bool) []Result {
		a := result("a", rel, 0, s(1.5), stoppedBy(by))
		b := result("b", rel, s(0.5), s(3), nil)
		b.Plan.Wait, b.Plan.Preempt = time.Minute, preempt
		return []Result{a, b}
	}
	// holding is a's take of the gate, its revision 2 created pending and
	// a renewal.
	holding := []Write{
		onBeat(write(1, 0, "a", 0, false)), gate(write(2, s(0.1), "a", 0, false)),
		verb(described(write(3, s(0.2), "a", 0, false), 2, common.StatusPendingUpgrade, "Preparing upgrade"), "create"),
		onBeat(write(4, s(1), "a", 0, false)),
	}
	// settled is a marking revision 2 failed as preempted, then
	// releasing the gate, at 1.2 s and 1.3 s.
	settled := []Write{
		described(write(5, s(1.2), "a", 0, false), 2, common.StatusFailed, preempted),
		described(write(6, s(1.3), "a", 0, true), 2, common.StatusFailed, preempted),
	}
	join := func(ws ...[]Write) []Write {
		var out []Write
		for _, w := range ws {
			out = append(out, w...)
		}
		return out
	}

	for _, tc := range []struct {
		name    string
		outcome Outcome
		want    []string // the invariants flagged, in order
	}{
		// S1, S3, S5 on the Lease.
		{"a clean handover", Outcome{Writes: []Write{
			write(1, 0, "a", 0, false), write(2, time.Second, "a", 0, false), write(3, s(1.5), "a", 0, true),
			write(4, 2*time.Second, "b", 2*time.Second, false),
		}}, nil},
		{"a take after the holder's expiry", Outcome{Writes: []Write{
			write(1, 0, "a", 0, false), write(2, 5*time.Second, "b", 5*time.Second, false),
		}}, nil},
		{"a take before the holder's expiry", Outcome{Writes: []Write{
			write(1, 0, "a", 0, false), write(2, time.Second, "b", time.Second, false),
		}}, []string{"S3"}},
		{"a renewal after a takeover", Outcome{Writes: []Write{
			write(1, 0, "a", 0, false), write(2, 5*time.Second, "b", 5*time.Second, false), write(3, 6*time.Second, "a", 0, false),
		}}, []string{"S5", "S5", "S1"}},
		// A helm write of a lost tenure that lands late, after its taker
		// released: no new take (it carries the lost tenure's record), so
		// its writer's span overlaps the taker's (found by review).
		{"a late record write of a lost tenure", Outcome{Writes: []Write{
			gate(write(1, 0, "a", 0, false)), gate(write(2, 5*time.Second, "b", 5*time.Second, false)),
			gate(write(3, 6*time.Second, "b", 5*time.Second, true)), gate(write(4, 7*time.Second, "a", 0, false)),
		}}, []string{"S5", "S1"}},
		{"the same session taking the lock again after the taker released it", Outcome{Writes: []Write{
			write(1, 0, "a", 0, false), write(2, 5*time.Second, "b", 5*time.Second, false), write(3, 6*time.Second, "b", 5*time.Second, true),
			write(4, 7*time.Second, "a", 7*time.Second, false), write(5, 8*time.Second, "a", 7*time.Second, false),
		}}, nil},
		// S5: a write past the writer's own expiry, nobody taking over.
		{"a Lease renewal in time", Outcome{Writes: []Write{
			write(1, 0, "a", 0, false), write(2, s(1.9), "a", 0, false), write(3, s(3.8), "a", 0, true),
		}}, nil},
		{"a Lease renewal after the holder's expiry", Outcome{Writes: []Write{
			write(1, 0, "a", 0, false), write(2, s(2.5), "a", 0, false),
		}}, []string{"S5"}},
		{"a Lease renewal sent in time that lands after the expiry", Outcome{Writes: []Write{
			write(1, 0, "a", 0, false), sent(write(2, s(2.5), "a", 0, false), s(0.9)),
		}}, []string{"S5"}},
		{"beat renewals in time", Outcome{Writes: join(dead, []Write{
			onBeat(write(3, s(1.5), "a", 0, false)), onBeat(write(4, s(3), "a", 0, false)), gate(write(5, s(3.5), "a", 0, true)),
		})}, nil},
		// A waiter that is the expired holder itself queues on the
		// beat, which carries its record as it stood: nothing renewed.
		{"the holder's record carried unchanged on the beat after its expiry", Outcome{Writes: join(dead, []Write{
			again(onBeat(write(1, 0, "a", 0, false)), 3, s(2.5)),
		})}, nil},
		{"the holder's record carried unchanged on the Lease after its expiry", Outcome{Writes: []Write{
			write(1, 0, "a", 0, false), again(write(1, 0, "a", 0, false), 2, s(2.5)),
		}}, nil},
		// The holder's take whose answer was lost, taken again once its
		// own lock expired: a new acquiredAt, a take.
		{"the holder taking its own expired Lease again", Outcome{Writes: []Write{
			write(1, 0, "a", 0, false), write(2, 5*time.Second, "a", 5*time.Second, false), write(3, 6*time.Second, "a", 5*time.Second, false),
		}}, nil},
		{"the holder taking its own expired Lease again, then renewing it late", Outcome{Writes: []Write{
			write(1, 0, "a", 0, false), write(2, 5*time.Second, "a", 5*time.Second, false), write(3, 8*time.Second, "a", 5*time.Second, false),
		}}, []string{"S5"}},
		{"a beat renewal after the holder's expiry", Outcome{Writes: join(dead, []Write{
			onBeat(write(3, s(2.5), "a", 0, false)),
		})}, []string{"S5"}},
		{"a record write after the holder's expiry", Outcome{Writes: join(dead, []Write{
			onRecord(write(3, s(2.5), "a", 0, false), "2", "failed"),
		})}, []string{"S5"}},
		// The residual risk of a paused process: a write sent in time,
		// held in flight by its writer's own pause (seeds 5041, 69572).
		{"a conditional record write sent in time, held by its writer's pause past its expiry", Outcome{
			Results: []Result{paused("a")},
			Writes:  join(dead, []Write{sent(onRecord(write(3, s(2.5), "a", 0, false), "2", "failed"), s(1.5))}),
		}, nil},
		{"a blind record write sent in time, held by its writer's pause past its expiry", Outcome{
			Results: []Result{paused("a")},
			Writes:  join(dead, []Write{blind(sent(onRecord(write(3, s(2.5), "a", 0, false), "2", "failed"), s(1.5)))}),
		}, []string{"S5"}},
		{"a conditional record write held by its writer's pause, landing after another client took over", Outcome{
			Results: []Result{paused("a")},
			Writes:  join(dead, takeover(3, s(2.2)), []Write{sent(onRecord(write(5, s(2.5), "a", 0, false), "2", "failed"), s(1.5))}),
		}, []string{"S5", "S1"}},
		{"a conditional record write held past its writer's expiry by latency alone", Outcome{
			Results: []Result{func() Result { r := paused("a"); r.Plan.PauseAt = 0; return r }()},
			Writes:  join(dead, []Write{sent(onRecord(write(3, s(2.5), "a", 0, false), "2", "failed"), s(1.5))}),
		}, []string{"S5"}},
		{"a take of the gate on a claim of the beat that expired", Outcome{Writes: []Write{
			onBeat(write(1, 0, "a", 0, false)), gate(write(2, s(2.5), "a", 0, false)),
		}}, []string{"S5"}},
		// S5: a release must be conditional to be exempt.
		{"a conditional release after the holder's expiry", Outcome{Writes: []Write{
			write(1, 0, "a", 0, false), write(2, 5*time.Second, "a", 0, true),
		}}, nil},
		{"a release of the Lease without a precondition", Outcome{Writes: []Write{
			write(1, 0, "a", 0, false), blind(write(2, time.Second, "a", 0, true)),
		}}, []string{"S5"}},
		{"a release of the gate without a precondition", Outcome{Writes: join(dead, []Write{
			blind(gate(write(3, time.Second, "a", 0, true))),
		})}, []string{"S5"}},
		{"a conditional delete of the holder's Lease", Outcome{Writes: []Write{
			write(1, 0, "a", 0, false), verb(write(2, time.Second, "a", 0, false), "delete"),
		}}, nil},
		{"a delete of the holder's Lease without a precondition", Outcome{Writes: []Write{
			write(1, 0, "a", 0, false), blind(verb(write(2, time.Second, "a", 0, false), "delete")),
		}}, []string{"S5"}},
		// S7.
		{"a history that supersedes", Outcome{Writes: []Write{
			onRecord(write(1, 0, "a", 0, false), "1", "deployed"), onRecord(write(2, s(0.1), "a", 0, false), "2", "pending-upgrade"),
			onRecord(write(3, s(0.2), "a", 0, false), "1", "superseded"), onRecord(write(4, s(0.3), "a", 0, false), "2", "deployed"),
		}}, nil},
		{"two revisions deployed", Outcome{Writes: []Write{
			onRecord(write(1, 0, "a", 0, false), "1", "deployed"), onRecord(write(2, s(0.1), "a", 0, false), "2", "deployed"),
		}}, []string{"S7"}},
		{"a revision deleted by an upgrade", Outcome{
			Results: []Result{result("a", rel, 0, 1, nil)},
			Writes: []Write{
				onRecord(write(1, 0, "a", 0, false), "1", "superseded"), onRecord(write(2, s(0.1), "a", 0, false), "2", "deployed"),
				verb(onRecord(write(3, s(0.2), "a", 0, false), "1", "superseded"), "delete"),
			},
		}, []string{"S7"}},
		{"a revision missing", Outcome{Writes: []Write{
			onRecord(write(1, 0, "a", 0, false), "1", "superseded"), onRecord(write(2, s(0.1), "a", 0, false), "3", "deployed"),
		}}, []string{"S7"}},
		// S2: the final client and the history left.
		{"a revision left pending", Outcome{Writes: []Write{
			onRecord(write(1, 0, "a", 0, false), "1", "pending-install"),
		}}, []string{"S2"}},
		{"the final client failed", Outcome{
			Final: result("final", rel, 0, 1, errors.New("boom")),
		}, []string{"S2"}},
		{"the final client took too long", Outcome{
			Final: result("final", rel, 0, 30, nil), Recovery: 30 * time.Second,
		}, []string{"S2"}},
		// S2: every client on a lock whose holder died (the bound is 25.25 s).
		{"a contender that takes over within the bound", Outcome{
			Results: []Result{result("b", rel, s(1), s(21), nil)},
			Writes:  join(dead, takeover(3, s(20))),
		}, nil},
		{"a contender that waits longer than the bound", Outcome{
			Results: []Result{result("b", rel, s(1), s(41), nil)},
			Writes:  join(dead, takeover(3, s(40))),
		}, []string{"S2"}},
		{"a contender that never takes the lock over", Outcome{
			Results: []Result{result("b", rel, s(1), s(400), nil)},
			Writes:  dead,
		}, []string{"S2"}},
		// A waiter that came first and died queued holds the next one up
		// until its entry is seen unchanged for its lease (seed 96028).
		{"a contender behind a waiter that died queued, within the bound from when its entry is gone", Outcome{
			Results: []Result{deadWaiter(s(0.5), s(30)), result("b", rel, s(1), s(51), nil)},
			Writes:  join(dead, takeover(3, s(50))),
		}, nil},
		{"a contender behind a waiter that died queued, longer than the bound from when its entry is gone", Outcome{
			Results: []Result{deadWaiter(s(0.5), s(30)), result("b", rel, s(1), s(71), nil)},
			Writes:  join(dead, takeover(3, s(70))),
		}, []string{"S2"}},
		// Review of e4fdf6c: only an entry in the part's own queue holds
		// a waiter up. A client of the gate alone (BackendRelease) that
		// died queued never wrote the Lease's queue: a joint contender
		// waiting on the Lease is held up by nothing of it.
		{"a Lease contender, longer than the bound, beside a gate-only waiter that died queued", Outcome{
			Results: []Result{deadWaiter(s(0.5), s(30)), result("b", autorecover.BackendLease, s(1), s(51), nil)},
			Writes:  join(dead, []Write{write(3, s(0.2), "a", 0, false)}, takeover(4, s(20)), []Write{write(6, s(50), "b", s(50), false)}),
		}, []string{"S2"}},
		{"a Lease contender, longer than the bound (control: no dead waiter)", Outcome{
			Results: []Result{result("b", autorecover.BackendLease, s(1), s(51), nil)},
			Writes:  join(dead, []Write{write(3, s(0.2), "a", 0, false)}, takeover(4, s(20)), []Write{write(6, s(50), "b", s(50), false)}),
		}, []string{"S2"}},
		{"a contender that crashed waiting", Outcome{
			Results: []Result{func() Result { r := result("b", rel, s(1), s(400), nil); r.Crashed = true; return r }()},
			Writes:  dead,
		}, nil},
		{"a contender refused by a live holder", Outcome{
			Results: []Result{result("b", rel, s(1), s(1.1), locked)},
			Writes:  dead,
		}, nil},
		{"a contender refused by an expired holder", Outcome{
			Results: []Result{result("b", rel, s(5), s(5.1), locked)},
			Writes:  dead,
		}, []string{"S2"}},
		{"a contender refused by an expired holder, its network failing", Outcome{
			Results: []Result{func() Result { r := result("b", rel, s(5), s(5.1), locked); r.Counts.Unavailable = 1; return r }()},
			Writes:  dead,
		}, nil},
		{"a contender that took over and failed", Outcome{
			Results: []Result{result("b", rel, s(5), s(10), errPending)},
			Writes:  join(dead, takeover(3, s(8))),
		}, []string{"S2"}},
		// A 3 s lease cannot be held on a network of 600 ms a request:
		// the take and its first renewal are five requests within 2 s
		// (slowFor: 400 ms); on one of 300 ms it can.
		{"a contender with a 3 s lease that took over and lost its lock on a slow network", Outcome{
			Schedule: Schedule{Faults: Faults{MaxLatency: 600 * time.Millisecond}},
			Results: []Result{func() Result {
				r := result("b", rel, s(5), s(10), lock.ErrLost)
				r.Plan.Lease = 3 * time.Second
				return r
			}()},
			Writes: join(dead, takeover(3, s(8))),
		}, nil},
		{"a contender with a 3 s lease whose renewal was cut at its deadline on a slow network", Outcome{
			Schedule: Schedule{Faults: Faults{MaxLatency: 600 * time.Millisecond}},
			Results: []Result{func() Result {
				r := result("b", rel, s(5), s(10), fmt.Errorf("renew lock: %w", context.DeadlineExceeded))
				r.Plan.Lease = 3 * time.Second
				return r
			}()},
			Writes: join(dead, takeover(3, s(8))),
		}, nil},
		{"a contender with a 3 s lease that took over and lost its lock on a fast network", Outcome{
			Schedule: Schedule{Faults: Faults{MaxLatency: 300 * time.Millisecond}},
			Results: []Result{func() Result {
				r := result("b", rel, s(5), s(10), lock.ErrLost)
				r.Plan.Lease = 3 * time.Second
				return r
			}()},
			Writes: join(dead, takeover(3, s(8))),
		}, []string{"S2"}},
		// Found by review: latency explains a lost lock, not a refusal at
		// once of a lock expired long before: a no-wait client with a 3 s
		// lease refused 5 s after the lock expired on a network of 600 ms
		// a request.
		{"a contender with a 3 s lease refused by an expired holder on a network of 600 ms", Outcome{
			Schedule: Schedule{Faults: Faults{MaxLatency: 600 * time.Millisecond}},
			Results: []Result{func() Result {
				r := result("b", rel, s(7), s(7.1), locked)
				r.Plan.Lease = 3 * time.Second
				return r
			}()},
			Writes: dead,
		}, []string{"S2"}},
		{"a contender with a 15 s lease that took over and lost its lock on a network of 600 ms", Outcome{
			Schedule: Schedule{Faults: Faults{MaxLatency: 600 * time.Millisecond}},
			Results: []Result{func() Result {
				r := result("b", rel, s(5), s(10), lock.ErrLost)
				r.Plan.Lease = 15 * time.Second
				return r
			}()},
			Writes: join(dead, takeover(3, s(8))),
		}, []string{"S2"}},
		{"a contender whose helm refused the history", Outcome{
			Results: []Result{result("b", rel, s(5), s(10), refusal(`"app" has no deployed releases`))},
			Writes:  join(dead, takeover(3, s(8))),
		}, nil},
		{"a contender refused behind another that took over first", Outcome{
			Results: []Result{result("b", rel, s(3), s(20), nil), result("c", rel, s(5), s(9), locked)},
			Writes:  join(dead, takeover(3, s(8))),
		}, nil},
		// A claim of the beat is a take in flight (rule 5): held by the
		// claimant until it has expired and been seen so for its lease
		// (seeds 5568, 7546).
		{"a contender refused while another client's claim of the beat stood", Outcome{
			Results: []Result{result("b", rel, s(4), s(5.5), locked)},
			Writes:  join(dead, []Write{onBeat(write(3, s(5), "c", s(5), false))}),
		}, nil},
		{"a contender refused after another client's claim of the beat expired", Outcome{
			Results: []Result{result("b", rel, s(4), s(15), locked)},
			Writes:  join(dead, []Write{onBeat(write(3, s(5), "c", s(5), false))}),
		}, []string{"S2"}},
		{"a contender that took over, lost its lock, and failed while another client claimed the beat", Outcome{
			Results: []Result{result("b", rel, s(4), s(11), errPending)},
			Writes:  join(dead, takeover(3, s(5)), []Write{onBeat(write(5, s(10), "c", s(10), false))}),
		}, []string{"S2"}},
		{"a contender refused by its own claim of the beat", Outcome{
			Results: []Result{result("b", rel, s(4), s(5.5), locked)},
			Writes:  join(dead, []Write{onBeat(write(3, s(5), "b", s(5), false))}),
		}, []string{"S2"}},
		// Issue 34: cooperative preemption.
		{"a holder stopped at a waiter's request that marked its revision failed and gave the lock back", Outcome{
			Results: stopped(asker, true),
			Writes:  join(holding, settled, takeover(7, s(1.5))),
		}, nil},
		{"a holder's write landing after it gave its lock back at a waiter's request", Outcome{
			Results: stopped(asker, true),
			Writes:  join(holding, settled, []Write{onRecord(write(7, s(1.4), "a", 0, false), "1", "superseded")}),
		}, []string{"S5"}},
		{"a holder's write landing after it gave its lock back and the asker took it", Outcome{
			Results: stopped(asker, true),
			Writes:  join(holding, settled, takeover(7, s(1.5)), []Write{onRecord(write(9, s(1.7), "a", 0, false), "1", "superseded")}),
		}, []string{"S5", "S1"}},
		{"a holder's write of the chart's object after it gave its lock back", Outcome{
			Results: stopped(asker, true),
			Writes: join(holding, settled, []Write{{
				Seq: 7, At: t0.Add(s(1.4)), Sent: t0.Add(s(1.4)), Client: "a", Verb: "update", Res: "configmaps", NS: Namespace, Name: Release,
				Object: map[string]any{"metadata": map[string]any{"name": Release}},
			}}),
		}, []string{"S5"}},
		// A joint lock that gave its Lease back to take its gate again
		// takes the Lease again, conditionally, with the same
		// acquiredAt, and renews it (seeds 177425, 238406, 277079).
		{"a joint lock taking its Lease again after it gave it back", Outcome{
			Writes: []Write{
				write(1, 0, "a", 0, false), write(2, s(0.2), "a", 0, true), write(3, s(0.4), "a", 0, false), write(4, s(0.9), "a", 0, false),
			},
		}, nil},
		{"a holder's blind write of its Lease after it released it", Outcome{
			Writes: []Write{
				write(1, 0, "a", 0, false), write(2, s(0.2), "a", 0, true), blind(write(3, s(0.4), "a", 0, false)),
			},
		}, []string{"S5"}},
		// A joint lock that gave its gate back to wait for its Lease
		// claims the beat again, with the same acquiredAt (seed 978).
		{"a holder claiming the beat again after it gave the gate back", Outcome{
			Writes: join(holding[:2], []Write{
				gate(write(3, s(0.2), "a", 0, true)), onBeat(write(4, s(0.5), "a", 0, false)), gate(write(5, s(0.6), "a", 0, false)),
			}),
		}, nil},
		{"a holder claiming the beat anew after it gave the gate back", Outcome{
			Writes: join(holding[:2], []Write{
				gate(write(3, s(0.2), "a", 0, true)), onBeat(write(4, s(0.5), "a", s(0.5), false)), gate(write(5, s(0.6), "a", s(0.5), false)),
			}),
		}, nil},
		{"a holder stopped at a waiter's request whose lock ran out before it marked its revision", Outcome{
			Results: stopped(asker, true),
			Writes: join(holding, takeover(5, s(3.5)),
				[]Write{described(write(7, s(3.6), "b", s(3.5), false), 2, common.StatusFailed, "abandoned")}),
		}, nil},
		{"an asker taking the lock before the holder it asked gave it back", Outcome{
			Results: stopped(asker, true),
			Writes:  join(holding, settled[:1], takeover(6, s(1.25))),
		}, []string{"S3"}},
		{"a holder stopped at the request of a client that did not ask", Outcome{
			Results: stopped(asker, false),
			Writes:  join(holding, settled),
		}, []string{"S3"}},
		{"a holder stopped at a waiter's request that left its revision to its asker", Outcome{
			Results: stopped(asker, true),
			Writes: join(holding, []Write{gate(write(5, s(1.3), "a", 0, true))}, takeover(6, s(1.5)),
				[]Write{described(write(8, s(1.6), "b", s(1.5), false), 2, common.StatusFailed, "abandoned")}),
		}, []string{"S2"}},
		{"a holder stopped at a waiter's request that never marked its revision failed", Outcome{
			Results: stopped(asker, true),
			Writes:  join(holding, []Write{gate(write(5, s(1.3), "a", 0, true))}),
		}, []string{"S2", "S2"}},
		{"a holder stopped at a waiter's request that marked its revision failed without naming it", Outcome{
			Results: stopped(asker, true),
			Writes: join(holding, []Write{
				described(write(5, s(1.2), "a", 0, false), 2, common.StatusFailed, "upgrade failed: context canceled"), gate(write(6, s(1.3), "a", 0, true)),
			}),
		}, []string{"S2"}},
		{"a contender that took over and was stopped at a waiter's request", Outcome{
			Results: []Result{result("b", rel, s(5), s(10), stoppedBy(lock.Waiter{Session: "c"})), func() Result {
				r := result("c", rel, s(9), s(12), nil)
				r.Plan.Preempt = true
				return r
			}()},
			Writes: join(dead, takeover(3, s(8))),
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.outcome
			o.Start = t0
			vs := Check(o)
			var got []string
			for _, v := range vs {
				got = append(got, v.Invariant)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("violations %v, want %v", vs, tc.want)
			}
		})
	}
}
