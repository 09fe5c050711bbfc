package sim

import (
	"fmt"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/pkg/autorecover"
)

// Check reads an outcome's committed writes (the model's history, in
// commit order and in the server's own time, so exactly) and returns every
// violation it sees:
//
//   - S1: two clients whose holder writes (the release's Lease and release
//     records; the beat is left out, waiters write it) interleave: one
//     wrote after another's first holder write and before its last.
//   - S3: a client's first holder write came before the previous holder's
//     lock expired (the latest renewedAt + leaseDuration it committed, in
//     server time), that holder not having released it.
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

	type tenure struct {
		first, last  int64 // Seq of the first and last holder write
		firstAt      time.Time
		expiry       time.Time // latest renewedAt + leaseDuration committed
		released     bool
		holderWrites int
	}
	ten := map[string]*tenure{}
	var order []string // clients by first holder write
	state := map[string]record{}
	for _, w := range o.Writes {
		holder := w.Res == "leases.coordination.k8s.io" && w.Name == lock.LeaseName(Release) || isRecord(w.Res, w.Name)
		t := ten[w.Client]
		for _, r := range lockRecords(w) {
			if r.Session != w.Client {
				continue
			}
			if t == nil {
				t = &tenure{first: -1}
				ten[w.Client] = t
			}
			if !r.ReleasedAt.IsZero() {
				t.released = true
			} else if till := r.RenewedAt.Add(r.LeaseDuration.Duration); till.After(t.expiry) {
				t.expiry = till
			}
		}
		if holder {
			if t == nil {
				t = &tenure{first: -1}
				ten[w.Client] = t
			}
			if t.first < 0 {
				t.first, t.firstAt = w.Seq, w.At
				// S3: the previous holder's lock must have expired or been
				// released.
				if n := len(order); n > 0 {
					prevID := order[n-1]
					prev := ten[prevID]
					if !prev.released && w.At.Before(prev.expiry) {
						add("S3", "%s took the lock at %s (write #%d) while %s's ran until %s and was not released", w.Client, since(w.At), w.Seq, prevID, since(prev.expiry))
					}
				}
				order = append(order, w.Client)
			}
			t.last = w.Seq
			t.holderWrites++
		}
		// S5: a renewal after a later holder's take.
		if w.Res == "secrets" && w.Name != "" && !holder && t != nil && t.first >= 0 {
			for _, r := range lockRecords(w) {
				if r.Session != w.Client || !r.ReleasedAt.IsZero() {
					continue
				}
				for _, id := range order {
					if u := ten[id]; id != w.Client && u.first > t.first && u.first < w.Seq {
						add("S5", "%s renewed its lock at %s (write #%d) after %s took it at write #%d", w.Client, since(w.At), w.Seq, id, u.first)
						break
					}
				}
			}
		}
		// S7: history.
		if isRecord(w.Res, w.Name) {
			if w.Verb == "delete" {
				if p, ok := plans[w.Client]; (ok && p.Op != autorecover.OpUninstall) || w.Client == "final" {
					add("S7", "%s (not uninstalling) deleted revision record %s at %s (write #%d)", w.Client, w.Name, since(w.At), w.Seq)
				}
				delete(state, w.Name)
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
			ta, tb := ten[a], ten[b]
			if tb.first < ta.last {
				add("S1", "%s wrote (last write #%d) after %s's first holder write #%d", a, ta.last, b, tb.first)
			}
		}
	}
	// S7: revisions contiguous at the end.
	recs := make([]record, 0, len(state))
	for _, r := range state {
		recs = append(recs, r)
	}
	sortRecords(recs)
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
		if r.status == "pending-install" || r.status == "pending-upgrade" || r.status == "pending-rollback" {
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

func sortRecords(rs []record) {
	for i := 1; i < len(rs); i++ {
		for j := i; j > 0 && rs[j].version < rs[j-1].version; j-- {
			rs[j], rs[j-1] = rs[j-1], rs[j]
		}
	}
}
