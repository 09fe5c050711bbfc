package lock

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// TakeoverMargin is added to a lock's expiry (LOCKED TILL) before another
// client may take it over. The server-time bounds are already rigorous,
// drift allowance included (200 ppm); the margin covers a local clock whose
// rate is adjusted beyond that (NTP slews up to 500 ppm: 180 ms over a
// ten-minute-old observation).
const TakeoverMargin = 250 * time.Millisecond

// RenewMargin is taken off the holder's own renew deadline: the holder stops
// writing RenewMargin before its LOCKED TILL, so a write it checked just
// before its deadline has that long to reach the API server. Together with
// TakeoverMargin, the last write a holder may send and the first write of a
// client that takes over are at least 1.25 s apart in server time.
const RenewMargin = time.Second

// State is the judgement of a lock.
type State int

const (
	// Free: no Lease, or its holderIdentity is empty (released).
	Free State = iota
	// Live: held, and not provably past its LOCKED TILL in server time.
	Live
	// Expired: held, but the server clock has certainly passed LOCKED TILL
	// plus the margin; the holder has stopped writing.
	Expired
)

func (s State) String() string {
	switch s {
	case Free:
		return "free"
	case Live:
		return "live"
	case Expired:
		return "expired"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Judge decides the state of a lock from its record (nil when absent or
// unreadable), the Lease spec (nil when there is no Lease), bounds on the
// server's clock now, and the margin.
//
// A lock is Expired only when now.Earliest is after LockedTill(rec, spec) +
// margin, so a reader whose estimate is uncertain errs towards Live. A lock
// whose expiry cannot be told at all (no readable record and no renewTime in
// the spec), or judged without any server time, is Live.
func Judge(rec *Record, spec *coordinationv1.LeaseSpec, now servertime.Bounds, margin time.Duration) State {
	if spec == nil || HolderOf(spec) == "" {
		return Free
	}
	till, ok := LockedTill(rec, spec)
	if !ok || now.IsZero() {
		return Live
	}
	if now.Earliest.After(till.Add(margin)) {
		return Expired
	}
	return Live
}

// ServerPassedLockedTill reports whether a holder must stop writing under
// its lock because the API server's clock, by the lower bound now gives
// (known false: nothing observed yet), has reached lockedTill, the holder's
// own LOCKED TILL as it last wrote it, less margin (the renew margin),
// whatever the holder's local clocks say. Its local renew deadline comes
// first as long as those clocks run; this rule catches clocks that stood
// still while the world went on: a virtual machine stopped and resumed, a
// memory snapshot or a CRIU image restored, where CLOCK_MONOTONIC and
// CLOCK_BOOTTIME both stop, and a client judging by the server's clock may
// take the lock over meanwhile.
//
// It can only end a holder's tenure early: a Date header that lies (a
// server clock stepped forward, a proxy) at worst stops this holder, and
// never lets anyone take a lock over (that is Judge's, with its margin, and
// Confirm's on the taker's own clock).
//
// The lower bound is the right one to stop by: a Date header is truncated
// to the second, so the server's clock is at least the bound, and up to a
// second more. A taker needs its own lower bound past lockedTill plus the
// takeover margin, so the server's clock is past that too; one Date header
// read by the holder afterwards gives a lower bound less than a second
// behind it, already past lockedTill less the renew margin (a second, no
// less than the header's resolution less the takeover margin). The first
// answer the holder reads after its clocks resumed thus stops it.
func ServerPassedLockedTill(lockedTill time.Time, now servertime.Bounds, known bool, margin time.Duration) bool {
	if !known || lockedTill.IsZero() || now.Earliest.IsZero() {
		return false
	}
	return !now.Earliest.Before(lockedTill.Add(-margin))
}

// LockedTill returns the server time until which the holder named in spec may
// write, and false when it cannot be told. It is the later of the record's
// LockedTill (when the record belongs to the holder named in the spec) and
// renewTime + leaseDurationSeconds from the spec, so a stale or foreign
// record never shortens a lock.
func LockedTill(rec *Record, spec *coordinationv1.LeaseSpec) (time.Time, bool) {
	var till time.Time
	ok := false
	if spec != nil && spec.LeaseDurationSeconds != nil {
		base := spec.RenewTime
		if base == nil {
			base = spec.AcquireTime
		}
		if base != nil {
			till = base.Add(time.Duration(*spec.LeaseDurationSeconds) * time.Second)
			ok = true
		}
	}
	if rec != nil && spec != nil && rec.Session != "" && rec.Session == HolderOf(spec) && !rec.LockedTill.IsZero() {
		if !ok || rec.LockedTill.After(till) {
			till = rec.LockedTill
		}
		ok = true
	}
	return till, ok
}

func HolderOf(spec *coordinationv1.LeaseSpec) string {
	if spec == nil || spec.HolderIdentity == nil {
		return ""
	}
	return *spec.HolderIdentity
}

// Waiter is one client queued for a lock, in arrival order.
type Waiter struct {
	Session    string    `json:"session"`
	Who        string    `json:"who,omitempty"`
	Operation  Operation `json:"operation,omitempty"`
	EnqueuedAt time.Time `json:"enqueuedAt"`
	// HeartbeatAt is the waiter's last refresh; ExpiresAt = HeartbeatAt +
	// the waiter's lease duration, after which (plus the margin, judged in
	// server time) the entry is dead and skipped.
	// HeartbeatAt is unknown (zero) for an entry on a release record's
	// beat written by a version that kept only ExpiresAt.
	HeartbeatAt time.Time `json:"heartbeatAt,omitzero"`
	ExpiresAt   time.Time `json:"expiresAt"`
	// Preempt marks a waiter that asked the holder to stop (cooperative
	// preemption, --preempt): a holder that can stop safely does, as on a
	// first SIGINT, and gives the lock back to the queue; nothing is ever
	// taken from a holder that does not (see part.WatchAsks).
	// PreemptHolder is the session of the holder it asks: the one it saw
	// when it last wrote its entry. A waiter that is still alive asks each
	// new holder in turn (enqueue); the entry of one that died asks only
	// the holder it saw, so that no later holder stops for it.
	Preempt       bool   `json:"preempt,omitempty"`
	PreemptHolder string `json:"preemptHolder,omitempty"`
}

// queue is the JSON stored in AnnotationQueue.
type queue struct {
	Schema  int      `json:"schema"`
	Waiters []Waiter `json:"waiters"`
}

// DecodeQueue reads the waiters. An unreadable queue is treated as empty: the
// queue orders waiters, it does not provide mutual exclusion, so losing it
// costs fairness once and never safety.
func DecodeQueue(s string) []Waiter {
	if s == "" {
		return nil
	}
	var q queue
	if err := json.Unmarshal([]byte(s), &q); err != nil {
		return nil
	}
	return q.Waiters
}

func EncodeQueue(ws []Waiter) (string, error) {
	b, err := json.Marshal(queue{Schema: SchemaVersion, Waiters: ws})
	if err != nil {
		return "", fmt.Errorf("encode lock queue: %w", err)
	}
	return string(b), nil
}

// liveWaiters drops the entries whose heartbeat has certainly expired.
func liveWaiters(ws []Waiter, now servertime.Bounds, margin time.Duration) []Waiter {
	return slices.DeleteFunc(slices.Clone(ws), func(w Waiter) bool {
		return !now.IsZero() && now.Earliest.After(w.ExpiresAt.Add(margin))
	})
}

// waiterStopped judges a queue entry by this process's own elapsed time,
// as Confirm judges a holder: a waiter refreshes its entry well within its
// lease, so an entry whose lease is known (HeartbeatAt set) and that has
// been seen unchanged for that lease and the margin has no waiter left,
// whatever the Date headers say. An entry of unknown lease is judged by
// server time alone (liveWaiters).
func waiterStopped(w Waiter, seenFor, margin time.Duration) bool {
	return leaseKnown(w) && seenFor >= w.ExpiresAt.Sub(w.HeartbeatAt)+margin
}

// leaseKnown tells whether a queue entry says its waiter's lease: its
// heartbeat time and its expiry after it.
func leaseKnown(w Waiter) bool {
	return !w.HeartbeatAt.IsZero() && w.ExpiresAt.After(w.HeartbeatAt)
}

// waitersAhead counts the live waiters that come before session: all of them
// when session is not queued. A Free or Expired lock may be taken only when
// this is zero.
func waitersAhead(live []Waiter, session string) int {
	if i := slices.IndexFunc(live, func(w Waiter) bool { return w.Session == session }); i >= 0 {
		return i
	}
	return len(live)
}

// Sighting is what a process knows of a held lock besides server time:
// how long it has seen the holder's latest renewal unchanged on its own
// monotonic clock (a holder stamps every write with a later renewal time).
type Sighting struct {
	// SeenFor is how long the latest renewal has been seen unchanged.
	SeenFor time.Duration
	// Lease is the holder's lease duration.
	Lease time.Duration
	// Bounded is set when the lock's LOCKED TILL is no later than its
	// renewal plus Lease: its holder stops writing a lease after it sent
	// that renewal. A gate judged by the long bound it was written with
	// for clients of earlier versions (see gateForm) is not bounded.
	Bounded bool
	// Uncertain is how much earlier in server time than its stamped
	// renewedAt the holder may have sent its latest renewal (renewedAt
	// less the record's renewedAfter; zero when the record does not say).
	// Confirm counts it up to uncertaintyCounted (liveUncertainty).
	Uncertain time.Duration
}

// Confirm judges a held lock again by this process's own elapsed time, the
// way client-go's leader election judges every lock, and returns the state
// and how long until that judgement changes unless the lock does.
//
// Server time is read from the API server's Date headers; a replica with a
// wrong clock, or a proxy's own error page, shifts it by seconds or
// minutes, and a lock judged by it alone was taken over while its holder
// still renewed (docs/reliability.md, dateshift). A holder stops writing a
// lease (less RenewMargin) after it sent its last successful renewal, on
// its own clock, so a lock whose latest renewal this process has seen
// unchanged for a lease and the margin has no writer left, whatever the
// Date headers say; and one seen for less may still have one. Hence:
//
//   - Expired in server time, seen unchanged for Lease + margin: Expired.
//   - Expired in server time, seen for less: Live, until it has been seen
//     that long (a holder that renews meanwhile starts it anew).
//   - Live in server time, Bounded, seen unchanged for Lease + margin +
//     Uncertain: Expired (a server clock running behind does not keep a
//     dead holder's lock for the difference). The renewal was sent when
//     the server's clock read at least renewedAt less Uncertain, and seen
//     after that, so this is never before LOCKED TILL plus the margin in
//     the server's clock: the holder, should its own clocks have stood
//     still, is stopped by the first Date header it reads
//     (ServerPassedLockedTill). Counting Lease alone, a take came up to a
//     second before it, and a frozen holder whose stamp was a second wide
//     wrote after it (test/e2e TestFrozenClocksHolderStopsAfterTakeover).
//   - Live and not Bounded, or Free: as judged.
//
// A client that did not watch a holder die waits one lease before it takes
// the lock over; one that did (a waiter) waits nothing extra.
func Confirm(st State, s Sighting, margin time.Duration) (State, time.Duration) {
	need := s.Lease + margin
	seenFor := max(s.SeenFor, 0)
	switch {
	case st == Free || (st == Live && !s.Bounded):
		return st, 0
	case st == Live:
		need += liveUncertainty(s)
	}
	if seenFor >= need {
		return Expired, 0
	}
	return Live, need - seenFor
}

// uncertaintyCounted is the most of a stamp's uncertainty Confirm counts
// for a lock live in server time: a Date header's resolution, the width of
// a fresh process's estimate. A holder whose stamp was more uncertain
// stops by its renewedAfter instead (StopTill), so that a take never waits
// more than a lease and this much for a dead holder's lock (the
// simulation, counting up to a lease: a holder whose first answer came
// 22 s late stamped 23 s of uncertainty, and its lock waited two leases).
const uncertaintyCounted = servertime.DateResolution

// liveUncertainty is what Confirm adds for a lock live in server time:
// the uncertainty of its stamp, at most uncertaintyCounted and the lease.
func liveUncertainty(s Sighting) time.Duration {
	return min(max(s.Uncertain, 0), uncertaintyCounted, s.Lease)
}

// StopTill is the LOCKED TILL by which the holder of rec stops writing in
// the API server's clock (ServerPassedLockedTill), whatever its own clocks
// say: its LOCKED TILL, or sooner when its stamp was more uncertain than a
// taker counts (uncertaintyCounted). A taker on its own clock takes the
// lock no earlier than renewedAfter + lease + the takeover margin + the
// uncertainty it counts in the server's clock; one Date header read after
// that, a second behind at most, must already stop the holder, which stops
// renew before the returned time. The takeover margin is left out of the
// bound, as LOCKED TILL leaves it below a take: it covers a taker's clock
// running faster than the server's (NTP slews up to 500 ppm), which counts
// the lease a little short. Counted in, it left a stamp more than 1.25 s
// wide no margin at all (review of 58c4010,
// TestOwnClockTakeStopsAFrozenHolderWhateverTheTakersRate).
func StopTill(rec *Record, renew time.Duration) time.Time {
	till := rec.LockedTill
	if till.IsZero() || rec.RenewedAfter.IsZero() {
		return till
	}
	bound := rec.RenewedAfter.Add(rec.LeaseDuration.Duration + min(uncertainty(rec, rec.Session), uncertaintyCounted) - servertime.DateResolution + renew)
	if bound.Before(till) {
		return bound
	}
	return till
}

// stampedAhead reports whether a lock held till lockedTill, live in server
// time and bounded (s), has a LOCKED TILL further ahead of now's upper
// bound than its holder could have stamped if its Date headers agreed with
// this process's: it stamped at most its lease, its stamp's uncertainty
// and a millisecond after the server's clock when it sent the renewal,
// which is no later than this process first saw it (s.SeenFor ago, when
// the upper bound was at most now's less that). Such a lock is judged by
// this process's own clock alone (Confirm), whatever server time says.
// Judged from the first sight, it stays so until it changes: judged from
// now, a lock stamped less than a confirmation further ahead stopped
// being so while its confirmation was awaited, and a client that does
// not wait was refused with no renewal seen (review of 0eec072,
// TestNoWaitTakerStampedAheadByLittleIsNotRefusedUnrenewed).
func stampedAhead(lockedTill time.Time, now servertime.Bounds, s Sighting, margin time.Duration) bool {
	if !s.Bounded || now.IsZero() || lockedTill.IsZero() {
		return false
	}
	return lockedTill.After(now.Latest.Add(s.Lease + max(s.Uncertain, 0) + margin - max(s.SeenFor, 0)))
}

// uncertainty is how much earlier than its renewedAt the holder named
// holder may have sent the renewal of rec (Sighting.Uncertain): zero when
// rec is not that holder's or does not say.
func uncertainty(rec *Record, holder string) time.Duration {
	if rec == nil || rec.Session != holder || rec.RenewedAfter.IsZero() {
		return 0
	}
	return max(rec.RenewedAt.Sub(rec.RenewedAfter), 0)
}

// leaseOf is the lease the holder named in spec renews its lock for: the
// longer of its record's and the spec's (DefaultLeaseDuration when neither
// says).
func leaseOf(rec *Record, spec *coordinationv1.LeaseSpec) time.Duration {
	var d time.Duration
	if spec != nil && spec.LeaseDurationSeconds != nil {
		d = time.Duration(*spec.LeaseDurationSeconds) * time.Second
	}
	if rec != nil && rec.Session == HolderOf(spec) {
		d = max(d, rec.LeaseDuration.Duration)
	}
	if d <= 0 {
		return DefaultLeaseDuration
	}
	return d
}

// ApplyHolder mirrors rec in spec: its holder, and while it holds, its
// lease, take and renewal.
func ApplyHolder(spec *coordinationv1.LeaseSpec, rec *Record) {
	if !rec.ReleasedAt.IsZero() {
		spec.HolderIdentity = ptr("")
		return
	}
	spec.HolderIdentity = ptr(rec.Session)
	spec.LeaseDurationSeconds = leaseSeconds(rec.LeaseDuration.Duration)
	spec.AcquireTime = &metav1.MicroTime{Time: rec.AcquiredAt}
	spec.RenewTime = &metav1.MicroTime{Time: rec.RenewedAt}
}

// leaseSeconds is lease d as a Lease spec says it, in whole seconds rounded
// up: a reader of the spec alone never takes the lock before the holder's
// renewedAt + d.
func leaseSeconds(d time.Duration) *int32 {
	return ptr(int32(min(math.MaxInt32, math.Ceil(d.Seconds()))))
}

// SpecOf derives the Lease spec from a stored lock record (a release
// store's gate, which has no spec of its own). Session, renewedAt,
// leaseDuration and releasedAt keep their meaning in every schema (they play
// the part of the Lease spec), so a record of a newer schema is still judged
// by them; a record that is not JSON at all names an unreadable holder with
// no expiry, which is judged Live.
func SpecOf(s string) coordinationv1.LeaseSpec {
	if s == "" {
		return coordinationv1.LeaseSpec{}
	}
	rec, _ := DecodeRecord(s) // a newer schema's record is still judged; see above
	if rec == nil {
		return coordinationv1.LeaseSpec{HolderIdentity: ptr(UnreadableHolder)}
	}
	if !rec.ReleasedAt.IsZero() || rec.Session == "" {
		return coordinationv1.LeaseSpec{HolderIdentity: ptr("")}
	}
	spec := coordinationv1.LeaseSpec{HolderIdentity: ptr(rec.Session)}
	if d := rec.LeaseDuration.Duration; d > 0 && !rec.RenewedAt.IsZero() {
		spec.LeaseDurationSeconds = leaseSeconds(d)
		spec.RenewTime = &metav1.MicroTime{Time: rec.RenewedAt}
	}
	if !rec.AcquiredAt.IsZero() {
		spec.AcquireTime = &metav1.MicroTime{Time: rec.AcquiredAt}
	}
	return spec
}
