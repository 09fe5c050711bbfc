package lock

import (
	"testing"
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
