package lock

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSpecOf: the spec derived from a stored record decides Free, Live or
// Expired exactly as a Lease's spec would, and errs towards Live.
func TestSpecOf(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	held := Record{Schema: 1, Session: "s1", LeaseDuration: metav1.Duration{Duration: 15 * time.Second}, AcquiredAt: t0, RenewedAt: t0.Add(5 * time.Second), LockedTill: t0.Add(20 * time.Second)}
	enc := func(r Record) string {
		s, err := r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	released := held
	released.ReleasedAt = t0.Add(6 * time.Second)
	newer := held
	newer.Schema = SchemaVersion + 1
	cases := map[string]struct {
		annotation string
		holder     string
		till       time.Time
	}{
		"no record":    {annotation: "", holder: ""},
		"held":         {annotation: enc(held), holder: "s1", till: t0.Add(20 * time.Second)},
		"released":     {annotation: enc(released), holder: ""},
		"newer schema": {annotation: enc(newer), holder: "s1", till: t0.Add(20 * time.Second)},
		"not json":     {annotation: "{oops", holder: UnreadableHolder},
		"no session":   {annotation: `{"schema":1}`, holder: ""},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			spec := SpecOf(c.annotation)
			if got := HolderOf(&spec); got != c.holder {
				t.Fatalf("holder = %q; want %q", got, c.holder)
			}
			till, ok := LockedTill(nil, &spec)
			if c.till.IsZero() {
				if ok && c.holder != "" {
					t.Fatalf("LockedTill = %s; want unknown (judged Live)", till)
				}
				return
			}
			if !ok || !till.Equal(c.till) {
				t.Fatalf("LockedTill = %s, %v; want %s", till, ok, c.till)
			}
		})
	}
}

// TestJointPrevious: recovery is told about the part that was found expired,
// the one naming the highest revision when both were.
func TestJointPrevious(t *testing.T) {
	rec := func(rev int) *Record { return &Record{Session: "x", Revision: rev} }
	cases := map[string]struct {
		parts   []*part
		wantRev int
		want    State
	}{
		"record expired":   {parts: []*part{{Previous: rec(3), PreviousState: Expired}, {Previous: rec(2), PreviousState: Free}}, wantRev: 3, want: Expired},
		"lease expired":    {parts: []*part{{PreviousState: Free}, {Previous: rec(4), PreviousState: Expired}}, wantRev: 4, want: Expired},
		"both expired":     {parts: []*part{{Previous: rec(5), PreviousState: Expired}, {Previous: rec(4), PreviousState: Expired}}, wantRev: 5, want: Expired},
		"both free":        {parts: []*part{{PreviousState: Free}, {Previous: rec(2), PreviousState: Free}}, wantRev: 2, want: Free},
		"nothing anywhere": {parts: []*part{{PreviousState: Free}, {PreviousState: Free}}, wantRev: 0, want: Free},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			got, state := (&Held{parts: c.parts}).Previous()
			rev := 0
			if got != nil {
				rev = got.Revision
			}
			if rev != c.wantRev || state != c.want {
				t.Fatalf("Previous = revision %d, %s; want %d, %s", rev, state, c.wantRev, c.want)
			}
		})
	}
}
