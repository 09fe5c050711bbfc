package lock

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

// writeLog is one write the client of an rworld sent: the object's name,
// and the fake clock when it was sent.
type writeLog struct {
	name string
	at   time.Time
}

// logWrites follows the writes of w's client; stall, when set, is called
// before each request and may move the clock (a process that stands still
// while a request is held up).
func logWrites(w *rworld, stall func(a k8stesting.Action)) *[]writeLog {
	var log []writeLog
	w.cs.PrependReactor("*", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if stall != nil {
			stall(a)
		}
		name := ""
		switch a := a.(type) {
		case k8stesting.CreateAction: // an update too
			name = a.GetObject().(*corev1.Secret).Name
		case k8stesting.PatchAction:
			name = a.GetName()
		}
		if name != "" {
			log = append(log, writeLog{name, w.clk.Now()})
		}
		return false, nil, nil
	})
	return &log
}

// TestTakeStopsAtItsDeadline: a take whose process stands still for a
// lease between its claim of the beat and its gate write (here the check
// that the anchor is still the newest record, the list after the claim)
// writes no gate on that claim, whose deadline has passed: it reads the
// lock again, claims the beat anew, and writes the gate within that
// claim's deadline (the simulation, seed 302).
func TestTakeStopsAtItsDeadline(t *testing.T) {
	const lease = 15 * time.Second
	w := newRWorld(t)
	lists := 0
	log := logWrites(w, func(a k8stesting.Action) {
		if a.GetVerb() == "list" {
			if lists++; lists == 2 {
				w.clk.Step(lease)
			}
		}
	})
	h, _, err := w.b.TryAcquire(context.Background(), req(OpUpgrade, lease))
	if err != nil {
		t.Fatal(err)
	}
	var claimed time.Time
	gates := 0
	for _, l := range *log {
		if l.name == LeaseName("web") {
			claimed = l.at
			continue
		}
		gates++
		if left := claimed.Add(lease - RenewMargin).Sub(l.at); left <= 0 {
			t.Errorf("the gate %s was written %s after the deadline of the claim it was taken on", l.name, -left)
		}
	}
	if gates != 1 {
		t.Errorf("%d gate writes %+v, want 1", gates, *log)
	}
	if err := h.Valid(); err != nil {
		t.Errorf("the lock taken is not valid: %v", err)
	}
}

// TestHolderWriteStopsAtItsDeadline: a holder's write of the lock (here
// SetRevision, a write of the beat) whose read of the lock is held up past
// the renew deadline sends no write: it fails with ErrLost (the
// simulation, seed 842).
func TestHolderWriteStopsAtItsDeadline(t *testing.T) {
	const lease = 15 * time.Second
	w := newRWorld(t)
	ctx := context.Background()
	h, _, err := w.b.TryAcquire(ctx, req(OpUpgrade, lease))
	if err != nil {
		t.Fatal(err)
	}
	stalled := false
	log := logWrites(w, func(a k8stesting.Action) {
		if a.GetVerb() == "list" && !stalled {
			stalled = true
			w.clk.Step(lease)
		}
	})
	// Valid passes before the write: the clock moves during its read.
	if err := h.SetRevision(ctx, 7); !errors.Is(err, ErrLost) {
		t.Errorf("SetRevision = %v, want ErrLost", err)
	}
	if !stalled {
		t.Fatal("the write read nothing: the test stalls nothing")
	}
	if len(*log) != 0 {
		t.Errorf("writes sent after the renew deadline: %+v", *log)
	}
}
