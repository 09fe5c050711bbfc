package releasestore

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
)

// rvOf is the resourceVersion of beat, "" for none.
func rvOf(beat *metav1.ObjectMeta) string {
	if beat == nil {
		return ""
	}
	return beat.ResourceVersion
}

// TestVirtualGateAndBeat is the table of the release store's judgement of
// a gate and a beat together (see beat.go): which session holds the
// lock, until when, and what is a claim in flight.
func TestVirtualGateAndBeat(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	lease := 15 * time.Second
	gate := func(session string, renewed time.Time, mut ...func(*lock.Record)) string {
		r := lock.Record{
			Schema: lock.SchemaVersion, Session: session, Operation: lock.OpUpgrade, Release: "web", Namespace: "shop",
			LeaseDuration: metav1.Duration{Duration: lease}, AcquiredAt: renewed, RenewedAt: renewed,
			LockedTill: renewed.Add(lease), MaxHoldUntil: renewed.Add(time.Hour),
		}
		for _, m := range mut {
			m(&r)
		}
		r = gateForm(r)
		s, err := r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	oldVersion := func(session string, renewed time.Time) string {
		r := lock.Record{Schema: lock.SchemaVersion, Session: session, Release: "web", Namespace: "shop", LeaseDuration: metav1.Duration{Duration: lease}, RenewedAt: renewed, LockedTill: renewed.Add(lease)}
		s, _ := r.Encode()
		return s
	}
	beatOf := func(session string, renewed time.Time, from *string, mut ...func(*lock.Record)) *metav1.ObjectMeta {
		r := lock.Record{Session: session, Operation: lock.OpUpgrade, Release: "web", Namespace: "shop", LeaseDuration: metav1.Duration{Duration: lease}, AcquiredAt: t0, RenewedAt: renewed, LockedTill: renewed.Add(lease)}
		for _, m := range mut {
			m(&r)
		}
		s, err := EncodeBeat(r)
		if err != nil {
			t.Fatal(err)
		}
		o := &metav1.ObjectMeta{Name: lock.LeaseName("web"), Namespace: "shop", ResourceVersion: "7", Labels: lock.LockLabels("web"), Annotations: map[string]string{AnnotationBeat: s}}
		if from != nil {
			o.Annotations[AnnotationClaimedFrom] = *from
		}
		return o
	}
	str := func(s string) *string { return &s }
	released := func(r *lock.Record) { r.ReleasedAt = t0.Add(2 * time.Second) }
	for _, tc := range []struct {
		name       string
		gate       string // "" for a record without a lock
		beat       *metav1.ObjectMeta
		holder     string
		lockedTill time.Time
		claim      string // session of the Claim, "" for none
		revision   int
	}{
		{name: "gate alone (its beat deleted): the bound it was written with, never its take stamp", gate: gate("A", t0), holder: "A", lockedTill: t0.Add(time.Hour + lease)},
		{name: "gate and an unreadable beat: its bound", gate: gate("A", t0), beat: &metav1.ObjectMeta{ResourceVersion: "7", Annotations: map[string]string{AnnotationBeat: "{"}}, holder: "A", lockedTill: t0.Add(time.Hour + lease)},
		{name: "gate and its holder's later beat", gate: gate("A", t0), beat: beatOf("A", t0.Add(10*time.Second), str("Z")), holder: "A", lockedTill: t0.Add(25 * time.Second)},
		{name: "the beat names the revision", gate: gate("A", t0), beat: beatOf("A", t0.Add(5*time.Second), nil, func(r *lock.Record) { r.Revision = 4 }), holder: "A", lockedTill: t0.Add(20 * time.Second), revision: 4},
		{name: "an older beat of the holder never shortens the gate", gate: gate("A", t0.Add(8*time.Second)), beat: beatOf("A", t0, nil), holder: "A", lockedTill: t0.Add(23 * time.Second)},
		{name: "a claim in flight from the gate's holder", gate: gate("A", t0), beat: beatOf("B", t0.Add(16*time.Second), str("A")), holder: "A", lockedTill: t0.Add(lease), claim: "B"},
		{name: "a stale claim from another session says nothing of the holder", gate: gate("A", t0), beat: beatOf("B", t0, str("X")), holder: "A", lockedTill: t0.Add(time.Hour + lease), claim: "B"},
		{name: "the holder's beat marked released by a person, its gate not yet", gate: gate("A", t0), beat: beatOf("A", t0.Add(time.Second), nil, released), holder: "A", lockedTill: t0.Add(time.Hour + lease), claim: "A"},
		{name: "released gate, the holder's last beat", gate: gate("A", t0, released), beat: beatOf("A", t0.Add(time.Second), nil), holder: ""},
		{name: "released gate, a claim", gate: gate("A", t0, released), beat: beatOf("B", t0.Add(3*time.Second), str("A")), holder: "", claim: "B"},
		{name: "no lock on the record, a claim", gate: "", beat: beatOf("B", t0, str("")), holder: "", claim: "B"},
		{name: "an earlier version's gate is judged as written", gate: oldVersion("A", t0), beat: beatOf("A", t0.Add(30*time.Second), nil), holder: "A", lockedTill: t0.Add(30*time.Second + lease)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := records.Record{Kind: records.KindSecret, Meta: metav1.ObjectMeta{
				Name: "sh.helm.release.v1.web.v3", Namespace: "shop", ResourceVersion: "5",
				Labels: map[string]string{"owner": "helm", "name": "web", "version": "3"},
			}}
			if tc.gate != "" {
				r.Meta.Annotations = map[string]string{lock.AnnotationRecord: tc.gate}
			}
			l := Snapshot("shop", "web", r, tc.beat, "9")
			if got := lock.HolderOf(&l.Spec); got != tc.holder {
				t.Fatalf("holder %q, want %q", got, tc.holder)
			}
			if v := l.Version.(releaseVersion); v.gate != "5" || v.beat != rvOf(tc.beat) || v.list != "9" {
				t.Errorf("read at gate %q, beat %q, list %q; want 5, %q, 9", v.gate, v.beat, v.list, rvOf(tc.beat))
			}
			if tc.holder != "" {
				rec, err := lock.DecodeRecord(l.Raw)
				if err != nil {
					t.Fatal(err)
				}
				till, _ := lock.LockedTill(rec, &l.Spec)
				if !till.Equal(tc.lockedTill) {
					t.Errorf("LOCKED TILL %s, want %s", till.Format(time.RFC3339Nano), tc.lockedTill.Format(time.RFC3339Nano))
				}
				if rec.Revision != tc.revision {
					t.Errorf("revision %d, want %d", rec.Revision, tc.revision)
				}
			}
			var c *lock.Record
			if l.Claim != nil {
				c = l.Claim.Record
			}
			switch {
			case tc.claim == "" && c != nil:
				t.Errorf("claim %q, want none", c.Session)
			case tc.claim != "" && (c == nil || c.Session != tc.claim):
				t.Errorf("claim %v, want %q", c, tc.claim)
			}
		})
	}
}
