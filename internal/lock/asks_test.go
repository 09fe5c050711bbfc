package lock

import (
	"testing"
	"time"
)

// TestHolderAsked: a waiter that asks to preempt names the holder it sees
// live (a claim in flight first), and nobody when the lock is not live.
func TestHolderAsked(t *testing.T) {
	held := &Record{Session: "h"}
	claim := &Record{Session: "c"}
	for _, tc := range []struct {
		name string
		v    view
		want string
	}{
		{"live holder", view{state: Live, rec: held}, "h"},
		{"claim in flight", view{state: Live, rec: held, claim: claim}, "c"},
		{"expired", view{state: Expired, rec: held}, ""},
		{"free", view{state: Free}, ""},
		{"live, unreadable record", view{state: Live}, ""},
	} {
		if got := holderAsked(tc.v); got != tc.want {
			t.Errorf("%s: holderAsked = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestWaitersKeepPreemptRequest: the beat's compact queue keeps a request
// to preempt and the holder it names, both ways.
func TestWaitersKeepPreemptRequest(t *testing.T) {
	at := time.Date(2026, 12, 7, 2, 0, 0, 0, time.UTC)
	in := []Waiter{
		{Session: "a", Who: "alice", Operation: OpUpgrade, EnqueuedAt: at, HeartbeatAt: at, ExpiresAt: at.Add(15 * time.Second)},
		{Session: "b", Who: "bob", Operation: OpUpgrade, EnqueuedAt: at, HeartbeatAt: at, ExpiresAt: at.Add(15 * time.Second), Preempt: true, PreemptHolder: "h"},
	}
	s, err := encodeWaiters(in)
	if err != nil {
		t.Fatal(err)
	}
	out := decodeWaiters(s)
	if len(out) != 2 || out[0].Preempt || out[0].PreemptHolder != "" || !out[1].Preempt || out[1].PreemptHolder != "h" {
		t.Fatalf("decodeWaiters(encodeWaiters(%+v)) = %+v", in, out)
	}
}
