package sim

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/releasestore"
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
//     beat). Writes that release a lock are left out when they are
//     conditional: a holder releases after its expiry too.
//   - S3: a client's first holder write came before the previous holder's
//     lock expired, that holder not having released it: before the time
//     its latest committed renewal was sent plus its lease, in the
//     server's true time (a record's own times are the holder's estimate,
//     which a shifted Date header moves).
//   - S5: a holder renewed its lock (a beat naming its session, not
//     released) after another client's first holder write followed its
//     own; a holder wrote (a record, its beat, its Lease) at a server time
//     past its own expiry (as for S3), whether anyone took the lock over or
//     not; a write that releases a lock (marks it released, or deletes the
//     holder's Lease or beat) carried no precondition (Write.Cond).
//   - S7: two deployed revisions at once; a revision deleted by a client
//     that was not uninstalling; a revision number skipped.
//   - S2: a client not itself crashed, paused or put to sleep (the final
//     client included) waited longer than recoveryBound on a lock whose
//     holder had let it expire unreleased, counted from the later of its
//     start and that expiry, nobody taking the lock over meanwhile; or it
//     started while such a lock stood and failed for a reason the model
//     does not explain (see excused; a client that took the lock over
//     first explains it too); the final client failed, or took longer than
//     recoveryBound; a revision is left pending at the end.
func Check(o Outcome) []Violation {
	c := &checker{
		o: o, plans: map[string]Plan{}, spans: map[string]*span{}, state: map[string]record{},
		parts: map[string]*partLog{"gate": newPartLog("gate"), "lease": newPartLog("lease")},
	}
	for _, r := range o.Results {
		c.plans[r.Plan.ID] = r.Plan
	}
	for _, w := range o.Writes {
		c.write(w)
	}
	c.interleaved()
	c.history()
	c.recovery()
	c.preemptions()
	return c.vs
}

// checker is Check's state as it reads the writes in commit order.
type checker struct {
	o     Outcome
	vs    []Violation
	plans map[string]Plan
	// Holder writes, for S1: the first and last of each client's tenure
	// of a part, and the tenures in the order of their first write.
	spans map[string]*span
	order []string
	// The lock's parts, for S2, S3 and S5: the gate (on the release
	// records, renewed on the beat) and the Lease.
	parts map[string]*partLog
	state map[string]record // the release's records, for S7
}

type span struct{ first, last int64 }

func (c *checker) add(inv, format string, args ...any) {
	c.vs = append(c.vs, Violation{inv, fmt.Sprintf(format, args...)})
}

func (c *checker) since(t time.Time) time.Duration { return t.Sub(c.o.Start).Round(time.Millisecond) }

// write reads one committed write.
func (c *checker) write(w Write) {
	rec, lease, beat := isRecord(w.Res, w.Name), isLease(w), isBeat(w)
	// helm's writes of the chart's objects are under the lock as its
	// records are: the gate's.
	chart := isChart(w)
	holder := rec || chart || lease && holds(w)
	var part *partLog
	switch {
	case rec || beat || chart:
		part = c.parts["gate"]
	case lease:
		part = c.parts["lease"]
	}
	// S5: a release is exempt from the holder's span and expiry only
	// when it is conditional; a blind one could land over a taker's lock.
	release := part != nil && releases(w)
	if release && w.Cond == "" {
		c.add("S5", "%s released its %s lock by a write with no precondition (write #%d: %s %s/%s at %s)", w.Client, part.name, w.Seq, w.Verb, w.Res, w.Name, c.since(w.At))
	}
	exempt := release && w.Cond != ""
	if part != nil {
		c.lock(w, part, rec || chart, lease, beat, holder, exempt)
	}
	if holder && !exempt {
		// Spans are per part: a client may hold the Lease while the
		// gate is another's (a joint lock waiting for its first part
		// again), writing no release data.
		id := fmt.Sprintf("%s/gate#%d", w.Client, c.parts["gate"].tenure(w.Client))
		if lease {
			id = fmt.Sprintf("%s/lease#%d", w.Client, c.parts["lease"].tenure(w.Client))
		}
		sp := c.spans[id]
		if sp == nil {
			sp = &span{first: w.Seq}
			c.spans[id] = sp
			c.order = append(c.order, id)
		}
		sp.last = w.Seq
	}
	if rec {
		c.record(w)
	}
}

// lock follows w's effect on part: a take (S3), a write past the writer's
// expiry (S5), a renewal (S5 after a takeover) and a release.
func (c *checker) lock(w Write, part *partLog, rec, lease, beat, holder, exempt bool) {
	takes := false
	// S3: a take must come after the previous holder's expiry. A Lease
	// write of its current holder that starts a new tenure (retakes) is a
	// take too.
	if holder && (!part.held(w.Client) || lease && (part.retakes(w) || part.retakesReleased(w))) && part.startsTenure(w) {
		if prev := part.current(); prev != "" && prev != w.Client {
			if e := part.expiry[prev]; !part.released[prev] && w.At.Before(e) {
				c.add("S3", "%s took the %s lock at %s (write #%d) while %s's ran until %s and was not released", w.Client, part.name, c.since(w.At), w.Seq, prev, c.since(e))
			}
		}
		part.take(w.Client, w.Seq, w.At)
		takes = true
	}
	if !exempt && !takes {
		c.afterRelease(w, part, rec, lease, beat)
	}
	// S5: a holder stops writing before its own expiry, taken over or
	// not. helm's write of a record is under every part its writer holds.
	if !exempt {
		c.pastExpiry(w, part, rec, beat, takes)
		if rec && !takes {
			c.pastExpiry(w, c.parts["lease"], false, false, false)
		}
	}
	if beat && part.name == "gate" && !part.holding(w.Client) {
		part.noteClaim(w)
	}
	for _, r := range lockRecords(w) {
		if r.Session != w.Client {
			continue
		}
		if !r.ReleasedAt.IsZero() {
			part.release(w.Client, w.At)
			continue
		}
		// S5: a renewal of a tenure someone took over since. A later
		// take by the same session (a joint lock taking a lost part
		// again) stamps a new acquiredAt, and starts a tenure of its own
		// (seed 8017).
		if at, ok := part.lost[w.Client][r.AcquiredAt.UnixMilli()]; ok && !rec {
			c.add("S5", "%s renewed its %s lock at %s (write #%d) after it was taken over at write #%d", w.Client, part.name, c.since(w.At), w.Seq, at)
		}
		// A claim of the beat with another acquiredAt than the writer's
		// last is a new take's (a take stopped at its deadline reads the
		// lock again and claims anew): its expiry runs from its own send
		// time, whatever its stamps say; they can move back as the
		// writer's estimate of server time narrows (seeds 10627, 31414).
		// Only a take writes the beat with a new acquiredAt; helm's
		// copies of the record are release records, not the beat.
		newClaim := beat && !r.AcquiredAt.Equal(part.acquired[w.Client])
		part.acquired[w.Client] = r.AcquiredAt
		// A renewal is a write of a later renewedAt; a helm write
		// carrying the record unchanged, or an older copy of it (a
		// revision's, written before later renewals on the beat), renews
		// nothing (seed 1997).
		if !newClaim && !r.RenewedAt.After(part.renewed[w.Client]) {
			continue
		}
		part.renewed[w.Client] = r.RenewedAt
		part.renew(w.Client, w.Sent.Add(r.LeaseDuration.Duration), r.RenewedAt.Add(r.LeaseDuration.Duration), w.At, takes)
	}
	if (lease || beat) && w.Verb == "delete" && holds(w) {
		// The holder deleted its Lease or beat: nothing is left to lock.
		part.release(w.Client, w.At)
	}
}

// pastExpiry flags w (S5) when it landed after its writer's expiry on
// part p: in a tenure of p the writer has not released (taken over or
// not), or, on the gate, in a claim of the beat (rule 5 of
// docs/protocol.md: a claimant holds the release) that the write renews or
// turns into a take of the gate. A write of the beat counts when it
// carries the writer's heartbeat (a waiter's queue entry carries the
// holder's), one of the Lease when it names the writer.
func (c *checker) pastExpiry(w Write, p *partLog, rec, beat, takes bool) {
	if !rec && !holds(w) {
		return
	}
	what := "lock"
	expiry := time.Time{}
	if t := p.cur[w.Client]; t != nil && !t.released && !takes {
		if beat && !c.carries(w, p.acquired[w.Client]) {
			return // a new claim, after a tenure taken over
		}
		if (beat || p.name == "lease") && !c.renews(w, p) {
			// The beat (or the Lease) written with the holder's record
			// as it stood renews nothing: a queue write of a waiter
			// that is the holder itself (its take's answer was lost,
			// its own lock expired, and waiters came first:
			// lock.Backend.attempt queues it behind them; seed 79 on
			// the beat, 58682 on the Lease). As for a claim below, only
			// a write of a later renewedAt is the holder's: every write
			// of the lock stamps one (Held.writeLocked).
			return
		}
		expiry = t.expiry
	} else if p.name == "gate" && (beat && c.renews(w, p) || takes) && c.carries(w, p.acquired[w.Client]) {
		// A claim of the beat renewed, or the gate taken on it (a
		// waiter's queue entry written beside its claim unchanged renews
		// nothing).
		what, expiry = "claim of the beat", p.expiry[w.Client]
	}
	if expiry.IsZero() || !w.At.After(expiry) {
		return
	}
	when := "in flight at"
	if w.Sent.After(expiry) {
		when = "sent after"
	} else if w.Cond != "" && c.heldByOwnStop(w) && !p.takenBetween(w.Client, expiry, w.At) {
		// The residual risk of a paused process (docs/protocol.md): a
		// write sent in time whose writer then stood still with it in
		// flight lands late. Every write the simulation models is a
		// lock object or a release record, conditional on what its
		// writer read: nobody took over meanwhile, so it changed only
		// what its writer held (one that lands after a take is S1 or a
		// failed precondition). Seeds 5041 and 69572.
		return
	}
	c.add("S5", "%s wrote (%s %s/%s, write #%d) at %s, sent at %s, after its %s %s expired at %s (%s its expiry)", w.Client, w.Verb, w.Res, w.Name, w.Seq, c.since(w.At), c.since(w.Sent), p.name, what, c.since(expiry), when)
}

// heldByOwnStop reports whether write w was held in flight by a pause or a
// system sleep of its own writer: the writer's plan has one, and w landed
// later after it was sent than the network's latency alone explains.
func (c *checker) heldByOwnStop(w Write) bool {
	for _, r := range c.o.Results {
		if r.Plan.ID != w.Client {
			continue
		}
		stops := r.Plan.PauseAt > 0 && r.Plan.PauseFor > 0 || r.Plan.SleepAt > 0 && r.Plan.SleepFor > 0
		return stops && w.At.Sub(w.Sent) > c.o.Schedule.Faults.MaxLatency
	}
	return false
}

// takenBetween reports whether a client other than holder took part p in
// (from, to].
func (p *partLog) takenBetween(holder string, from, to time.Time) bool {
	for _, t := range p.tenures {
		if t.client != holder && t.from.After(from) && !t.from.After(to) {
			return true
		}
	}
	return false
}

// afterRelease flags w (S5) when its writer had released the tenure of
// part p it writes under: a record or a chart's object on the gate, not
// claimed again on the beat since; the Lease naming it. A holder stopped
// at a waiter's request (issue 34) gives the lock back right after helm's
// writes were drained: nothing of its may land after. (A write after a
// release followed by another client's take is S1 too; one with no taker
// after it is caught here alone.) A gate the checker counts released
// because an uninstall deleted the last record is not its holder's
// release: its keeper may still renew the beat.
func (c *checker) afterRelease(w Write, p *partLog, rec, lease, beat bool) {
	t := p.cur[w.Client]
	if t == nil || !t.released || t.gone {
		return
	}
	if beat && claims(w) {
		// A claim of the beat again: a joint lock that gave its gate
		// back to wait for its Lease takes the gate again, with the
		// same acquiredAt (seed 978) or a new one (seed 13942).
		t.reclaimed = true
	}
	if t.reclaimed || !rec && (!lease || !holds(w)) {
		return
	}
	c.add("S5", "%s wrote (%s %s/%s, write #%d) at %s, after it released its %s lock at %s", w.Client, w.Verb, w.Res, w.Name, w.Seq, c.since(w.At), p.name, c.since(t.releasedAt))
}

// claims reports whether w carries an unreleased lock record of its
// writer.
func claims(w Write) bool {
	for _, r := range lockRecords(w) {
		if r.Session == w.Client && r.ReleasedAt.IsZero() {
			return true
		}
	}
	return false
}

// renews reports whether w carries a renewal of its writer's lock on p: a
// later renewedAt than the writer's last.
func (c *checker) renews(w Write, p *partLog) bool {
	for _, r := range lockRecords(w) {
		if r.Session == w.Client && r.RenewedAt.After(p.renewed[w.Client]) {
			return true
		}
	}
	return false
}

// carries reports whether w carries its writer's unreleased lock record
// of the tenure (or claim) acquired at acquired.
func (c *checker) carries(w Write, acquired time.Time) bool {
	for _, r := range lockRecords(w) {
		if r.Session == w.Client && r.ReleasedAt.IsZero() && r.AcquiredAt.Equal(acquired) {
			return true
		}
	}
	return false
}

// record follows the history of the release's records (S7).
func (c *checker) record(w Write) {
	if w.Verb == "delete" {
		if p, ok := c.plans[w.Client]; (ok && p.Op != autorecover.OpUninstall) || w.Client == "final" {
			c.add("S7", "%s (not uninstalling) deleted revision record %s at %s (write #%d)", w.Client, w.Name, c.since(w.At), w.Seq)
		}
		delete(c.state, w.Name)
		if len(c.state) == 0 {
			// An uninstall that deleted the last record took the lock
			// on the records with it.
			c.parts["gate"].release(w.Client, w.At)
			if t := c.parts["gate"].cur[w.Client]; t != nil {
				t.gone = true
			}
		}
	} else {
		c.state[w.Name] = recordOf(w.Name, w.Object)
	}
	deployed := 0
	for _, r := range c.state {
		if r.status == "deployed" {
			deployed++
		}
	}
	if deployed > 1 {
		c.add("S7", "%d revisions deployed after write #%d at %s by %s", deployed, w.Seq, c.since(w.At), w.Client)
	}
}

// interleaved checks S1: the holder spans of one part must not
// interleave.
func (c *checker) interleaved() {
	for i, a := range c.order {
		for _, b := range c.order[i+1:] {
			ta, tb := c.spans[a], c.spans[b]
			if partOf(a) == partOf(b) && tb.first < ta.last {
				c.add("S1", "%s wrote (last write #%d) after %s's first holder write #%d", a, ta.last, b, tb.first)
			}
		}
	}
}

// history checks the records left at the end: no revision missing (S7),
// none pending (S2).
func (c *checker) history() {
	recs := make([]record, 0, len(c.state))
	for _, r := range c.state {
		recs = append(recs, r)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].version < recs[j].version })
	for i := 1; i < len(recs); i++ {
		if recs[i].version != recs[i-1].version+1 {
			c.add("S7", "revision %d is missing (history ends with %d after %d)", recs[i-1].version+1, recs[i].version, recs[i-1].version)
		}
	}
	for _, r := range recs {
		if r.status == "pending-install" || r.status == "pending-upgrade" || r.status == "pending-rollback" || r.status == "uninstalling" {
			c.add("S2", "revision %d left %s at the end", r.version, r.status)
		}
	}
}

// recovery checks S2 for every client: the final one succeeds within the
// bound, and no client is held up by an expired lock for longer, or fails
// where it found one.
func (c *checker) recovery() {
	o := c.o
	bound := recoveryBound(o.Schedule)
	if o.Final.Plan.ID != "" {
		if o.Final.Err != nil {
			c.add("S2", "the final %s failed: %v", o.Final.Plan.Op, o.Final.Err)
		}
		if o.Recovery > bound {
			c.add("S2", "the final %s took %s, more than %s", o.Final.Plan.Op, o.Recovery.Round(time.Millisecond), bound)
		}
	}
	for _, r := range append(append([]Result(nil), o.Results...), o.Final) {
		if r.Plan.ID == "" || r.Started.IsZero() || !recovers(r) {
			continue
		}
		// A joint lock takes the gate, then the Lease: it waits for the
		// Lease only once it holds the gate.
		gate := c.parts["gate"]
		c.recovered(r, gate, r.Started, bound)
		if r.Plan.Backend == autorecover.BackendLease {
			c.recovered(r, c.parts["lease"], gate.firstTake(r.Plan.ID, r.Started), bound)
		}
	}
}

// recovered checks S2 for client r on part p, which it waits for from
// waits on, against every span in which p stood expired and unreleased
// under another client.
func (c *checker) recovered(r Result, p *partLog, waits time.Time, bound time.Duration) {
	me := r.Plan.ID
	waitEnd := minTime(p.firstTake(me, r.Started), r.Ended)
	for _, st := range p.stuck() {
		if st.holder == me {
			continue
		}
		from := maxTime(waits, st.from)
		if !from.Before(waitEnd) || !from.Before(st.to) {
			continue
		}
		// The bound counts the client's own requests on a clean network:
		// retries of faults, or latency its take and renewals cannot
		// keep up with (slowFor), add to it; and it runs from when the
		// entries of waiters that came first and died queued are gone.
		if waited := minTime(st.to, waitEnd).Sub(maxTime(from, c.deadAheadGone(r, p))); waited > bound && !c.netFailedAt(r, slowFor(r.Plan.Lease)) {
			c.add("S2", "%s waited %s from %s on %s's %s lock, expired since %s and not released, longer than %s", me, waited.Round(time.Millisecond), c.since(from), st.holder, p.name, c.since(st.from), bound)
		}
		// It found the lock expired: it succeeds, or fails for a reason
		// of its own, or while the API server's clock, as it could read
		// it, had not passed the LOCKED TILL the holder stamped, or after
		// the lock was released or taken by another client (or claimed:
		// a take in flight), or behind a waiter that came first.
		if r.Err == nil || r.Started.Before(st.from) || r.Started.Before(readable(st.stamped, r.Plan)) || c.excused(r) ||
			st.by != me && st.to.Before(r.Ended) || c.queuedAhead(r, p) || p.claimedAhead(r, st) {
			continue
		}
		c.add("S2", "%s started at %s while %s's %s lock stood expired since %s (LOCKED TILL stamped %s), and failed at %s: %v", me, c.since(r.Started), st.holder, p.name, c.since(st.from), c.since(st.stamped), c.since(r.Ended), r.Err)
	}
}

// readable is the earliest true time at which client p can read the API
// server's clock past LOCKED TILL stamped, plus the takeover margin: a
// Date header is truncated to its second, so the lower bound of its
// estimate trails by up to a second, more when its Date headers run
// behind (Plan.DateShift).
func readable(stamped time.Time, p Plan) time.Time {
	return stamped.Add(lock.TakeoverMargin + time.Second + max(0, -p.DateShift))
}

// queuedAhead reports whether another client that started before r was
// still waiting for part p when r failed (or had crashed waiting less than
// its lease before, its entry standing): r's refusal keeps their arrival
// order (S1).
func (c *checker) queuedAhead(r Result, p *partLog) bool {
	for _, q := range c.o.Results {
		if q.Plan.ID == r.Plan.ID || q.Started.IsZero() || !q.Started.Before(r.Started) || q.Plan.Wait == 0 {
			continue
		}
		gone := q.Ended
		if q.Crashed {
			// A dead waiter's entry stands until seen unchanged for
			// its lease.
			gone = readable(q.CrashAt.Add(q.Plan.Lease), r.Plan)
		}
		if gone.After(r.Ended) && p.firstTake(q.Plan.ID, q.Started).After(r.Ended) {
			return true
		}
	}
	return false
}

// deadAheadGone is when the last entry that a waiter which started before
// r and crashed while still waiting for part p left in the queue is gone
// (zero when none): such an entry stands, as r's own would, until seen
// unchanged for its waiter's lease (docs/protocol.md), and r rightly waits
// behind it till then (the simulation, seed 96028: two waiters crashed
// queued ahead, the next one waited 27.5 s, and S2 took the 2.3 s over its
// bound for a defect).
func (c *checker) deadAheadGone(r Result, p *partLog) time.Time {
	var gone time.Time
	for _, q := range c.o.Results {
		if q.Plan.ID == r.Plan.ID || !q.Crashed || q.Started.IsZero() || !q.Started.Before(r.Started) || q.Plan.Wait == 0 {
			continue
		}
		if p.firstTake(q.Plan.ID, q.Started).Before(q.CrashAt) {
			continue // it held the part when it died: a holder, not a waiter
		}
		if p.name == "lease" && (q.Plan.Backend != autorecover.BackendLease || !c.parts["gate"].firstTake(q.Plan.ID, q.Started).Before(q.CrashAt)) {
			// A joint lock waits for the Lease only once it holds the
			// gate (recovery): a waiter that died before, or that
			// never takes the Lease, left no entry in its queue
			// (review of e4fdf6c).
			continue
		}
		gone = maxTime(gone, readable(q.CrashAt.Add(q.Plan.Lease), r.Plan))
	}
	return gone
}

// recovers reports whether S2 binds client r: it did not crash, and was
// not paused or put to sleep for its lease or longer (it may then lose its
// own lock and fail, as it should).
func recovers(r Result) bool {
	p := r.Plan
	switch {
	case r.Crashed:
		return false
	case p.PauseAt > 0 && p.PauseAt <= r.Counts.Requests && p.PauseFor >= p.Lease:
		return false
	case p.SleepAt > 0 && p.SleepAt <= r.Counts.Requests && p.SleepFor >= p.Lease:
		return false
	}
	return true
}

// slowNetwork is the latency bound at which a schedule's network explains
// a client's failure whatever its lease: a renewal whose round trip takes
// lock.RenewMargin (1 s) can miss the renew deadline, a lease less that
// margin after the last renewal was sent.
const slowNetwork = lock.RenewMargin

// slowFor is the latency (Faults.MaxLatency bounds a request's round
// trip) at which a network with no fault can make a holder with lease
// miss its renew deadline, lease - RenewMargin after it sent its last
// renewal, as the protocol times its requests (docs/protocol.md):
//
//   - a renewal, due a third of the lease after the last was sent, is two
//     requests (rule 2: a read of the records, then the beat's write) and
//     must be answered within lease - lease/3 - RenewMargin;
//   - a take holds its lock from its claim's send (rule 1), and its first
//     renewal is answered five requests later at the soonest: the claim,
//     a read of the records, the gate's write, then the renewal's two.
//
// It is at most slowNetwork; for a 3 s lease 400 ms, for 5 s 800 ms
// (seeds 3358, 26457: 3 s leases on networks of up to 864 ms and 602 ms
// a request, a holder whose take or renewal could not be answered in
// time).
func slowFor(lease time.Duration) time.Duration {
	take := (lease - lock.RenewMargin) / 5
	renewal := (lease - lease/3 - lock.RenewMargin) / 2
	return min(slowNetwork, take, renewal)
}

// excused reports whether r's failure is explained without recovery: its
// network failed it (a fault injected on its link, or latency that can
// make its renewals miss their deadline), or its helm refused the history it read (a
// refusal; helm's refusal of a pending release is not one), or it held the
// lock and stopped at a waiter's request (preemptions checks that one).
func (c *checker) excused(r Result) bool {
	var ref refusal
	return c.netFailed(r) || errors.As(r.Err, &ref) || errors.Is(r.Err, autorecover.ErrPreempted)
}

// netFailed reports whether r's network failed it: a fault injected on
// its link, or latency that can make its renewals miss their deadline.
// The protocol's own timing of its renewals (slowFor) explains a lock
// lost, or a write of it cut at its renew deadline, not a refusal of a
// lock that expired long before (found by review): any other failure is
// put down to latency only from slowNetwork on.
func (c *checker) netFailed(r Result) bool {
	slow := slowNetwork
	if errors.Is(r.Err, lock.ErrLost) || errors.Is(r.Err, context.DeadlineExceeded) {
		slow = slowFor(r.Plan.Lease)
	}
	return c.netFailedAt(r, slow)
}

// netFailedAt reports whether r's network failed it: a fault injected on
// its link, or latency of at least slow.
func (c *checker) netFailedAt(r Result, slow time.Duration) bool {
	n := r.Counts
	return n.Reset+n.Lost+n.Throttle+n.Unavailable+n.Conflict > 0 || !r.Plan.Clean && c.o.Schedule.Faults.MaxLatency >= slow
}

// recoveryBound is how long a client may wait for an expired lock (the
// final client, for its whole operation): a client that did not see the
// holder die waits one lease of it and the margin on its own clock before
// it takes over (lock.Confirm), polling every third of a lease, plus its
// own requests.
func recoveryBound(s Schedule) time.Duration {
	longest := FinalLease
	for _, p := range s.Plans {
		longest = max(longest, p.Lease)
	}
	return longest + longest/3 + lock.TakeoverMargin + 5*time.Second
}

// holds reports whether a write's lock record names its writer (a take, a
// renewal or a release), not a waiter queueing.
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
	stamped  map[string]time.Time // the LOCKED TILL each client stamped last
	renewed  map[string]time.Time // the renewedAt of each client's latest renewal
	released map[string]bool
	// acquired is the acquiredAt of each client's latest record; lost,
	// per client, the acquiredAt (Unix ms) of each of its tenures another
	// client took, and the write that took it.
	acquired map[string]time.Time
	lost     map[string]map[int64]int64
	// tenures are the takes in order; cur is each client's latest.
	tenures []*tenure
	cur     map[string]*tenure
	// claims are the claims of the beat by clients not holding the gate.
	claims []claim
}

// tenure is one client's hold of a part, from its take to its release or
// the next take, for S2 and S5.
type tenure struct {
	client string
	from   time.Time
	expiry time.Time
	// stamped is the latest LOCKED TILL its holder stamped (renewedAt
	// plus the lease, in its estimate of the server's clock).
	stamped  time.Time
	end      time.Time // zero: held to the end
	by       string    // who took it over, "" when released or held
	released bool
	// releasedAt is when its holder released it; gone, that the release
	// was the uninstall of the last record, not the holder's.
	releasedAt time.Time
	gone       bool
	// reclaimed: its holder claimed the beat again after its release.
	reclaimed bool
	// gaps are the spans in which it stood expired before a late
	// renewal of its holder landed.
	gaps []stuckSpan
}

// stuckSpan is a time in which a holder's lock stood expired and
// unreleased: from its expiry to the next take (by names the taker), the
// holder's late renewal or release, or never.
type stuckSpan struct {
	holder   string
	from, to time.Time
	by       string
	stamped  time.Time // the holder's LOCKED TILL as it stamped it
}

func newPartLog(name string) *partLog {
	return &partLog{
		name: name, expiry: map[string]time.Time{}, stamped: map[string]time.Time{}, renewed: map[string]time.Time{}, released: map[string]bool{},
		acquired: map[string]time.Time{}, lost: map[string]map[int64]int64{}, cur: map[string]*tenure{},
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

// retakes reports whether w, a write naming its writer as holder, carries
// an unreleased record of the writer acquired later than its latest: a new
// tenure, though the writer holds the part already. Only a take stamps a
// new acquiredAt (a renewal keeps it), and it is conditional on the lock it
// read: a take whose answer was lost, which found its own lock expired and
// took it again (lock.Backend.adopt; seed 372), is a take like any other,
// not a renewal of the tenure it found expired.
func (p *partLog) retakes(w Write) bool {
	for _, r := range lockRecords(w) {
		if r.Session == w.Client && r.ReleasedAt.IsZero() && r.AcquiredAt.After(p.acquired[w.Client]) {
			return true
		}
	}
	return false
}

// retakesReleased reports whether w, a conditional write naming its writer
// as holder of the Lease it released, takes the Lease again: it committed
// after the release, so it was made from the released Lease (or a later
// version), which its writer judged free. A joint lock that gave its Lease
// back to take an earlier part again (lock.acquisition.giveBackFrom) takes
// the Lease again so, with the same acquiredAt (seeds 177425, 238406,
// 277079). A blind write after the release is not a take.
func (p *partLog) retakesReleased(w Write) bool {
	t := p.cur[w.Client]
	return t != nil && t.released && !t.gone && strings.HasPrefix(w.Cond, "rv=") && claims(w)
}

// take starts c's tenure at write seq, committed at at.
func (p *partLog) take(c string, seq int64, at time.Time) {
	if prev := p.current(); prev != "" && prev != c {
		if p.lost[prev] == nil {
			p.lost[prev] = map[int64]int64{}
		}
		p.lost[prev][p.acquired[prev].UnixMilli()] = seq
	}
	if n := len(p.tenures); n > 0 && p.tenures[n-1].end.IsZero() {
		p.tenures[n-1].end, p.tenures[n-1].by = at, c
	}
	t := &tenure{client: c, from: at, expiry: p.expiry[c], stamped: p.stamped[c]}
	p.tenures = append(p.tenures, t)
	p.cur[c] = t
	p.holders = append(p.holders, c)
	delete(p.released, c)
}

// renew moves c's expiry to till, when that is later, by a write committed
// at at, and its stamped LOCKED TILL to stamped. A renewal of the holder that landed after its expiry (not its
// take) ends a span in which its lock stood expired.
func (p *partLog) renew(c string, till, stamped, at time.Time, takes bool) {
	if stamped.After(p.stamped[c]) {
		p.stamped[c] = stamped
		if t := p.cur[c]; t != nil && p.held(c) && !t.released {
			t.stamped = stamped
		}
	}
	if !till.After(p.expiry[c]) {
		return
	}
	if t := p.cur[c]; t != nil && p.held(c) && !t.released {
		if !takes && at.After(t.expiry) {
			t.gaps = append(t.gaps, stuckSpan{holder: c, from: t.expiry, to: at, stamped: t.stamped})
		}
		t.expiry = till
	}
	p.expiry[c] = till
}

// release marks c's lock released at at.
func (p *partLog) release(c string, at time.Time) {
	p.released[c] = true
	if t := p.cur[c]; t != nil && !t.released {
		t.released, t.releasedAt = true, at
		if t.end.IsZero() {
			t.end = at
		}
	}
}

// claim is a claim of the beat by a client that does not hold the gate:
// a take in flight (docs/protocol.md, rule 5).
type claim struct {
	client  string
	at      time.Time
	lease   time.Duration
	stamped time.Time // its LOCKED TILL as its writer stamped it
}

// holding reports whether c holds the part in a tenure it has not
// released: its beat writes are renewals, not claims.
func (p *partLog) holding(c string) bool {
	t := p.cur[c]
	return p.held(c) && t != nil && !t.released
}

// noteClaim records w, a write of the beat, when it carries an unreleased
// record of its writer: a claim.
func (p *partLog) noteClaim(w Write) {
	for _, r := range lockRecords(w) {
		if r.Session == w.Client && r.ReleasedAt.IsZero() {
			p.claims = append(p.claims, claim{client: w.Client, at: w.At, lease: r.LeaseDuration.Duration, stamped: r.RenewedAt.Add(r.LeaseDuration.Duration)})
		}
	}
}

// claimedAhead reports whether another client claimed the beat while
// st's lock stood expired, before r failed, and r failed while that claim
// stood: rule 5 of docs/protocol.md judges a claim in flight Live, held by
// the claimant, by everybody but the claimant, until its LOCKED TILL has
// passed in server time and it has been seen unchanged for its lease (a
// claimant that died holds the release that long). A client that found
// the lock so was refused by a client that came first, as it is by a
// taker's write of the gate (seeds 5568, 7546). A claim that came after
// r took the gate itself (over r's own expired lock, say) explains
// nothing.
func (p *partLog) claimedAhead(r Result, st stuckSpan) bool {
	// A claim after r took the gate itself did not come first.
	until := minTime(r.Ended, p.firstTake(r.Plan.ID, r.Started))
	for _, cl := range p.claims {
		if cl.client == r.Plan.ID || cl.at.Before(st.from) || until.Before(cl.at) {
			continue
		}
		live := maxTime(readable(cl.stamped, r.Plan), maxTime(cl.at, r.Started).Add(cl.lease+lock.TakeoverMargin))
		if !r.Ended.After(live) {
			return true
		}
	}
	return false
}

// firstTake is when c first took the part at or after from, or never.
func (p *partLog) firstTake(c string, from time.Time) time.Time {
	for _, t := range p.tenures {
		if t.client == c && !t.from.Before(from) {
			return t.from
		}
	}
	return never
}

// stuck lists the spans in which the part stood expired and unreleased.
func (p *partLog) stuck() []stuckSpan {
	var out []stuckSpan
	for _, t := range p.tenures {
		out = append(out, t.gaps...)
		end := t.end
		if end.IsZero() {
			end = never
		}
		if end.After(t.expiry) {
			out = append(out, stuckSpan{holder: t.client, from: t.expiry, to: end, by: t.by, stamped: t.stamped})
		}
	}
	return out
}

// never is a time after every run.
var never = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
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

// isChart reports whether w wrote one of the chart's objects (the
// simulated helm's hook and the object it applies).
func isChart(w Write) bool {
	return w.Res == "configmaps" && w.NS == Namespace && (w.Name == Release || w.Name == Release+"-hook")
}

func isLease(w Write) bool {
	return w.Res == "leases.coordination.k8s.io" && w.Name == lock.LeaseName(Release)
}

// isBeat reports whether w wrote the release's beat object.
func isBeat(w Write) bool {
	ann, _ := metaOf(w.Object)["annotations"].(map[string]any)
	_, ok := ann[releasestore.AnnotationBeat]
	return ok && !isRecord(w.Res, w.Name) && !isLease(w)
}

// releases reports whether w releases its writer's lock: it marks it
// released, or deletes the Lease or the beat naming the writer (the
// object a delete records is the one it deleted).
func releases(w Write) bool {
	if w.Verb == "delete" && (isLease(w) || isBeat(w)) {
		return holds(w)
	}
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

// preemptions checks every holder stopped at a waiter's request (issue
// 34): the waiter it names asked (Plan.Preempt), else it stopped for
// nobody (S3); and the holder marked the revision it created failed
// itself, naming that waiter (DescriptionPreempted), before any other
// client wrote that record, else it left its revision to recovery (S2).
// A holder whose network failed it, that was paused or put to sleep past
// its lease, or whose lock expired before that other client's write, may
// leave it to recovery.
func (c *checker) preemptions() {
	for _, r := range c.o.Results {
		var pe *autorecover.PreemptedError
		if !errors.As(r.Err, &pe) {
			continue
		}
		me, asker := r.Plan.ID, pe.By.Session
		if p, ok := c.plans[asker]; !ok || !p.Preempt {
			c.add("S3", "%s stopped at the request of %s, which did not ask to preempt", me, asker)
		}
		if !recovers(r) || c.netFailed(r) {
			continue
		}
		created, done := "", false
		for _, w := range c.o.Writes {
			switch {
			case done || !isRecord(w.Res, w.Name):
			case created == "":
				if w.Client == me && w.Verb == "create" {
					created = w.Name
				}
			case w.Name != created:
			case w.Client != me:
				// A holder whose lock ran out before it could settle
				// writes nothing more (S5): the next client recovers
				// its revision, as any abandoned one (seeds 68370,
				// 75757: 3 s leases).
				if !w.At.After(c.parts["gate"].expiry[me]) {
					c.add("S2", "%s, stopped at the request of %s, left its revision %s to %s (write #%d at %s)", me, asker, created, w.Client, w.Seq, c.since(w.At))
				}
				done = true
			case recordOf(w.Name, w.Object).status == "failed":
				if d := description(w); !strings.HasPrefix(d, "Preempted ") || !strings.Contains(d, "session "+asker) {
					c.add("S2", "%s marked its revision %s failed (write #%d) with a description that does not name its preemptor %s: %q", me, created, w.Seq, asker, d)
				}
				done = true
			}
		}
		if created != "" && !done {
			c.add("S2", "%s, stopped at the request of %s, never marked its revision %s failed", me, asker, created)
		}
	}
}

// description is the description of the release a record write stored,
// "" when it cannot be read.
func description(w Write) string {
	data, _ := w.Object["data"].(map[string]any)
	enc, _ := data["release"].(string)
	raw, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return ""
	}
	js, err := helmx.DecodeReleaseJSON(raw)
	if err != nil {
		return ""
	}
	var rel struct {
		Info struct {
			Description string `json:"description"`
		} `json:"info"`
	}
	if json.Unmarshal(js, &rel) != nil {
		return ""
	}
	return rel.Info.Description
}
