package lock

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

func TestStampNeverGoesBack(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 13, 38, 44, 7_000_000, time.UTC)
	rec := Record{LeaseDuration: metav1.Duration{Duration: 15 * time.Second}, AcquiredAt: t0, RenewedAt: t0}
	// The estimate narrowed: its upper bound is now 4 ms before the last stamp.
	stamp(&rec, servertime.Bounds{Earliest: t0.Add(-time.Second), Latest: t0.Add(-4 * time.Millisecond)})
	if !rec.RenewedAt.Equal(t0) || !rec.LockedTill.Equal(t0.Add(15*time.Second)) {
		t.Fatalf("stamp went back: renewedAt %s lockedTill %s, want %s and %s", rec.RenewedAt, rec.LockedTill, t0, t0.Add(15*time.Second))
	}
	later := t0.Add(5 * time.Second)
	stamp(&rec, servertime.Bounds{Earliest: later.Add(-time.Millisecond), Latest: later})
	if !rec.RenewedAt.Equal(later) {
		t.Fatalf("stamp did not move forward: renewedAt %s, want %s", rec.RenewedAt, later)
	}
}
