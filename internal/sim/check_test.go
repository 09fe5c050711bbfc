package sim

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// TestCheck is the table of the checker on hand-made histories of Lease
// writes: it must flag what breaks an invariant, and only that.
func TestCheck(t *testing.T) {
	t0 := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	lease := 2 * time.Second
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
			Object: map[string]any{"metadata": map[string]any{"annotations": map[string]any{lock.AnnotationRecord: enc}}},
		}
	}
	// onRecord moves a write onto the release's first record (a gate).
	onRecord := func(w Write) Write {
		w.Res, w.Name = "secrets", recordPrefix+"1"
		return w
	}
	for _, tc := range []struct {
		name   string
		writes []Write
		want   []string // the invariants flagged, in order
	}{
		{"a clean handover", []Write{
			write(1, 0, "a", 0, false), write(2, time.Second, "a", 0, false), write(3, 1500*time.Millisecond, "a", 0, true),
			write(4, 2*time.Second, "b", 2*time.Second, false),
		}, nil},
		{"a take after the holder's expiry", []Write{
			write(1, 0, "a", 0, false), write(2, 5*time.Second, "b", 5*time.Second, false),
		}, nil},
		{"a take before the holder's expiry", []Write{
			write(1, 0, "a", 0, false), write(2, time.Second, "b", time.Second, false),
		}, []string{"S3"}},
		{"a renewal after a takeover", []Write{
			write(1, 0, "a", 0, false), write(2, 5*time.Second, "b", 5*time.Second, false), write(3, 6*time.Second, "a", 0, false),
		}, []string{"S5", "S1"}},
		// A helm write of a lost tenure that lands late, after its taker
		// released: no new take (it carries the lost tenure's record), so
		// its writer's span overlaps the taker's (found by review).
		{"a late record write of a lost tenure", []Write{
			onRecord(write(1, 0, "a", 0, false)), onRecord(write(2, 5*time.Second, "b", 5*time.Second, false)),
			onRecord(write(3, 6*time.Second, "b", 5*time.Second, true)), onRecord(write(4, 7*time.Second, "a", 0, false)),
		}, []string{"S1"}},
		{"the same session taking the lock again after the taker released it", []Write{
			write(1, 0, "a", 0, false), write(2, 5*time.Second, "b", 5*time.Second, false), write(3, 6*time.Second, "b", 5*time.Second, true),
			write(4, 7*time.Second, "a", 7*time.Second, false), write(5, 8*time.Second, "a", 7*time.Second, false),
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs := Check(Outcome{Start: t0, Writes: tc.writes})
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
