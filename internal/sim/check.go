package sim

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/pkg/autorecover"
)

// Check reads an outcome's committed writes (the model's history, in
// commit order and in the server's own time, so exactly) and returns every
// violation it sees:
//
//   - S1: two clients whose holder writes of one part of the lock
//     interleave (one wrote after another's first and before its last):
//     the gate's (writes of the release's records), or the Lease's (writes
//     naming the writer as holder; waiters queue on the Lease and the
//     beat). Writes that release a lock are left out: they are
//     conditional, and a holder releases after its expiry too.
//   - S3: a client's first holder write came before the previous holder's
//     lock expired, that holder not having released it: before the time
//     its latest committed renewal was sent plus its lease, in the
//     server's true time (a record's own times are the holder's estimate,
//     which a shifted Date header moves).
//   - S5: a holder renewed its lock (a beat naming its session, not
//     released) after another client's first holder write followed its own.
//   - S7: two deployed revisions at once; a revision deleted by a client
//     that was not uninstalling; a revision number skipped.
//   - S2: the final client, which starts once every other client ended, did
//     not succeed, or took longer than recoveryBound; or a revision is left
//     pending at the end.
func Check(o Outcome) []Violation {
	var vs []Violation
	add := func(inv, format string, args ...any) {
		vs = append(vs, Violation{inv, fmt.Sprintf(format, args...)})
	}
	since := func(t time.Time) time.Duration { return t.Sub(o.Start).Round(time.Millisecond) }
	plans := map[string]Plan{}
	for _, r := range o.Results {
		plans[r.Plan.ID] = r.Plan
	}

	// Holder writes, for S1: to the release's records, and to its Lease
	// when it names the writer as holder.
	type span struct{ first, last int64 }
	spans := map[string]*span{}
	var order []string // clients by first holder write
	// The lock's parts, for S3 and S5: the gate (on the release records,
	// renewed on the beat) and the Lease.
	parts := map[string]*partLog{"gate": newPartLog("gate"), "lease": newPartLog("lease")}
	state := map[string]record{}
	for _, w := range o.Writes {
		rec, lease, beat := isRecord(w.Res, w.Name), isLease(w), isBeat(w)
		holder := rec || lease && holds(w)
		var part *partLog
		switch {
		case rec || beat:
			part = parts["gate"]
		case lease:
			part = parts["lease"]
		}
		if part != nil {
			// S3: a take must come after the previous holder's expiry.
			if (rec || lease && holds(w)) && !part.held(w.Client) && part.startsTenure(w) {
				if prev := part.current(); prev != "" {
					if e := part.expiry[prev]; !part.released[prev] && w.At.Before(e) {
						add("S3", "%s took the %s lock at %s (write #%d) while %s's ran until %s and was not released", w.Client, part.name, since(w.At), w.Seq, prev, since(e))
					}
				}
				part.take(w.Client, w.Seq)
			}
			for _, r := range lockRecords(w) {
				if r.Session != w.Client {
					continue
				}
				if !r.ReleasedAt.IsZero() {
					part.released[w.Client] = true
					continue
				}
				// S5: a renewal of a tenure someone took over since. A
				// later take by the same session (a joint lock taking a
				// lost part again) stamps a new acquiredAt, and starts a
				// tenure of its own (seed 8017).
				if at, ok := part.lost[w.Client][r.AcquiredAt.UnixMilli()]; ok && !rec {
					add("S5", "%s renewed its %s lock at %s (write #%d) after it was taken over at write #%d", w.Client, part.name, since(w.At), w.Seq, at)
				}
				part.acquired[w.Client] = r.AcquiredAt
				// A renewal is a write of a later renewedAt; a helm write
				// carrying the record unchanged, or an older copy of it
				// (a revision's, written before later renewals on the
				// beat), renews nothing (seed 1997).
				if !r.RenewedAt.After(part.renewed[w.Client]) {
					continue
				}
				part.renewed[w.Client] = r.RenewedAt
				if till := w.Sent.Add(r.LeaseDuration.Duration); till.After(part.expiry[w.Client]) {
					part.expiry[w.Client] = till
				}
			}
		}
		if holder && !releases(w) {
			// Spans are per part: a client may hold the Lease while the
			// gate is another's (a joint lock waiting for its first part
			// again), writing no release data.
			id := fmt.Sprintf("%s/gate#%d", w.Client, parts["gate"].tenure(w.Client))
			if lease {
				id = fmt.Sprintf("%s/lease#%d", w.Client, parts["lease"].tenure(w.Client))
			}
			sp := spans[id]
			if sp == nil {
				sp = &span{first: w.Seq}
				spans[id] = sp
				order = append(order, id)
			}
			sp.last = w.Seq
		}
		// S7: history.
		if rec {
			if w.Verb == "delete" {
				if p, ok := plans[w.Client]; (ok && p.Op != autorecover.OpUninstall) || w.Client == "final" {
					add("S7", "%s (not uninstalling) deleted revision record %s at %s (write #%d)", w.Client, w.Name, since(w.At), w.Seq)
				}
				delete(state, w.Name)
				if len(state) == 0 {
					// An uninstall that deleted the last record took the
					// lock on the records with it.
					parts["gate"].released[w.Client] = true
				}
			} else {
				state[w.Name] = recordOf(w.Name, w.Object)
			}
			deployed := 0
			for _, r := range state {
				if r.status == "deployed" {
					deployed++
				}
			}
			if deployed > 1 {
				add("S7", "%d revisions deployed after write #%d at %s by %s", deployed, w.Seq, since(w.At), w.Client)
			}
		}
	}
	// S1: holder spans must not interleave.
	for i, a := range order {
		for _, b := range order[i+1:] {
			ta, tb := spans[a], spans[b]
			if partOf(a) == partOf(b) && tb.first < ta.last {
				add("S1", "%s wrote (last write #%d) after %s's first holder write #%d", a, ta.last, b, tb.first)
			}
		}
	}
	// S7: revisions contiguous at the end.
	recs := make([]record, 0, len(state))
	for _, r := range state {
		recs = append(recs, r)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].version < recs[j].version })
	for i := 1; i < len(recs); i++ {
		if recs[i].version != recs[i-1].version+1 {
			add("S7", "revision %d is missing (history ends with %d after %d)", recs[i-1].version+1, recs[i].version, recs[i-1].version)
		}
	}
	// S2: the next operation succeeds, within a bound, leaving nothing
	// pending.
	if o.Final.Err != nil {
		add("S2", "the final %s failed: %v", o.Final.Plan.Op, o.Final.Err)
	}
	if bound := recoveryBound(o.Schedule); o.Recovery > bound {
		add("S2", "the final %s took %s, more than %s", o.Final.Plan.Op, o.Recovery.Round(time.Millisecond), bound)
	}
	for _, r := range recs {
		if r.status == "pending-install" || r.status == "pending-upgrade" || r.status == "pending-rollback" || r.status == "uninstalling" {
			add("S2", "revision %d left %s at the end", r.version, r.status)
		}
	}
	return vs
}

// recoveryBound is how long the final client may take: a client that did
// not see the holder die waits one lease of it and the margin on its own
// clock before it takes over (lock.Confirm), polling every third of a lease,
// plus its own requests.
func recoveryBound(s Schedule) time.Duration {
	longest := FinalLease
	for _, p := range s.Plans {
		longest = max(longest, p.Lease)
	}
	return longest + longest/3 + lock.TakeoverMargin + 5*time.Second
}

// holds reports whether a Lease write names its writer as the holder (a
// take, a renewal or a release), not a waiter queueing.
func holds(w Write) bool {
	for _, r := range lockRecords(w) {
		if r.Session == w.Client {
			return true
		}
	}
	return false
}

// partLog follows one part of the lock through the writes: who took it in
// which order, each holder's expiry (the send time of its latest committed
// renewal plus its lease), and who released it.
type partLog struct {
	name     string // gate or lease
	holders  []string
	expiry   map[string]time.Time
	renewed  map[string]time.Time // the renewedAt of each client's latest renewal
	released map[string]bool
	// acquired is the acquiredAt of each client's latest record; lost,
	// per client, the acquiredAt (Unix ms) of each of its tenures another
	// client took, and the write that took it.
	acquired map[string]time.Time
	lost     map[string]map[int64]int64
}

func newPartLog(name string) *partLog {
	return &partLog{
		name: name, expiry: map[string]time.Time{}, renewed: map[string]time.Time{}, released: map[string]bool{},
		acquired: map[string]time.Time{}, lost: map[string]map[int64]int64{},
	}
}

func (p *partLog) current() string {
	if len(p.holders) == 0 {
		return ""
	}
	return p.holders[len(p.holders)-1]
}

func (p *partLog) held(c string) bool { return p.current() == c }

// startsTenure: a write of c's that is not current starts a tenure unless c
// held the part before and w carries no unreleased record of c's with a
// new acquiredAt (a stale write of a lost tenure stays in that span).
func (p *partLog) startsTenure(w Write) bool {
	if p.tenure(w.Client) == 0 {
		return true
	}
	for _, r := range lockRecords(w) {
		if _, lost := p.lost[w.Client][r.AcquiredAt.UnixMilli()]; r.Session == w.Client && r.ReleasedAt.IsZero() && !lost {
			return true
		}
	}
	return false
}

func (p *partLog) take(c string, seq int64) {
	if prev := p.current(); prev != "" && prev != c {
		if p.lost[prev] == nil {
			p.lost[prev] = map[int64]int64{}
		}
		p.lost[prev][p.acquired[prev].UnixMilli()] = seq
	}
	p.holders = append(p.holders, c)
	delete(p.released, c)
}

// tenure counts c's takes of the part so far: each is a span of its own
// for S1.
func (p *partLog) tenure(c string) int {
	n := 0
	for _, h := range p.holders {
		if h == c {
			n++
		}
	}
	return n
}

func isLease(w Write) bool {
	return w.Res == "leases.coordination.k8s.io" && w.Name == lock.LeaseName(Release)
}

// isBeat reports whether w wrote the release's beat object.
func isBeat(w Write) bool {
	ann, _ := metaOf(w.Object)["annotations"].(map[string]any)
	_, ok := ann[lock.AnnotationBeat]
	return ok && !isRecord(w.Res, w.Name) && !isLease(w)
}

// releases reports whether w marks its writer's lock released.
func releases(w Write) bool {
	for _, r := range lockRecords(w) {
		if r.Session == w.Client && !r.ReleasedAt.IsZero() {
			return true
		}
	}
	return false
}

func partOf(id string) string {
	_, part, _ := strings.Cut(id, "/")
	part, _, _ = strings.Cut(part, "#")
	return part
}
