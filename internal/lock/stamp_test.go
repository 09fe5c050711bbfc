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
	// The estimate narrowed: its upper bound is now 4 ms before the last
	// stamp. The renewal still stamps a later time, by a millisecond, so
	// that each write of the holder has its own RenewedAt.
	stamp(&rec, servertime.Bounds{Earliest: t0.Add(-time.Second), Latest: t0.Add(-4 * time.Millisecond)})
	if next := t0.Add(time.Millisecond); !rec.RenewedAt.Equal(next) || !rec.LockedTill.Equal(next.Add(15*time.Second)) {
		t.Fatalf("stamp went back or stood still: renewedAt %s lockedTill %s, want %s and %s", rec.RenewedAt, rec.LockedTill, next, next.Add(15*time.Second))
	}
	later := t0.Add(5 * time.Second)
	stamp(&rec, servertime.Bounds{Earliest: later.Add(-time.Millisecond), Latest: later})
	if !rec.RenewedAt.Equal(later) {
		t.Fatalf("stamp did not move forward: renewedAt %s, want %s", rec.RenewedAt, later)
	}
}
