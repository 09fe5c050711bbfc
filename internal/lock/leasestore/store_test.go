package leasestore

import (
	"reflect"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

func record(session string) lock.Record {
	return lock.Record{
		Schema: lock.SchemaVersion, Session: session, Operation: lock.OpUpgrade, Release: "web", Namespace: "shop",
		LeaseDuration: metav1.Duration{Duration: 15 * time.Second}, AcquiredAt: t0, RenewedAt: t0.Add(5 * time.Second), LockedTill: t0.Add(20 * time.Second),
	}
}

func lease(t *testing.T, rec lock.Record, ws []lock.Waiter) *coordinationv1.Lease {
	t.Helper()
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: lock.LeaseName("web"), Namespace: "shop", ResourceVersion: "7"}}
	if err := SetHolder(l, &rec); err != nil {
		t.Fatal(err)
	}
	if err := SetQueue(l, ws); err != nil {
		t.Fatal(err)
	}
	return l
}

// TestSnapshotReadsWhatWasWritten: a Lease written with a holder's record
// and a queue reads back as them, its spec mirroring the record (the
// holder, none once released; the renewal and the lease), so that a tool
// that reads Leases alone judges it as the lock does.
func TestSnapshotReadsWhatWasWritten(t *testing.T) {
	ws := []lock.Waiter{{Session: "W", Who: "w", Operation: lock.OpUpgrade, EnqueuedAt: t0, HeartbeatAt: t0, ExpiresAt: t0.Add(time.Minute)}}
	s := Snapshot(lease(t, record("A"), ws))
	if s.RecordErr != nil || s.Record == nil || !reflect.DeepEqual(*s.Record, record("A")) {
		t.Fatalf("record read back = %+v, %v; want A's", s.Record, s.RecordErr)
	}
	if lock.HolderOf(&s.Spec) != "A" || s.Spec.RenewTime == nil || !s.Spec.RenewTime.Time.Equal(t0.Add(5*time.Second)) || s.Spec.LeaseDurationSeconds == nil || *s.Spec.LeaseDurationSeconds != 15 {
		t.Fatalf("spec = %+v; want A renewed at +5s for 15s", s.Spec)
	}
	if !reflect.DeepEqual(s.Queue, ws) {
		t.Fatalf("queue = %+v; want %+v", s.Queue, ws)
	}
	released := record("A")
	released.ReleasedAt = t0.Add(6 * time.Second)
	l := lease(t, released, nil)
	if s := Snapshot(l); lock.HolderOf(&s.Spec) != "" || len(s.Queue) != 0 {
		t.Fatalf("released: holder %q, queue %+v; want none, none", lock.HolderOf(&s.Spec), s.Queue)
	}
	if _, ok := l.Annotations[lock.AnnotationQueue]; ok {
		t.Fatal("an empty queue left its annotation")
	}
}

// TestChangeOfTheLease is the Lease store's reading of a waiter's watch
// events (lock.Store.Change): only a change of the lock's own Lease counts;
// it names the holder (spec and record) and whether the holder is the one
// seen in the same state.
func TestChangeOfTheLease(t *testing.T) {
	st := New(nil, "shop")
	seen := Snapshot(lease(t, record("A"), nil))
	renewed := record("A")
	renewed.RenewedAt, renewed.LockedTill = t0.Add(10*time.Second), t0.Add(25*time.Second)
	ws := []lock.Waiter{{Session: "W", EnqueuedAt: t0, HeartbeatAt: t0, ExpiresAt: t0.Add(time.Minute)}}
	other := lease(t, renewed, ws)
	other.Namespace = "elsewhere"
	for _, c := range []struct {
		name  string
		ev    watch.Event
		ok    bool
		same  bool
		queue int
	}{
		{"the holder renews, a waiter queues", watch.Event{Type: watch.Modified, Object: lease(t, renewed, ws)}, true, true, 1},
		{"another session takes it", watch.Event{Type: watch.Modified, Object: lease(t, record("B"), nil)}, true, false, 0},
		{"the Lease is deleted", watch.Event{Type: watch.Deleted, Object: lease(t, renewed, nil)}, false, false, 0},
		{"a Lease of another namespace", watch.Event{Type: watch.Modified, Object: other}, false, false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			ch, ok := st.Change(seen, c.ev)
			if ok != c.ok || (ok && (ch.Same != c.same || !ch.Queued || len(ch.Queue) != c.queue)) {
				t.Fatalf("Change = %+v, %v; want ok %v, same %v, %d queued", ch, ok, c.ok, c.same, c.queue)
			}
			if ok {
				want := lock.SessionOf(lock.AnnotatedRecord(c.ev.Object.(*coordinationv1.Lease).Annotations))
				if !slices.Contains(ch.Holders, want) {
					t.Fatalf("Change names %v; want %s among them", ch.Holders, want)
				}
			}
		})
	}
}
