package lock

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

var t0 = time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// bounds is a server-time estimate one second wide starting at d.
func bounds(d time.Duration) servertime.Bounds {
	return servertime.Bounds{Earliest: at(d), Latest: at(d + time.Second)}
}

func spec(holder string, renew time.Duration, seconds int32) *coordinationv1.LeaseSpec {
	return &coordinationv1.LeaseSpec{
		HolderIdentity:       &holder,
		LeaseDurationSeconds: &seconds,
		RenewTime:            &metav1.MicroTime{Time: at(renew)},
	}
}

func rec(session string, lockedTill time.Duration) *Record {
	return &Record{Schema: SchemaVersion, Session: session, LockedTill: at(lockedTill)}
}

func TestJudge(t *testing.T) {
	const margin = time.Second
	cases := []struct {
		name string
		rec  *Record
		spec *coordinationv1.LeaseSpec
		now  servertime.Bounds
		want State
	}{
		{name: "no lease", now: bounds(0), want: Free},
		{name: "lease without holder", spec: &coordinationv1.LeaseSpec{}, now: bounds(0), want: Free},
		{name: "released (empty holder)", rec: rec("a", 10*time.Second), spec: spec("", 0, 10), now: bounds(0), want: Free},
		{name: "released, long expired", spec: spec("", -time.Hour, 10), now: bounds(0), want: Free},
		{name: "live, well before LOCKED TILL", rec: rec("a", 10*time.Second), spec: spec("a", 0, 10), now: bounds(5 * time.Second), want: Live},
		{name: "live at LOCKED TILL", rec: rec("a", 10*time.Second), spec: spec("a", 0, 10), now: bounds(10 * time.Second), want: Live},
		{name: "live inside the margin", rec: rec("a", 10*time.Second), spec: spec("a", 0, 10), now: bounds(11 * time.Second), want: Live},
		{name: "expired once earliest passes LOCKED TILL + margin", rec: rec("a", 10*time.Second), spec: spec("a", 0, 10), now: bounds(11*time.Second + time.Nanosecond), want: Expired},
		{
			name: "latest bound past expiry is not enough",
			rec:  rec("a", 10*time.Second), spec: spec("a", 0, 10),
			now:  servertime.Bounds{Earliest: at(10 * time.Second), Latest: at(20 * time.Second)},
			want: Live,
		},
		{name: "record later than spec wins", rec: rec("a", 30*time.Second), spec: spec("a", 0, 10), now: bounds(20 * time.Second), want: Live},
		{name: "spec later than record wins", rec: rec("a", 10*time.Second), spec: spec("a", 20*time.Second, 10), now: bounds(20 * time.Second), want: Live},
		{name: "record of another session is ignored", rec: rec("old", time.Hour), spec: spec("b", 0, 10), now: bounds(12 * time.Second), want: Expired},
		{name: "no record: judged from the spec", spec: spec("b", 0, 10), now: bounds(12 * time.Second), want: Expired},
		{
			name: "no record and no renew time: cannot tell, live",
			spec: &coordinationv1.LeaseSpec{HolderIdentity: ptr("b")},
			now:  bounds(time.Hour), want: Live,
		},
		{name: "no server time: live", rec: rec("a", 10*time.Second), spec: spec("a", 0, 10), want: Live},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Judge(tc.rec, tc.spec, tc.now, margin); got != tc.want {
				t.Errorf("Judge() = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestSkewedClientsJudgeAlike: two clients whose local clocks are 10 minutes
// ahead and 10 minutes behind the server watch the same lock. Neither calls
// it expired before LOCKED TILL + margin, and both call it expired within
// one Date resolution (plus round trip) after that.
func TestSkewedClientsJudgeAlike(t *testing.T) {
	const margin = time.Second
	r := rec("a", 10*time.Second)
	s := spec("a", 0, 10)
	for _, skew := range []time.Duration{10 * time.Minute, -10 * time.Minute, 0} {
		clk := clocktesting.NewFakeClock(t0.Add(skew).Add(300 * time.Millisecond))
		est := servertime.New(clk)
		// The server answered at true time t0+0.3 s after a 20 ms trip.
		sent := clk.Now()
		clk.Step(20 * time.Millisecond)
		est.Observe(sent, clk.Now(), t0)
		firstExpired := time.Duration(-1)
		for step := time.Duration(0); step < 20*time.Second; step += 10 * time.Millisecond {
			trueNow := 320*time.Millisecond + step
			clk.SetTime(t0.Add(skew).Add(trueNow))
			b, _ := est.Now()
			if Judge(r, s, b, margin) == Expired {
				firstExpired = trueNow
				break
			}
		}
		if firstExpired < 11*time.Second {
			t.Errorf("skew %v: judged expired at true server time +%v, before LOCKED TILL + margin (+11s)", skew, firstExpired)
		}
		if firstExpired > 11*time.Second+time.Second+100*time.Millisecond {
			t.Errorf("skew %v: judged expired only at +%v, want within about 1s of +11s", skew, firstExpired)
		}
	}
}

func TestQueueAdmission(t *testing.T) {
	const margin = time.Second
	w := func(s string, expires time.Duration) Waiter { return Waiter{Session: s, ExpiresAt: at(expires)} }
	q := []Waiter{w("dead", 5*time.Second), w("a", 30*time.Second), w("b", 30*time.Second)}
	cases := []struct {
		name    string
		queue   []Waiter
		session string
		now     servertime.Bounds
		want    int
	}{
		{name: "empty queue", session: "x", now: bounds(0), want: 0},
		{name: "not queued: everyone live is ahead", queue: q, session: "x", now: bounds(0), want: 3},
		{name: "head", queue: q, session: "dead", now: bounds(0), want: 0},
		{name: "second behind a live head", queue: q, session: "a", now: bounds(0), want: 1},
		{name: "dead head still live within the margin", queue: q, session: "a", now: bounds(6 * time.Second), want: 1},
		{name: "dead head skipped once expired", queue: q, session: "a", now: bounds(6*time.Second + time.Millisecond), want: 0},
		{name: "third", queue: q, session: "b", now: bounds(10 * time.Second), want: 1},
		{name: "not queued, dead head dropped", queue: q, session: "x", now: bounds(10 * time.Second), want: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := waitersAhead(liveWaiters(tc.queue, tc.now, margin), tc.session); got != tc.want {
				t.Errorf("waiters ahead = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestConfirm(t *testing.T) {
	const (
		lease  = 15 * time.Second
		margin = 250 * time.Millisecond
	)
	cases := []struct {
		name      string
		st        State
		seenFor   time.Duration
		bounded   bool
		uncertain time.Duration
		want      State
		confirmIn time.Duration
	}{
		{name: "free stays free", st: Free, seenFor: time.Hour, bounded: true, want: Free},
		{name: "expired in server time, first seen now: a lease and the margin to go", st: Expired, bounded: true, want: Live, confirmIn: lease + margin},
		{name: "expired, seen unchanged for half a lease", st: Expired, seenFor: lease / 2, bounded: true, want: Live, confirmIn: lease/2 + margin},
		{name: "expired, seen unchanged for a lease, the margin not yet", st: Expired, seenFor: lease, bounded: true, want: Live, confirmIn: margin},
		{name: "expired, seen unchanged for a lease and the margin", st: Expired, seenFor: lease + margin, bounded: true, want: Expired},
		{name: "expired long ago by the server's clock: still a lease to go once first seen", st: Expired, bounded: true, want: Live, confirmIn: lease + margin},
		{name: "expired, not bounded, first seen now: a lease to go too", st: Expired, want: Live, confirmIn: lease + margin},
		{name: "expired, not bounded, seen for a lease and the margin", st: Expired, seenFor: lease + margin, want: Expired},
		{name: "live in server time, bounded, seen for a moment", st: Live, seenFor: time.Second, bounded: true, want: Live, confirmIn: lease + margin - time.Second},
		{name: "live in server time (its clock behind), bounded, seen unchanged for a lease and the margin", st: Live, seenFor: lease + margin, bounded: true, want: Expired},
		{name: "live, not bounded (a gate's long bound), seen for an hour: live", st: Live, seenFor: time.Hour, want: Live},
		{name: "a clock that ran backwards counts as unseen", st: Expired, seenFor: -time.Second, bounded: true, want: Live, confirmIn: lease + margin},
		{name: "live, bounded, its stamp a second wide: seen for a lease and the margin is not enough", st: Live, seenFor: lease + margin, bounded: true, uncertain: time.Second, want: Live, confirmIn: time.Second},
		{name: "live, bounded, its stamp a second wide, seen for a lease, the margin and that second", st: Live, seenFor: lease + margin + time.Second, bounded: true, uncertain: time.Second, want: Expired},
		{name: "live, bounded, an uncertainty beyond a second counts as a second", st: Live, seenFor: lease + margin, bounded: true, uncertain: time.Hour, want: Live, confirmIn: time.Second},
		{name: "live, bounded, an uncertainty beyond a second, seen for a lease, the margin and a second", st: Live, seenFor: lease + margin + time.Second, bounded: true, uncertain: time.Hour, want: Expired},
		{name: "expired in server time: the stamp's uncertainty adds nothing", st: Expired, seenFor: lease + margin, bounded: true, uncertain: time.Second, want: Expired},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, in := Confirm(tc.st, Sighting{SeenFor: tc.seenFor, Lease: lease, Bounded: tc.bounded, Uncertain: tc.uncertain}, margin)
			if st != tc.want || in != tc.confirmIn {
				t.Errorf("Confirm = %v, %v; want %v, %v", st, in, tc.want, tc.confirmIn)
			}
		})
	}
}

func TestSightingsStartAnewOnAnyChange(t *testing.T) {
	s := NewSightings()
	till := func(d time.Duration) time.Time { return at(d + 15*time.Second) }
	if first := s.mark("k", "a", at(0), till(0), at(time.Second)); !first.Equal(at(time.Second)) {
		t.Fatalf("first sight = %v", first)
	}
	if got := s.mark("k", "a", at(0), till(0), at(9*time.Second)); !got.Equal(at(time.Second)) {
		t.Errorf("the same lock read again: first sight moved to %v", got)
	}
	for i, c := range []struct {
		holder        string
		renewed, till time.Duration
	}{
		{"a", 5 * time.Second, 5 * time.Second}, // renewed
		{"a", -time.Second, -time.Second},       // an older copy
		{"a", -time.Second, time.Hour},          // another LOCKED TILL
		{"b", -time.Second, -time.Second},       // another holder
	} {
		now := at(time.Duration(10+i) * time.Second)
		if got := s.mark("k", c.holder, at(c.renewed), till(c.till), now); !got.Equal(now) {
			t.Errorf("change %d (%+v): first sight %v, want %v", i, c, got, now)
		}
	}
	if got := s.mark("other", "b", at(-time.Second), till(-time.Second), at(20*time.Second)); !got.Equal(at(20 * time.Second)) {
		t.Errorf("another lock: first sight %v", got)
	}
	s.forget("k")
	if got := s.mark("k", "b", at(-time.Second), till(-time.Second), at(21*time.Second)); !got.Equal(at(21 * time.Second)) {
		t.Errorf("after forget: first sight %v", got)
	}
}

// TestSightingsAdvanceOnlyTheHolderRemembered: a renewal seen on a watch
// moves the first sight of the holder remembered forward; another
// session's (a stale claim replayed), or an older renewal, changes nothing.
func TestSightingsAdvanceOnlyTheHolderRemembered(t *testing.T) {
	s := NewSightings()
	s.mark("k", "a", at(0), at(15*time.Second), at(time.Second))
	s.advance("k", "claimant", at(time.Hour), at(time.Hour), at(2*time.Second))
	s.advance("k", "a", at(0), at(15*time.Second), at(3*time.Second))
	s.advance("k", "a", at(-time.Second), at(14*time.Second), at(4*time.Second))
	if got := s.mark("k", "a", at(0), at(15*time.Second), at(5*time.Second)); !got.Equal(at(time.Second)) {
		t.Errorf("after others' and older renewals: first sight %v, want %v", got, at(time.Second))
	}
	s.advance("k", "a", at(5*time.Second), at(20*time.Second), at(6*time.Second))
	if got := s.mark("k", "a", at(5*time.Second), at(20*time.Second), at(7*time.Second)); !got.Equal(at(6 * time.Second)) {
		t.Errorf("after the holder's renewal on the watch: first sight %v, want %v", got, at(6*time.Second))
	}
	s.advance("never-read", "a", at(time.Hour), at(time.Hour), at(8*time.Second))
	if got := s.mark("never-read", "a", at(time.Hour), at(time.Hour), at(9*time.Second)); !got.Equal(at(9 * time.Second)) {
		t.Errorf("a lock never read: first sight %v, want the read's", got)
	}
}

// TestBounded: only a lock whose own readable record says LOCKED TILL is a
// lease after its renewal is taken over by this process's elapsed time
// alone while server time says it is live (review of 2a688a9, F2: a gate
// of a newer schema, judged from its spec, carries a long bound).
func TestBounded(t *testing.T) {
	const lease = 15 * time.Second
	own := func(till time.Duration) *Record {
		return &Record{Session: "a", RenewedAt: at(0), LockedTill: at(till), LeaseDuration: metav1.Duration{Duration: lease}}
	}
	cases := []struct {
		name string
		rec  *Record
		till time.Duration
		want bool
	}{
		{"own record, LOCKED TILL a lease after its renewal", own(lease), lease, true},
		{"no readable record (a newer schema, none): judged from the spec alone", nil, lease, false},
		{"another session's record", &Record{Session: "b", RenewedAt: at(0), LockedTill: at(lease), LeaseDuration: metav1.Duration{Duration: lease}}, lease, false},
		{"a gate's long bound for earlier versions", own(24 * time.Hour), 24 * time.Hour, false},
		{"a record without a lease duration", &Record{Session: "a", RenewedAt: at(0), LockedTill: at(lease)}, lease, false},
		{"the judgement's LOCKED TILL later than a lease after the renewal", own(lease), 2 * lease, false},
	}
	for _, c := range cases {
		if got := bounded(c.rec, "a", at(0), at(c.till), lease); got != c.want {
			t.Errorf("%s: bounded = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestStampedAhead: a bounded lock whose LOCKED TILL is further ahead of
// the upper bound of server time than its lease, the stamp's uncertainty
// and the margin could put it was stamped through a Date header that does
// not agree with this process's.
func TestStampedAhead(t *testing.T) {
	const (
		lease  = 5 * time.Second
		margin = 250 * time.Millisecond
	)
	now := servertime.Bounds{Earliest: at(10 * time.Second), Latest: at(11 * time.Second)}
	for _, tc := range []struct {
		name      string
		till      time.Time
		now       servertime.Bounds
		bounded   bool
		uncertain time.Duration
		want      bool
	}{
		{"stamped a lease after the upper bound: plausible", at(16 * time.Second), now, true, 0, false},
		{"a lease and the margin after it: plausible", at(16*time.Second + margin), now, true, 0, false},
		{"a millisecond more", at(16*time.Second + margin + time.Millisecond), now, true, 0, true},
		{"explained by the stamp's uncertainty", at(17 * time.Second), now, true, time.Second, false},
		{"30 s ahead", at(46 * time.Second), now, true, time.Second, true},
		{"not bounded (a gate's long bound)", at(46 * time.Second), now, false, 0, false},
		{"no server time", at(46 * time.Second), servertime.Bounds{}, true, 0, false},
		{"no LOCKED TILL", time.Time{}, now, true, 0, false},
	} {
		s := Sighting{Lease: lease, Bounded: tc.bounded, Uncertain: tc.uncertain}
		if got := stampedAhead(tc.till, tc.now, s, margin); got != tc.want {
			t.Errorf("%s: stampedAhead = %t, want %t", tc.name, got, tc.want)
		}
	}
}
