package releasestore

import (
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// TestWaitersKeepPreemptRequest: the beat's compact queue keeps a request
// to preempt and the holder it names, both ways.
func TestWaitersKeepPreemptRequest(t *testing.T) {
	at := time.Date(2026, 12, 7, 2, 0, 0, 0, time.UTC)
	in := []lock.Waiter{
		{Session: "a", Who: "alice", Operation: lock.OpUpgrade, EnqueuedAt: at, HeartbeatAt: at, ExpiresAt: at.Add(15 * time.Second)},
		{Session: "b", Who: "bob", Operation: lock.OpUpgrade, EnqueuedAt: at, HeartbeatAt: at, ExpiresAt: at.Add(15 * time.Second), Preempt: true, PreemptHolder: "h"},
	}
	s, err := EncodeWaiters(in)
	if err != nil {
		t.Fatal(err)
	}
	out := DecodeWaiters(s)
	if len(out) != 2 || out[0].Preempt || out[0].PreemptHolder != "" || !out[1].Preempt || out[1].PreemptHolder != "h" {
		t.Fatalf("DecodeWaiters(EncodeWaiters(%+v)) = %+v", in, out)
	}
}
