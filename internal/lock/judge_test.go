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
		overdue   time.Duration
		seenFor   time.Duration
		want      State
		confirmIn time.Duration
	}{
		{name: "free stays free", st: Free, want: Free},
		{name: "live stays live", st: Live, seenFor: time.Hour, want: Live},
		{name: "just expired, first seen now: a lease and the margin to go", st: Expired, overdue: time.Millisecond, want: Live, confirmIn: lease + margin},
		{name: "just expired, seen unchanged for half a lease", st: Expired, overdue: time.Second, seenFor: lease / 2, want: Live, confirmIn: lease/2 + margin},
		{name: "seen unchanged for a lease, margin not yet", st: Expired, overdue: time.Second, seenFor: lease, want: Live, confirmIn: margin},
		{name: "seen unchanged for a lease and the margin", st: Expired, overdue: time.Second, seenFor: lease + margin, want: Expired},
		{name: "10 minutes overdue (a Date shifted 10 minutes) is not enough", st: Expired, overdue: 10 * time.Minute, want: Live, confirmIn: lease + margin},
		{name: "just under the trust window", st: Expired, overdue: DateTrust - time.Millisecond, want: Live, confirmIn: lease + margin},
		{name: "overdue by the trust window: taken at once", st: Expired, overdue: DateTrust, want: Expired},
		{name: "a day overdue: taken at once", st: Expired, overdue: 24 * time.Hour, want: Expired},
		{name: "a clock that ran backwards counts as unseen", st: Expired, overdue: time.Second, seenFor: -time.Second, want: Live, confirmIn: lease + margin},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, in := Confirm(tc.st, tc.overdue, tc.seenFor, lease, margin)
			if st != tc.want || in != tc.confirmIn {
				t.Errorf("Confirm = %v, %v; want %v, %v", st, in, tc.want, tc.confirmIn)
			}
		})
	}
}

func TestSightingsKeepFirstSightOfLatestRenewal(t *testing.T) {
	s := NewSightings()
	first := s.mark("k", "a", at(0), at(1*time.Second))
	if !first.Equal(at(1 * time.Second)) {
		t.Fatalf("first sight = %v", first)
	}
	// The same renewal, or an older copy of it, seen again: unchanged.
	for _, r := range []time.Duration{0, -5 * time.Second} {
		if got := s.mark("k", "a", at(r), at(9*time.Second)); !got.Equal(at(1 * time.Second)) {
			t.Errorf("renewal at %v seen again: first sight moved to %v", r, got)
		}
	}
	// A later renewal: seen now.
	if got := s.mark("k", "a", at(5*time.Second), at(10*time.Second)); !got.Equal(at(10 * time.Second)) {
		t.Errorf("a later renewal: first sight %v, want %v", got, at(10*time.Second))
	}
	// Another holder, even with an older renewal: seen now.
	if got := s.mark("k", "b", at(time.Second), at(11*time.Second)); !got.Equal(at(11 * time.Second)) {
		t.Errorf("another holder: first sight %v", got)
	}
	// Another lock is remembered apart; a forgotten one starts anew.
	if got := s.mark("other", "b", at(time.Second), at(12*time.Second)); !got.Equal(at(12 * time.Second)) {
		t.Errorf("another lock: first sight %v", got)
	}
	s.forget("k")
	if got := s.mark("k", "b", at(time.Second), at(13*time.Second)); !got.Equal(at(13 * time.Second)) {
		t.Errorf("after forget: first sight %v", got)
	}
}
