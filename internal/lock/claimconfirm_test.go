package lock

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// TestClaimIsConfirmedOnOwnClock: a claim in flight is judged as a holder
// is (Confirm). Found by the simulation (seed 36): a client reading a Date
// header 30 s ahead judged another's fresh claim expired, claimed the beat
// over it, lost the gate, and its stale claim then held the dead gate
// holder's lock for the long bound. A claim expired in server time is
// Live until this process has seen it unchanged for its lease and the
// margin; a bounded claim live in server time (a Date header behind) is
// Expired once seen that long.
func TestClaimIsConfirmedOnOwnClock(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	lease := 15 * time.Second
	released := Record{Schema: SchemaVersion, Session: "A", Release: "web", Namespace: "shop", LeaseDuration: metav1.Duration{Duration: lease}, RenewedAt: t0, LockedTill: t0.Add(lease), ReleasedAt: t0.Add(time.Second)}
	gateEnc, _ := released.Encode()
	claim := Record{Session: "B", Operation: OpUpgrade, LeaseDuration: metav1.Duration{Duration: lease}, AcquiredAt: t0, RenewedAt: t0.Add(2 * time.Second), LockedTill: t0.Add(2*time.Second + lease)}
	beatEnc, _ := encodeBeat(claim)
	r := records.Record{Kind: records.KindSecret, Meta: metav1.ObjectMeta{Name: "sh.helm.release.v1.web.v3", Namespace: "shop", ResourceVersion: "5", Annotations: map[string]string{AnnotationRecord: gateEnc}}}
	l := Stores.ReleaseSnapshot("shop", "web", r, &metav1.ObjectMeta{Name: LeaseName("web"), Namespace: "shop", ResourceVersion: "7", Annotations: map[string]string{Stores.AnnotationBeat: beatEnc, Stores.AnnotationClaimedFrom: "A"}}, "9")
	at := func(d time.Duration) servertime.Bounds {
		return servertime.Bounds{Earliest: t0.Add(d), Latest: t0.Add(d + 100*time.Millisecond)}
	}
	need := lease + TakeoverMargin
	for _, tc := range []struct {
		name       string
		now        servertime.Bounds // server time, as this client's Date headers have it
		after      time.Duration     // how long this client has seen the claim unchanged
		want       State
		confirming bool
	}{
		{"fresh, first seen", at(5 * time.Second), 0, Live, false},
		{"expired in server time, first seen", at(40 * time.Second), 0, Live, true},
		{"expired in server time, seen for less than a lease", at(40 * time.Second), need - time.Millisecond, Live, true},
		{"expired in server time, seen for a lease and the margin", at(40 * time.Second), need, Free, false},
		{"live in server time (Date behind), seen for a lease and the margin", at(-10 * time.Minute), need, Free, false},
		{"live in server time (Date behind), seen for less", at(-10 * time.Minute), need - time.Millisecond, Live, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			b := &Backend{Margin: TakeoverMargin, clock: clk, Sightings: NewSightings()}
			b.decode(l, tc.now, "C")
			clk.Step(tc.after)
			v := b.decode(l, tc.now, "C")
			if v.state != tc.want || v.confirming != tc.confirming {
				t.Fatalf("state %s confirming %v, want %s %v", v.state, v.confirming, tc.want, tc.confirming)
			}
			if tc.want == Live && (v.claim == nil || v.claim.Session != "B") {
				t.Errorf("claim %v, want B's", v.claim)
			}
			if tc.confirming && !v.confirmAt.Equal(t0.Add(need)) {
				t.Errorf("confirmAt %v, want %v", v.confirmAt, t0.Add(need))
			}
		})
	}
}

// TestStoppedWaitersAreSkipped: a queue entry whose waiter stopped
// refreshing it is skipped once this process has seen it unchanged for the
// waiter's lease and the margin, even while its expiry, written through a
// Date header running ahead, is in the future. Found by the simulation
// (seed 26): a waiter 30 s ahead crashed, and every later client waited
// those 30 s behind it. An entry of unknown lease (an earlier version's)
// and our own entry are kept; a refresh starts the count anew.
func TestStoppedWaitersAreSkipped(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	lease := 15 * time.Second
	need := lease + TakeoverMargin
	ahead := t0.Add(10 * time.Minute)
	dead := Waiter{Session: "dead", EnqueuedAt: ahead, HeartbeatAt: ahead, ExpiresAt: ahead.Add(lease)}
	old := Waiter{Session: "old", EnqueuedAt: ahead, ExpiresAt: ahead.Add(lease)}
	me := Waiter{Session: "me", EnqueuedAt: ahead, HeartbeatAt: ahead, ExpiresAt: ahead.Add(lease)}
	queueOf := func(ws ...Waiter) *Snapshot {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName("web"), Namespace: "shop", Annotations: map[string]string{}}}
		if err := setQueue(l, ws); err != nil {
			t.Fatal(err)
		}
		return leaseSnapshot(l)
	}
	sessions := func(ws []Waiter) []string {
		var out []string
		for _, w := range ws {
			out = append(out, w.Session)
		}
		return out
	}
	clk := clocktesting.NewFakeClock(t0)
	b := &Backend{Margin: TakeoverMargin, clock: clk, Sightings: NewSightings()}
	now := servertime.Bounds{Earliest: t0, Latest: t0.Add(100 * time.Millisecond)}
	l := queueOf(dead, old, me)
	if got := sessions(b.decode(l, now, "me").live); len(got) != 3 {
		t.Fatalf("first sight: live %v, want all three", got)
	}
	clk.Step(need - time.Millisecond)
	if got := sessions(b.decode(l, now, "me").live); len(got) != 3 {
		t.Fatalf("seen for less than a lease: live %v, want all three", got)
	}
	clk.Step(time.Millisecond)
	if got := sessions(b.decode(l, now, "me").live); len(got) != 2 || got[0] != "old" || got[1] != "me" {
		t.Fatalf("seen for a lease and the margin: live %v, want [old me]", got)
	}
	refreshed := dead
	refreshed.HeartbeatAt, refreshed.ExpiresAt = ahead.Add(time.Second), ahead.Add(time.Second+lease)
	if got := sessions(b.decode(queueOf(refreshed, old, me), now, "me").live); len(got) != 3 {
		t.Fatalf("after a refresh: live %v, want all three", got)
	}
}

// TestWaiterStopped is the table of waiterStopped.
func TestWaiterStopped(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		w       Waiter
		seenFor time.Duration
		want    bool
	}{
		{"lease known, seen for less", Waiter{HeartbeatAt: t0, ExpiresAt: t0.Add(10 * time.Second)}, 10 * time.Second, false},
		{"lease known, seen for lease and margin", Waiter{HeartbeatAt: t0, ExpiresAt: t0.Add(10 * time.Second)}, 10*time.Second + TakeoverMargin, true},
		{"lease unknown", Waiter{ExpiresAt: t0.Add(10 * time.Second)}, time.Hour, false},
		{"expiry not after heartbeat", Waiter{HeartbeatAt: t0, ExpiresAt: t0}, time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := waiterStopped(tc.w, tc.seenFor, TakeoverMargin); got != tc.want {
				t.Fatalf("waiterStopped = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestSilentBeatBoundsTheGate: a gate whose beat says nothing of its holder
// (missing, or the beat another session left without claiming it from the
// holder, as the loser of a first install's race does) is Live in server
// time for its long bound, but Expired once this process has seen it
// unchanged for the holder's lease and the margin: a live holder writes
// its beat back at its next renewal. Found by the simulation (seed 439).
func TestSilentBeatBoundsTheGate(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	lease := 15 * time.Second
	holder := Record{Schema: SchemaVersion, Session: "A", Release: "web", Namespace: "shop", Operation: OpInstall, LeaseDuration: metav1.Duration{Duration: lease}, AcquiredAt: t0, RenewedAt: t0, LockedTill: t0.Add(lease)}
	r := firstInstallGate(t, holder)
	loser := Record{Session: "B", Operation: OpInstall, LeaseDuration: metav1.Duration{Duration: 5 * time.Second}, AcquiredAt: t0, RenewedAt: t0.Add(time.Second), LockedTill: t0.Add(6 * time.Second)}
	now := servertime.Bounds{Earliest: t0.Add(20 * time.Second), Latest: t0.Add(20*time.Second + 100*time.Millisecond)}
	need := lease + TakeoverMargin
	for _, tc := range []struct {
		name  string
		beat  *metav1.ObjectMeta
		after time.Duration
		want  State
	}{
		{"beat left by the loser, first seen", beatOf(t, "7", loser, "B"), 0, Live},
		{"beat left by the loser, seen for less than a lease", beatOf(t, "7", loser, "B"), need - time.Millisecond, Live},
		{"beat left by the loser, seen for a lease and the margin", beatOf(t, "7", loser, "B"), need, Free},
		{"no beat, seen for a lease and the margin", nil, need, Free},
		{"the holder's own beat, expired in server time, seen for a lease", beatOf(t, "7", holder, "A"), need, Free},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := Stores.ReleaseSnapshot("shop", "web", r, tc.beat, "9")
			clk := clocktesting.NewFakeClock(t0)
			b := &Backend{Margin: TakeoverMargin, clock: clk, Sightings: NewSightings()}
			b.decode(l, now, "C")
			clk.Step(tc.after)
			// Expired on this clock is Free for a taker: the gate's holder
			// named no revision (nothing recorded to recover).
			if v := b.decode(l, now, "C"); (v.state == Live) != (tc.want == Live) {
				t.Fatalf("state %s, want %s (or expired)", v.state, tc.want)
			}
		})
	}
}

// TestSilentGatePastItsLeaseIsConfirmed: a silent gate (a first install's
// holder that never wrote its beat) whose own renewedAt + lease has passed
// in server time is expired there too, waiting to be confirmed on this
// process's clock: a client that does not wait then waits for that
// confirmation rather than be refused for the gate's long bound (the
// simulation, seed 170). Before that, it is live, and not confirming: a
// live holder is still within its first lease.
func TestSilentGatePastItsLeaseIsConfirmed(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	lease := 15 * time.Second
	holder := Record{Schema: SchemaVersion, Session: "A", Release: "web", Namespace: "shop", Operation: OpInstall, LeaseDuration: metav1.Duration{Duration: lease}, AcquiredAt: t0, RenewedAt: t0, LockedTill: t0.Add(lease)}
	l := Stores.ReleaseSnapshot("shop", "web", firstInstallGate(t, holder), nil, "9")
	for _, tc := range []struct {
		name       string
		at         time.Duration // server time after t0
		confirming bool
	}{
		{"within the holder's lease", 10 * time.Second, false},
		{"past the holder's lease and the margin", 20 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			b := &Backend{Margin: TakeoverMargin, clock: clk, Sightings: NewSightings()}
			now := servertime.Bounds{Earliest: t0.Add(tc.at), Latest: t0.Add(tc.at + 100*time.Millisecond)}
			v := b.decode(l, now, "C")
			if v.state != Live || v.confirming != tc.confirming {
				t.Fatalf("state %s confirming %v, want live, confirming %v", v.state, v.confirming, tc.confirming)
			}
			if !tc.confirming {
				return
			}
			clk.Step(lease + TakeoverMargin)
			if v := b.decode(l, now, "C"); v.state == Live {
				t.Fatalf("state %s after a lease and the margin, want expired", v.state)
			}
		})
	}
}

// TestClaimConfirmedBesideItsGate: a dead gate holder (15 s lease) and a
// dead claimant taking it over (60 s lease), both expired in server time,
// are confirmed together from the first read: the claim's confirmation
// runs while the gate's does, and the lock is free once both are. The time
// the judgement changes is the later one from the first read on, so a take
// waiting for it (confirmTake) does not take the claim's time for a renewal
// of the holder (found by review).
func TestClaimConfirmedBesideItsGate(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	holder := Record{Schema: SchemaVersion, Session: "G", Release: "web", Namespace: "shop", Operation: OpUpgrade, Revision: 3, LeaseDuration: metav1.Duration{Duration: 15 * time.Second}, AcquiredAt: t0.Add(-time.Minute), RenewedAt: t0.Add(-time.Minute), LockedTill: t0.Add(-45 * time.Second)}
	gate := gateForm(holder)
	gateEnc, _ := gate.Encode()
	r := records.Record{Kind: records.KindSecret, Meta: metav1.ObjectMeta{Name: "sh.helm.release.v1.web.v3", Namespace: "shop", ResourceVersion: "5", Annotations: map[string]string{AnnotationRecord: gateEnc}}}
	claim := Record{Session: "C", Operation: OpUpgrade, LeaseDuration: metav1.Duration{Duration: time.Minute}, AcquiredAt: t0.Add(-2 * time.Minute), RenewedAt: t0.Add(-2 * time.Minute), LockedTill: t0.Add(-time.Minute)}
	claimEnc, _ := encodeBeat(claim)
	l := Stores.ReleaseSnapshot("shop", "web", r, &metav1.ObjectMeta{Name: LeaseName("web"), Namespace: "shop", ResourceVersion: "7", Annotations: map[string]string{
		Stores.AnnotationBeat: claimEnc, Stores.AnnotationClaimedFrom: "G", Stores.AnnotationClaimedOn: ClaimedOn("C", r.Meta.Name, "5"),
	}}, "9")
	now := servertime.Bounds{Earliest: t0, Latest: t0.Add(100 * time.Millisecond)}
	clk := clocktesting.NewFakeClock(t0)
	b := &Backend{Margin: TakeoverMargin, clock: clk, Sightings: NewSightings()}
	both := t0.Add(time.Minute + TakeoverMargin)

	v := b.decode(l, now, "T")
	if v.state != Live || !v.confirming || !v.confirmAt.Equal(both) {
		t.Fatalf("first read: state %s confirming %v confirmAt %v; want live, confirming until %v", v.state, v.confirming, v.confirmAt, both)
	}
	clk.Step(15*time.Second + TakeoverMargin) // the gate's holder is confirmed
	v = b.decode(l, now, "T")
	if v.state != Live || v.claim == nil || v.claim.Session != "C" || !v.confirming || !v.confirmAt.Equal(both) {
		t.Fatalf("holder confirmed: state %s claim %v confirming %v confirmAt %v; want C's claim confirming until %v", v.state, v.claim, v.confirming, v.confirmAt, both)
	}
	clk.Step(both.Sub(clk.Now()))
	if v = b.decode(l, now, "T"); v.state == Live {
		t.Fatalf("both confirmed a minute after the first read: state %s (claim %v)", v.state, v.claim)
	}
}

// TestForceReleaseHandsOnNotStopped: a person's release of a live holder
// hands its record on not Stopped, so recovery waits out its LOCKED TILL;
// a holder released while it was recovering what an earlier holder
// abandoned (revision 0, Abandoned set) hands that earlier holder on, with
// the later of the two LOCKED TILLs (found by review: handing on the
// recovering holder alone lost the earlier one).
func TestForceReleaseHandsOnNotStopped(t *testing.T) {
	till := t0.Add(10 * time.Second)
	withTill := func(r Record, lockedTill time.Time, stopped bool) *Record {
		r.LockedTill, r.Stopped = lockedTill, stopped
		return &r
	}
	earlier := Record{Schema: SchemaVersion, Session: "H", Release: "web", Namespace: ns, Operation: OpUpgrade, Revision: 7, LeaseDuration: metav1.Duration{Duration: 15 * time.Second}, RenewedAt: t0.Add(-time.Minute), LockedTill: t0.Add(-45 * time.Second), Stopped: true}
	for _, tc := range []struct {
		name      string
		holder    Record
		wantSess  string
		wantTill  time.Time
		wantRevOf int
	}{
		{"a holder writing its revision", Record{Schema: SchemaVersion, Session: "C", Release: "web", Namespace: ns, Operation: OpUpgrade, Revision: 8, LeaseDuration: metav1.Duration{Duration: 15 * time.Second}, RenewedAt: t0.Add(-5 * time.Second), LockedTill: till}, "C", till, 8},
		{"a holder recovering an earlier one", Record{Schema: SchemaVersion, Session: "C", Release: "web", Namespace: ns, Operation: OpUpgrade, LeaseDuration: metav1.Duration{Duration: 15 * time.Second}, RenewedAt: t0.Add(-5 * time.Second), LockedTill: till, Abandoned: &earlier}, "H", till, 7},
		// A stopped earlier holder's LOCKED TILL (here a silent gate's
		// 24 h bound) is not waited for: only the recovering one may
		// still write.
		{"a holder recovering a stopped one with a long bound", Record{Schema: SchemaVersion, Session: "C", Release: "web", Namespace: ns, Operation: OpUpgrade, LeaseDuration: metav1.Duration{Duration: 15 * time.Second}, RenewedAt: t0.Add(-5 * time.Second), LockedTill: till, Abandoned: withTill(earlier, t0.Add(24*time.Hour), true)}, "H", till, 7},
		// One not known to have stopped is waited for as long as it may
		// write.
		{"a holder recovering one a person released", Record{Schema: SchemaVersion, Session: "C", Release: "web", Namespace: ns, Operation: OpUpgrade, LeaseDuration: metav1.Duration{Duration: 15 * time.Second}, RenewedAt: t0.Add(-5 * time.Second), LockedTill: till, Abandoned: withTill(earlier, t0.Add(time.Hour), false)}, "H", t0.Add(time.Hour), 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			c := w.backend(0)
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName("web"), Namespace: ns, Labels: LockLabels("web")}}
			if err := setHolder(l, &tc.holder); err != nil {
				t.Fatal(err)
			}
			if _, err := c.b.client.CoordinationV1().Leases(ns).Create(context.Background(), l, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			rec, err := c.b.ForceRelease(context.Background(), ns, "web", "C", "bob@laptop")
			if err != nil {
				t.Fatal(err)
			}
			a := rec.Abandoned
			if a == nil || a.Session != tc.wantSess || a.Stopped || !a.LockedTill.Equal(tc.wantTill) || a.Revision != tc.wantRevOf || a.Abandoned != nil {
				t.Fatalf("abandoned %+v; want %s's revision %d, not stopped, LOCKED TILL %v", a, tc.wantSess, tc.wantRevOf, tc.wantTill)
			}
			if p, st := Found(rec, Free); st != Expired || p.Session != tc.wantSess || p.Stopped {
				t.Fatalf("found %+v %s; want %s, not stopped", p, st, tc.wantSess)
			}
		})
	}
}

// TestSilentBeatCountsEveryBeatWrite: a reader that does not watch sees the
// gate silent (another session's beat) at its first read, misses the
// holder's renewal on its own beat, and then sees a third session's beat
// over it: the view differs only by the beat. Every beat write starts the
// count anew, so the holder's lock is not judged expired before the
// holder's renew deadline (found by review: counted by holder, renewal and
// LOCKED TILL alone, it was judged expired 3.75 s early).
func TestSilentBeatCountsEveryBeatWrite(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	lease := 15 * time.Second
	w := Record{Schema: SchemaVersion, Session: "W", Release: "web", Namespace: "shop", Operation: OpInstall, LeaseDuration: metav1.Duration{Duration: lease}, AcquiredAt: t0, RenewedAt: t0, LockedTill: t0.Add(lease)}
	r := firstInstallGate(t, w)
	l1 := Record{Session: "L1", LeaseDuration: metav1.Duration{Duration: lease}, RenewedAt: t0, LockedTill: t0.Add(lease)}
	l2 := Record{Session: "L2", LeaseDuration: metav1.Duration{Duration: lease}, RenewedAt: t0.Add(time.Second), LockedTill: t0.Add(time.Second + lease)}
	clk := clocktesting.NewFakeClock(t0)
	b := &Backend{Margin: TakeoverMargin, clock: clk, Sightings: NewSightings()}
	now := func() servertime.Bounds {
		n := clk.Now()
		return servertime.Bounds{Earliest: n, Latest: n.Add(100 * time.Millisecond)}
	}
	if v := b.decode(Stores.ReleaseSnapshot("shop", "web", r, beatOf(t, "7", l1, "L1"), "9"), now(), "R"); v.state != Live {
		t.Fatalf("first read: %s", v.state)
	}
	// W renews on its own beat (rv 8), then L2 writes its beat (rv 10):
	// neither is read here.
	clk.Step(lease + TakeoverMargin)
	if v := b.decode(Stores.ReleaseSnapshot("shop", "web", r, beatOf(t, "10", l2, "L2"), "9"), now(), "R"); v.state != Live {
		t.Fatalf("a lease after the first read, the beat written since: %s; want live (W may write until %v)", v.state, 5*time.Second+lease-RenewMargin)
	}
	// The reader's own queue refreshes rewrite the beat (rv 11, 12) and
	// change nothing of its heartbeat: they do not restart the count (the
	// simulation, seed 414, found a waiter that never took a dead holder's
	// release over, its own refreshes restarting its count).
	clk.Step(lease / 2)
	if v := b.decode(Stores.ReleaseSnapshot("shop", "web", r, beatOf(t, "11", l2, "L2"), "9"), now(), "R"); v.state != Live {
		t.Fatalf("half a lease later: %s; want live", v.state)
	}
	clk.Step(lease/2 + TakeoverMargin)
	if v := b.decode(Stores.ReleaseSnapshot("shop", "web", r, beatOf(t, "12", l2, "L2"), "9"), now(), "R"); v.state == Live {
		t.Fatalf("the same heartbeat seen for a lease and the margin, the queue rewritten: %s; want expired", v.state)
	}
}

// firstInstallGate is the first revision of release web in shop, its gate
// holding rec (gateForm, as the fence writes it).
func firstInstallGate(t *testing.T, rec Record) records.Record {
	t.Helper()
	gate := gateForm(rec)
	enc, err := gate.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return records.Record{Kind: records.KindSecret, Meta: metav1.ObjectMeta{Name: "sh.helm.release.v1.web.v1", Namespace: "shop", ResourceVersion: "5", Annotations: map[string]string{AnnotationRecord: enc}}}
}

// beatOf is web's beat at resourceVersion rv with rec's heartbeat, claimed
// from session from.
func beatOf(t *testing.T, rv string, rec Record, from string) *metav1.ObjectMeta {
	t.Helper()
	enc, err := encodeBeat(rec)
	if err != nil {
		t.Fatal(err)
	}
	return &metav1.ObjectMeta{Name: LeaseName("web"), Namespace: "shop", ResourceVersion: rv, Annotations: map[string]string{Stores.AnnotationBeat: enc, Stores.AnnotationClaimedFrom: from}}
}
