package lock

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// TestConfirmAtStaysPutWithoutARenewal: while a lock is being confirmed
// (Expired in server time, not yet seen unchanged for a lease), the time
// its judgement changes (confirmAt) moves later only when the lock does:
// confirmTake takes a later confirmAt for a renewal and refuses the lock
// as renewing. Here the gate's holder is expired in server time and a
// claim in flight on the beat, live in server time and stamped a second
// wide, holds the lock a little longer; nothing changes between two reads
// but the reader's own estimate of server time, whose lower bound grows
// at 1 - 1/5000 of its local clock (servertime's drift allowance).
func TestConfirmAtStaysPutWithoutARenewal(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	lease := 15 * time.Second
	holder := Record{Schema: SchemaVersion, Session: "G", Release: "web", Namespace: "shop", Operation: OpUpgrade, Revision: 3, LeaseDuration: metav1.Duration{Duration: lease}, AcquiredAt: t0.Add(-time.Minute), RenewedAt: t0.Add(-time.Minute), LockedTill: t0.Add(-45 * time.Second)}
	gate := gateForm(holder)
	gateEnc, _ := gate.Encode()
	r := records.Record{Kind: records.KindSecret, Meta: metav1.ObjectMeta{Name: "sh.helm.release.v1.web.v3", Namespace: "shop", ResourceVersion: "5", Annotations: map[string]string{AnnotationRecord: gateEnc}}}
	// The claim was sent with its writer's estimate a second wide.
	claim := Record{Session: "C", Operation: OpUpgrade, LeaseDuration: metav1.Duration{Duration: lease}}
	stamp(&claim, servertime.Bounds{Earliest: t0, Latest: t0.Add(time.Second)})
	claim.AcquiredAt = claim.RenewedAt
	claimEnc, _ := encodeBeat(claim)
	l := Stores.ReleaseSnapshot("shop", "web", r, &metav1.ObjectMeta{Name: LeaseName("web"), Namespace: "shop", ResourceVersion: "7", Annotations: map[string]string{
		Stores.AnnotationBeat: claimEnc, Stores.AnnotationClaimedFrom: "G", Stores.AnnotationClaimedOn: ClaimedOn("C", r.Meta.Name, "5"),
	}}, "9")
	clk := clocktesting.NewFakeClock(t0)
	b := &Backend{Margin: TakeoverMargin, clock: clk, Sightings: NewSightings()}
	// The reader's estimate is narrower than the claimant's was.
	est := servertime.Bounds{Earliest: t0.Add(900 * time.Millisecond), Latest: t0.Add(time.Second)}
	first := b.decode(l, est, "T")
	if first.state != Live || !first.confirming {
		t.Fatalf("first read: state %s confirming %v; want live, confirming", first.state, first.confirming)
	}
	for _, step := range []time.Duration{time.Second, 5 * time.Second, 10 * time.Second} {
		clk.Step(step)
		est.Earliest = est.Earliest.Add(step - step/5000)
		est.Latest = est.Latest.Add(step + step/5000)
		v := b.decode(l, est, "T")
		if v.confirming && v.confirmAt.After(first.confirmAt) {
			t.Fatalf("%v later, the lock unchanged: confirmAt %v after the first read's %v (confirmTake takes that for a renewal)", clk.Now().Sub(t0), v.confirmAt.Sub(t0), first.confirmAt.Sub(t0))
		}
	}
}

// TestDecodeCountsTheStampsUncertainty: the readers of a lock (the Lease,
// a release record's gate with its beat merged in, a claim in flight on
// the beat) hand the uncertainty of the holder's latest stamp to Confirm:
// a bounded lock live in server time, seen unchanged for a lease and the
// margin, stays live until it has also been seen for renewedAt less
// renewedAfter. Without it the arithmetic of TestOwnClockTakeStopsAFrozenHolder
// holds for Confirm alone, not for the locks the tool reads.
func TestDecodeCountsTheStampsUncertainty(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	lease := 15 * time.Second
	wide := servertime.Bounds{Earliest: t0, Latest: t0.Add(time.Second)} // the holder's estimate when it sent its renewal
	holder := func(session string) Record {
		rec := Record{Schema: SchemaVersion, Session: session, Release: "web", Namespace: "shop", Operation: OpUpgrade, Revision: 3, LeaseDuration: metav1.Duration{Duration: lease}}
		stamp(&rec, servertime.Bounds{Earliest: t0.Add(-time.Minute), Latest: t0.Add(-time.Minute + 50*time.Millisecond)})
		rec.AcquiredAt = rec.RenewedAt
		return rec
	}
	gateSnap := func(gate Record, beat Record, claimedFrom string) *Snapshot {
		g := gateForm(gate)
		gateEnc, _ := g.Encode()
		r := records.Record{Kind: records.KindSecret, Meta: metav1.ObjectMeta{Name: "sh.helm.release.v1.web.v3", Namespace: "shop", ResourceVersion: "5", Annotations: map[string]string{AnnotationRecord: gateEnc}}}
		beatEnc, _ := encodeBeat(beat)
		ann := map[string]string{Stores.AnnotationBeat: beatEnc}
		if claimedFrom != "" {
			ann[Stores.AnnotationClaimedFrom] = claimedFrom
			ann[Stores.AnnotationClaimedOn] = ClaimedOn(beat.Session, r.Meta.Name, "5")
		}
		return Stores.ReleaseSnapshot("shop", "web", r, &metav1.ObjectMeta{Name: LeaseName("web"), Namespace: "shop", ResourceVersion: "7", Annotations: ann}, "9")
	}
	lease0 := holder("H")
	renewed := lease0
	stamp(&renewed, wide)
	released := lease0
	released.ReleasedAt = released.RenewedAt.Add(time.Second)
	claim := Record{Session: "C", Operation: OpUpgrade, Release: "web", Namespace: "shop", LeaseDuration: metav1.Duration{Duration: lease}}
	stamp(&claim, wide)
	claim.AcquiredAt = claim.RenewedAt
	for _, tc := range []struct {
		name string
		snap func() *Snapshot
	}{
		{"a Lease", func() *Snapshot {
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName("web"), Namespace: "shop", Annotations: map[string]string{}}}
			if err := setHolder(l, &renewed); err != nil {
				t.Fatal(err)
			}
			return leaseSnapshot(l)
		}},
		{"a gate renewed on its beat", func() *Snapshot { return gateSnap(lease0, renewed, "") }},
		{"a claim in flight on the beat", func() *Snapshot { return gateSnap(released, claim, "H") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := tc.snap()
			clk := clocktesting.NewFakeClock(t0)
			b := &Backend{Margin: TakeoverMargin, clock: clk, Sightings: NewSightings()}
			// Date headers ten minutes behind: live in server time.
			behind := servertime.Bounds{Earliest: t0.Add(-10 * time.Minute), Latest: t0.Add(-10*time.Minute + 100*time.Millisecond)}
			b.decode(l, behind, "T")
			clk.Step(lease + TakeoverMargin)
			if v := b.decode(l, behind, "T"); v.state != Live {
				t.Fatalf("seen for a lease and the margin, its stamp a second wide: %s, want live", v.state)
			}
			clk.Step(time.Second)
			if v := b.decode(l, behind, "T"); v.state == Live {
				t.Fatalf("seen for a lease, the margin and the stamp's second: %s, want taken", v.state)
			}
		})
	}
}
