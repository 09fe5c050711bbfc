package lock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// TestDecodeClaim: a claim in flight makes the lock Live for everybody but
// its claimant, until its own LOCKED TILL has certainly passed.
func TestDecodeClaim(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	rel := Record{Schema: SchemaVersion, Session: "A", Release: "web", Namespace: "shop", LeaseDuration: metav1.Duration{Duration: 15 * time.Second}, RenewedAt: t0, LockedTill: t0.Add(15 * time.Second), ReleasedAt: t0.Add(time.Second)}
	gateEnc, _ := rel.Encode()
	claim := Record{Session: "B", Operation: OpUpgrade, LeaseDuration: metav1.Duration{Duration: 15 * time.Second}, AcquiredAt: t0, RenewedAt: t0.Add(2 * time.Second), LockedTill: t0.Add(17 * time.Second)}
	beatEnc, _ := encodeBeat(claim)
	r := records.Record{Kind: records.KindSecret, Meta: metav1.ObjectMeta{Name: "sh.helm.release.v1.web.v3", Namespace: "shop", ResourceVersion: "5", Annotations: map[string]string{AnnotationRecord: gateEnc}}}
	l := Stores.ReleaseSnapshot("shop", "web", r, &metav1.ObjectMeta{Name: LeaseName("web"), Namespace: "shop", ResourceVersion: "7", Annotations: map[string]string{Stores.AnnotationBeat: beatEnc, Stores.AnnotationClaimedFrom: "A"}}, "9")
	b := &Backend{Margin: TakeoverMargin}
	at := func(d time.Duration) servertime.Bounds {
		return servertime.Bounds{Earliest: t0.Add(d), Latest: t0.Add(d + 100*time.Millisecond)}
	}
	for _, tc := range []struct {
		name string
		self string
		now  servertime.Bounds
		want State
	}{
		{"another client, claim fresh", "C", at(5 * time.Second), Live},
		{"another client, inside the margin", "C", at(17*time.Second + 200*time.Millisecond), Live},
		{"another client, claim expired", "C", at(18 * time.Second), Free},
		{"the claimant itself", "B", at(5 * time.Second), Free},
		{"a reader", "", at(5 * time.Second), Live},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := b.decode(l, tc.now, tc.self)
			if v.state != tc.want {
				t.Fatalf("state %s, want %s", v.state, tc.want)
			}
			if tc.want == Live && (v.claim == nil || v.claim.Session != "B") {
				t.Errorf("claim %v, want B's", v.claim)
			}
		})
	}
}

// TestWaitDoesNotSpinOnFailingWatch: a waiter whose watch keeps ending at
// once (a resourceVersion older than the API server's watch window answers
// 410 "too old") decides again within progressEvery, not at once: found by
// review, where the gate's resourceVersion aged out once renewals stopped
// rewriting the record, and a waiter opened 484 watches in 3 s.
func TestWaitDoesNotSpinOnFailingWatch(t *testing.T) {
	rec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
		Name: "sh.helm.release.v1.web.v1", Namespace: ns,
		Labels: map[string]string{"owner": "helm", "name": "web", "version": "1", "status": "deployed"},
	}, Data: map[string][]byte{"release": []byte("x")}}
	cs := fake.NewClientset(rec)
	var watches atomic.Int64
	cs.PrependWatchReactor("*", func(k8stesting.Action) (bool, watch.Interface, error) {
		watches.Add(1)
		w := watch.NewRaceFreeFake()
		w.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired})
		return true, w, nil
	})
	clk := clock.RealClock{}
	est := servertime.New(clk)
	now := clk.Now()
	est.Observe(now, now, now.Truncate(time.Second))
	b := fakeClocked(NewReleaseBackend(cs, est, clk, records.DriverSecret))
	ctx := context.Background()
	if _, _, err := b.TryAcquire(ctx, req(OpUpgrade, 15*time.Second)); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2500*time.Millisecond)
	defer cancel()
	if _, err := b.Wait(wctx, req(OpUpgrade, 15*time.Second), nil); !errors.Is(err, ErrLocked) {
		t.Fatalf("Wait = %v, want ErrLocked after giving up", err)
	}
	// Each decision opens two watches (the records and the beat); about
	// one decision a second.
	if n := watches.Load(); n > 10 {
		t.Errorf("the waiter opened %d watches in 2.5 s; want a few (one decision a second)", n)
	}
}

// TestStaleBeatIsNoClaim: the beat a holder leaves behind claims from the
// holder itself; once a client that takes no lock (stock helm) wrote a
// newer record without a gate, that beat is no claim against it, and the
// release is free (the e2e interop tests found it taken for one).
func TestStaleBeatIsNoClaim(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	left := Record{Session: "A", Operation: OpUpgrade, LeaseDuration: metav1.Duration{Duration: 15 * time.Second}, AcquiredAt: t0, RenewedAt: t0, LockedTill: t0.Add(15 * time.Second)}
	enc, _ := encodeBeat(left)
	r := records.Record{Kind: records.KindSecret, Meta: metav1.ObjectMeta{Name: "sh.helm.release.v1.web.v4", Namespace: "shop", ResourceVersion: "5"}}
	l := Stores.ReleaseSnapshot("shop", "web", r, &metav1.ObjectMeta{Name: LeaseName("web"), Namespace: "shop", ResourceVersion: "7", Annotations: map[string]string{Stores.AnnotationBeat: enc, Stores.AnnotationClaimedFrom: "A"}}, "9")
	b := &Backend{Margin: TakeoverMargin}
	if v := b.decode(l, servertime.Bounds{Earliest: t0.Add(time.Second), Latest: t0.Add(2 * time.Second)}, "C"); v.state != Free {
		t.Fatalf("state %s (claim %v), want free", v.state, v.claim)
	}
}

// TestClaimCountsOnlyAgainstItsRecord: a take's claim names the record it
// was made against (the beat's claimed-on annotation), and counts as a claim in flight
// only while that record, at that version, is the newest: a holder whose
// take is the last write of its beat (its SetRevision wrote nothing) leaves
// no claim against a later record that carries no lock (stock helm's); a
// beat of an earlier version, naming no record or naming it for another
// session (an earlier version claimed over this one's beat and left the
// annotation), counts as before.
func TestClaimCountsOnlyAgainstItsRecord(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	claim := Record{Session: "A", Operation: OpUpgrade, LeaseDuration: metav1.Duration{Duration: 15 * time.Second}, AcquiredAt: t0, RenewedAt: t0, LockedTill: t0.Add(15 * time.Second)}
	enc, _ := encodeBeat(claim)
	b := &Backend{Margin: TakeoverMargin}
	now := servertime.Bounds{Earliest: t0.Add(time.Second), Latest: t0.Add(2 * time.Second)}
	for _, tc := range []struct {
		name      string
		newest    string // name of the newest record (carrying no lock)
		newestRV  string
		claimedOn string // "" for none
		want      State
	}{
		{"claim against the newest record as read", "sh.helm.release.v1.web.v3", "5", "sh.helm.release.v1.web.v3@5@A", Live},
		{"claim against an older record", "sh.helm.release.v1.web.v4", "8", "sh.helm.release.v1.web.v3@5@A", Free},
		{"claim against an earlier version of the newest record", "sh.helm.release.v1.web.v3", "6", "sh.helm.release.v1.web.v3@5@A", Free},
		{"claim of an earlier version, naming no record", "sh.helm.release.v1.web.v4", "8", "", Live},
		{"claim of an earlier version over another session's record name", "sh.helm.release.v1.web.v4", "8", "sh.helm.release.v1.web.v3@5@Z", Live},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ann := map[string]string{Stores.AnnotationBeat: enc, Stores.AnnotationClaimedFrom: ""}
			if tc.claimedOn != "" {
				ann[Stores.AnnotationClaimedOn] = tc.claimedOn
			}
			r := records.Record{Kind: records.KindSecret, Meta: metav1.ObjectMeta{Name: tc.newest, Namespace: "shop", ResourceVersion: tc.newestRV}}
			l := Stores.ReleaseSnapshot("shop", "web", r, &metav1.ObjectMeta{Name: LeaseName("web"), Namespace: "shop", ResourceVersion: "7", Annotations: ann}, "9")
			if v := b.decode(l, now, "C"); v.state != tc.want {
				t.Fatalf("state %s (claim %v), want %s", v.state, v.claim, tc.want)
			}
		})
	}
}
