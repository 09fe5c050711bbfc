package recovery

import (
	"cmp"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// Fuzz targets for the recovery decision (issue 14): the properties Decide's
// rules and docs/protocol.md promise, checked on any input. `make fuzz` runs
// each for $(FUZZ_TIME); the seeds run as plain unit tests.

var fuzzStatuses = []common.Status{
	common.StatusDeployed, common.StatusSuperseded, common.StatusFailed, common.StatusUninstalled, common.StatusUnknown, "",
	common.StatusPendingInstall, common.StatusPendingUpgrade, common.StatusPendingRollback, common.StatusUninstalling,
}

// fuzzHistory reads a history from five bytes per revision: its number,
// status, creation and last write (30 s steps around t0; 0: no write
// time), and the lock its record carries (none, the old holder's, a
// takeover naming the old holder abandoned, another holder's).
func fuzzHistory(b []byte) []helmx.Summary {
	var out []helmx.Summary
	for i := 0; i+4 < len(b) && len(out) < 12; i += 5 {
		s := rev(int(b[i]%16), fuzzStatuses[int(b[i+1])%len(fuzzStatuses)], t0.Add(time.Duration(int8(b[i+2]))*30*time.Second))
		if b[i+3] != 0 {
			s.LastWriteTime = t0.Add(time.Duration(int8(b[i+3])) * 30 * time.Second)
		}
		switch b[i+4] % 4 {
		case 0:
			s = stock(s)
		case 2:
			s = takenOver(s, "s-new")
		case 3:
			s = heldBy(s, "s-new")
		}
		s.ResourceVersion = fmt.Sprint(100 + i)
		out = append(out, s)
	}
	return out
}

// latestOf is the revision helm takes for the latest: the highest number,
// the first listed among equals (Decide sorts stably).
func latestOf(h []helmx.Summary) helmx.Summary {
	l := h[0]
	for _, s := range h[1:] {
		if s.Revision > l.Revision {
			l = s
		}
	}
	return l
}

func recovers(v Verdict) bool { return v == Recover || v == RecoverThenRollback }

// FuzzDecide: on any history, lock, server time and policy, Decide is pure
// and deterministic (and takes the history in any order); it proceeds
// exactly when the latest revision is not pending; it never recovers under
// a live lock, with autorecover off, or before the server clock has
// certainly passed the holder's LOCKED TILL plus the takeover margin (an
// attributed revision) or the legacy age (any other); it attributes a
// revision only to an expired holder whose lock the record carries, within
// its tenure; a recovery marks every older pending revision too and rolls
// back only to the newest deployed one; a recovery stays a recovery as
// server time passes, only the earliest bound counts, and a Blocked
// verdict's RetryAfter is long enough; a shorter legacy age never blocks
// what a longer one recovers.
func FuzzDecide(f *testing.F) {
	// rev(1, deployed), rev(2, pending-upgrade) by the old holder, lock
	// expired naming revision 2: Recover.
	f.Add([]byte{1, 0, 0, 0, 1, 2, 7, 254, 0, 1}, byte(2), byte(0), byte(1), int8(2), int32(-600000), true, int32(0), true, int32(1000), uint16(200), byte(0), true, int32(900000), false, false, int32(0))
	// Stock helm's young pending-upgrade: Blocked, retry later.
	f.Add([]byte{1, 0, 0, 0, 1, 2, 7, 254, 0, 0}, byte(0), byte(0), byte(1), int8(0), int32(0), false, int32(0), false, int32(0), uint16(200), byte(0), true, int32(900000), true, false, int32(600000))
	// A live lock over an old pending-install.
	f.Add([]byte{1, 6, 128, 0, 0}, byte(3), byte(1), byte(0), int8(1), int32(0), false, int32(10000), true, int32(0), uint16(0), byte(0), true, int32(1), true, true, int32(3600000))
	// A person's early unlock: the holder may still write.
	f.Add([]byte{3, 1, 0, 0, 1, 4, 0, 0, 0, 1, 5, 7, 250, 0, 2}, byte(2), byte(0), byte(1), int8(5), int32(-600000), true, int32(5000), true, int32(0), uint16(200), byte(0), true, int32(900000), true, false, int32(5251))
	// An interrupted uninstall edited in place, history out of order,
	// unknown and inconsistent server time.
	f.Add([]byte{4, 9, 128, 254, 1, 2, 7, 0, 0, 0, 3, 1, 0, 0, 0}, byte(2), byte(0), byte(3), int8(0), int32(-600000), true, int32(0), true, int32(0), uint16(0), byte(1), true, int32(60000), false, false, int32(0))
	f.Add([]byte{}, byte(0), byte(0), byte(0), int8(0), int32(0), false, int32(0), false, int32(0), uint16(0), byte(2), false, int32(0), false, false, int32(0))
	// A holder known to have stopped: recovered at once.
	f.Add([]byte{3, 1, 0, 0, 1, 4, 0, 0, 0, 1, 5, 7, 250, 0, 2}, byte(2), byte(0x80), byte(1), int8(5), int32(-600000), true, int32(5000), true, int32(0), uint16(200), byte(0), true, int32(900000), true, false, int32(5251))
	f.Add([]byte{3, 1, 0, 0, 1, 4, 0, 0, 0, 1, 5, 7, 250, 0, 2}, byte(2), byte(0x80), byte(1), int8(5), int32(-600000), true, int32(5000), true, int32(5300), uint16(200), byte(0), true, int32(900000), true, false, int32(0))
	ops := []string{OpInstall, OpUpgrade, OpRollback, OpUninstall, string(lock.OpRecover), ""}
	sessions := []string{"s-old", "s-new", ""}
	f.Fuzz(func(t *testing.T, hist []byte, lockState, lockSession, lockOp byte, lockRev int8, acquiredMs int32, hasAcquired bool, tillMs int32, hasTill bool,
		nowMs int32, widthMs uint16, nowMode byte, autorecover bool, legacyAfterMs int32, rollbackStrategy, named bool, laterMs int32,
	) {
		in := Input{
			History: fuzzHistory(hist),
			Lock: LockInfo{
				State: LockState(lockState % 4), Session: sessions[int(lockSession&0x7f)%len(sessions)], Who: "alice@ci-7",
				Operation: ops[int(lockOp)%len(ops)], Revision: int(lockRev % 16),
			},
			Policy: Policy{Autorecover: autorecover, LegacyAfter: time.Duration(legacyAfterMs) * time.Millisecond},
		}
		if lockSession&0x80 != 0 {
			// A holder known to have stopped (its taker confirmed its
			// expiry).
			in.Lock.Stopped = true
		}
		if hasAcquired {
			in.Lock.AcquiredAt = t0.Add(time.Duration(acquiredMs) * time.Millisecond)
		}
		if hasTill {
			in.Lock.LockedTill = t0.Add(time.Duration(tillMs) * time.Millisecond)
		}
		earliest := t0.Add(time.Duration(nowMs) * time.Millisecond)
		switch nowMode % 3 {
		case 0:
			in.Now = ServerTime{Earliest: earliest, Latest: earliest.Add(time.Duration(widthMs) * time.Millisecond)}
		case 1:
			in.Now = ServerTime{Earliest: earliest, Latest: earliest.Add(-time.Duration(widthMs+1) * time.Millisecond)} // inconsistent: unknown
		}
		if rollbackStrategy {
			in.Policy.Strategy = StrategyRollback
		}
		if named {
			in.Release, in.Namespace, in.Policy.Hints = "web", "shop", CLIHints
		}
		before := slices.Clone(in.History)
		d := Decide(in)
		if d.LookForWork {
			// Only a legacy revision old enough to recover asks; the
			// caller looks (here: no hook found) and decides again.
			if d.Verdict != Blocked || d.Target.Lock != nil || d.RetryAfter != 0 || !in.Policy.Autorecover || !in.Now.known() ||
				in.Now.Earliest.Before(d.Target.PendingSince.Add(TimestampResolution+in.Policy.LegacyAfter)) {
				t.Fatalf("asked to look for work with %+v", d)
			}
			in.Work = Work{Looked: true}
			d = Decide(in)
		}

		// Pure and deterministic, over a history in any order.
		if !slices.Equal(before, in.History) {
			t.Fatal("Decide changed its input")
		}
		if again := Decide(in); !reflect.DeepEqual(again, d) {
			t.Fatalf("Decide is not deterministic:\n %+v\n %+v", d, again)
		}
		if unique(in.History) {
			rev := in
			rev.History = slices.Clone(in.History)
			slices.Reverse(rev.History)
			if other := Decide(rev); !reflect.DeepEqual(other, d) {
				t.Fatalf("Decide depends on the order of the history:\n %+v\n %+v", d, other)
			}
		}
		if d.Reason == "" {
			t.Fatal("no reason")
		}
		if len(in.History) == 0 {
			if d.Verdict != NoRelease {
				t.Fatalf("no history: %s", d.Verdict)
			}
			return
		}
		latest := latestOf(in.History)
		if want := fmt.Sprintf("release %q in namespace %q", cmp.Or(in.Release, latest.Name), cmp.Or(in.Namespace, latest.Namespace)); !strings.HasPrefix(d.Reason, want) {
			t.Fatalf("reason %q does not start by naming the release: %s", d.Reason, want)
		}
		if !named && strings.Contains(d.Reason, "--") {
			t.Fatalf("a library caller's reason names a CLI flag: %s", d.Reason)
		}
		if (d.Verdict == Proceed) == IsPending(latest.Status) || d.Verdict == NoRelease {
			t.Fatalf("latest revision %d is %q: verdict %s", latest.Revision, latest.Status, d.Verdict)
		}
		if d.Verdict == Proceed {
			if d.Target.Release.Revision != 0 || len(d.Stray) != 0 || d.Done != "" {
				t.Fatalf("Proceed with a target %+v", d)
			}
			return
		}
		if !reflect.DeepEqual(d.Target.Release, latest) {
			t.Fatalf("target %d, want the latest revision %d", d.Target.Release.Revision, latest.Revision)
		}

		// Attribution (rule 4) and the protection of a live holder (rule 3).
		if a := d.Target.Lock; a != nil {
			l := in.Lock
			since := d.Target.PendingSince
			namesIt := (l.Revision > 0 && l.Revision == latest.Revision) || (l.Revision == 0 && operationWrites(l.Operation, latest.Status))
			switch {
			case l.State != LockExpired || l.LockedTill.IsZero():
				t.Fatalf("revision attributed to a %s lock (LOCKED TILL %s)", l.State, l.LockedTill)
			case !latest.CarriesLockOf(l.Session):
				t.Fatalf("revision attributed to session %q, whose lock its record does not carry (%q, %q)", l.Session, latest.LockSession, latest.LockAbandoned)
			case l.Revision == 0 && (since.IsZero() || since.After(l.LockedTill)):
				t.Fatalf("revision written at %s attributed to a lock that ended at %s and named no revision", since, l.LockedTill)
			case !l.AcquiredAt.IsZero() && !since.Add(TimestampResolution).After(l.AcquiredAt):
				t.Fatalf("revision written at %s attributed to a lock taken at %s", since, l.AcquiredAt)
			case !namesIt:
				t.Fatalf("revision %d (%s) attributed to a holder of revision %d, operation %q", latest.Revision, latest.Status, l.Revision, l.Operation)
			case !reflect.DeepEqual(*a, l):
				t.Fatalf("attributed to %+v, not the lock %+v", *a, l)
			}
		}
		if in.Lock.State == LockLive && (d.Verdict != Blocked || d.RetryAfter != 0 || d.HolderMayWrite) {
			t.Fatalf("a pending revision under a live lock: %s, retry after %s", d.Verdict, d.RetryAfter)
		}

		switch d.Verdict {
		case Blocked:
			if len(d.Stray) != 0 || d.RollbackTo != 0 || d.Done != "" || d.DoneMarked != "" || d.RetryAfter < 0 {
				t.Fatalf("Blocked with %+v", d)
			}
			if d.HolderMayWrite && d.Target.Lock == nil {
				t.Fatal("HolderMayWrite without a holder")
			}
		case Recover, RecoverThenRollback:
			checkRecovery(t, in, d, latest)
		default:
			t.Fatalf("verdict %s", d.Verdict)
		}

		// Time: only the earliest bound counts, a recovery stays one, and
		// RetryAfter is long enough.
		if in.Now.known() {
			wide := in
			wide.Now.Latest = in.Now.Latest.Add(time.Hour)
			if other := Decide(wide); other.Verdict != d.Verdict || other.RetryAfter != d.RetryAfter {
				t.Fatalf("the latest bound changed the verdict: %s, then %s", d.Verdict, other.Verdict)
			}
		}
		shift := func(by time.Duration) Input {
			out := in
			out.Work = Work{Looked: true} // as the caller would, when asked
			if in.Now.known() {
				out.Now = ServerTime{Earliest: in.Now.Earliest.Add(by), Latest: in.Now.Latest.Add(by)}
			}
			return out
		}
		if recovers(d.Verdict) {
			later := Decide(shift(time.Duration(max(laterMs, 0)) * time.Millisecond))
			if later.Verdict != d.Verdict || later.Target.Release.Revision != d.Target.Release.Revision || later.RollbackTo != d.RollbackTo || len(later.Stray) != len(d.Stray) {
				t.Fatalf("%s at %s, %s %dms later: %s", d.Verdict, in.Now.Earliest, later.Verdict, max(laterMs, 0), later.Reason)
			}
		}
		if d.Verdict == Blocked && d.RetryAfter > 0 {
			then := Decide(shift(d.RetryAfter))
			switch {
			case then.Verdict == Blocked && then.HolderMayWrite:
				t.Fatalf("Blocked, retry after %s; then still blocked on the holder: %s", d.RetryAfter, then.Reason)
			case d.Target.Lock == nil && !recovers(then.Verdict):
				t.Fatalf("a legacy revision blocked with retry after %s is still %s then: %s", d.RetryAfter, then.Verdict, then.Reason)
			}
		}

		// A shorter legacy age never blocks what a longer one recovers.
		if recovers(d.Verdict) && d.Target.Lock == nil {
			shorter := in
			shorter.Policy.LegacyAfter = max(in.Policy.LegacyAfter/2, time.Nanosecond)
			if other := Decide(shorter); other.Verdict != d.Verdict {
				t.Fatalf("recovered after %s, %s after %s", in.Policy.LegacyAfter, other.Verdict, shorter.Policy.LegacyAfter)
			}
		}
	})
}

// checkRecovery checks a Recover or RecoverThenRollback verdict.
func checkRecovery(t *testing.T, in Input, d Decision, latest helmx.Summary) {
	t.Helper()
	// Server time is needed to date a legacy revision, or to wait out the
	// lock a person released early; a lock taken over after its expiry
	// has no writer left, whatever the clock says.
	stopped := d.Target.Lock != nil && d.Target.Lock.Stopped
	if !in.Policy.Autorecover || (!in.Now.known() && !stopped) || in.Lock.State == LockLive {
		t.Fatalf("%s with autorecover %v, server time known %v, lock %s", d.Verdict, in.Policy.Autorecover, in.Now.known(), in.Lock.State)
	}
	if d.Target.Lock != nil {
		if !stopped && !in.Now.Earliest.After(d.Target.Lock.LockedTill.Add(lock.TakeoverMargin)) {
			t.Fatalf("recovered at %s, not certainly past the LOCKED TILL %s + margin of a holder not known to have stopped", in.Now.Earliest, d.Target.Lock.LockedTill)
		}
	} else {
		since := d.Target.PendingSince
		if in.Policy.LegacyAfter <= 0 || since.IsZero() || in.Now.Earliest.Before(since.Add(TimestampResolution+in.Policy.LegacyAfter)) {
			t.Fatalf("legacy revision pending since %s recovered at %s with legacy age %s", since, in.Now.Earliest, in.Policy.LegacyAfter)
		}
	}
	if d.Done == "" || d.DoneMarked == "" || d.RetryAfter != 0 || d.HolderMayWrite {
		t.Fatalf("%s with %+v", d.Verdict, d)
	}

	// Every older pending revision, newest first; the latest is the target.
	sorted := slices.Clone(in.History)
	slices.SortStableFunc(sorted, func(a, b helmx.Summary) int { return cmp.Compare(b.Revision, a.Revision) })
	var want []helmx.Summary
	for _, s := range sorted[1:] {
		if IsPending(s.Status) {
			want = append(want, s)
		}
	}
	if len(d.Stray) != len(want) {
		t.Fatalf("%d stray pending revisions, want %d", len(d.Stray), len(want))
	}
	for i, s := range d.Stray {
		if !reflect.DeepEqual(s.Release, want[i]) {
			t.Fatalf("stray %d is revision %d, want %d", i, s.Release.Revision, want[i].Revision)
		}
	}

	// Rollback only to the newest deployed revision before the target.
	deployed := slices.IndexFunc(sorted[1:], func(s helmx.Summary) bool { return s.Status == common.StatusDeployed })
	switch {
	case in.Policy.Strategy == StrategyRollback && deployed >= 0:
		if d.Verdict != RecoverThenRollback || d.RollbackTo != sorted[1+deployed].Revision || d.RollbackTo > latest.Revision {
			t.Fatalf("%s to %d, want a rollback to %d", d.Verdict, d.RollbackTo, sorted[1+deployed].Revision)
		}
	case d.Verdict != Recover || d.RollbackTo != 0:
		t.Fatalf("%s to %d with strategy %q and no deployed revision before", d.Verdict, d.RollbackTo, in.Policy.Strategy)
	}
}

func unique(h []helmx.Summary) bool {
	seen := map[int]bool{}
	for _, s := range h {
		if seen[s.Revision] {
			return false
		}
		seen[s.Revision] = true
	}
	return true
}

// FuzzLockInfo: the one mapping from what a client found of the lock onto
// Decide's input. No record is LockNone; a record that names its revision
// drops AcquiredAt (FromRecord's attribution rule); a client that took the
// lock never sees it live; an observer sees it live exactly while someone
// holds it unexpired, and knows a holder whose record is unreadable or of
// another session by its session and LOCKED TILL alone; a released record
// that names an abandoned holder stands for that holder, expired.
func FuzzLockInfo(f *testing.F) {
	f.Add(`{"schema":1,"session":"s-old","operation":"upgrade","revision":2,"who":"alice@ci-7","acquiredAt":"2026-03-01T11:50:00Z","lockedTill":"2026-03-01T12:00:00Z"}`, byte(2), "s-old", true)
	f.Add(`{"schema":1,"session":"s-new","releasedAt":"2026-03-01T12:01:00Z","abandoned":{"schema":1,"session":"s-old","operation":"upgrade","lockedTill":"2026-03-01T12:00:00Z"}}`, byte(0), "", true)
	f.Add(`{"schema":1,"session":"s-new","abandoned":{"schema":1,"session":"s-old","revision":3}}`, byte(2), "s-new", false)
	f.Add(`{"schema":2,"session":"s"}`, byte(1), "s", true)
	f.Add(`nope`, byte(1), "unreadable-lock-record", true)
	f.Fuzz(func(t *testing.T, recJSON string, state byte, holder string, exists bool) {
		rec, recErr := lock.DecodeRecord(recJSON)
		st := lock.State(int(state) % 3)

		if got := FromRecord(nil, LockExpired); got != (LockInfo{State: LockNone}) {
			t.Fatalf("FromRecord(nil) = %+v", got)
		}
		if rec != nil {
			for _, s := range []LockState{LockReleased, LockExpired, LockLive} {
				info := FromRecord(rec, s)
				wantAcquired := rec.AcquiredAt
				if rec.Revision > 0 {
					wantAcquired = time.Time{}
				}
				if info.State != s || info.Session != rec.Session || info.Who != rec.Who || info.Operation != string(rec.Operation) ||
					info.Revision != rec.Revision || !info.LockedTill.Equal(rec.LockedTill) || !info.AcquiredAt.Equal(wantAcquired) {
					t.Fatalf("FromRecord(%s, %s) = %+v", recJSON, s, info)
				}
			}
		}

		prev := PreviousLock(rec, st)
		found, foundState := lock.Found(rec, st)
		switch {
		case prev.State == LockLive:
			t.Fatal("a client that took the lock sees it live")
		case (rec == nil) != (prev.State == LockNone):
			t.Fatalf("PreviousLock(%v) = %s", rec != nil, prev.State)
		case rec != nil && (prev.Session != found.Session || (prev.State == LockExpired) != (foundState == lock.Expired)):
			t.Fatalf("PreviousLock stands for %q (%s), lock.Found for %q (%s)", prev.Session, prev.State, found.Session, foundState)
		}

		obs := &lock.Status{Exists: exists, State: st, Record: rec, RecordErr: recErr, HolderIdentity: holder, LockedTill: t0}
		if !exists {
			obs.State, obs.HolderIdentity = lock.Free, ""
		}
		info := ObservedLock(obs)
		readable := rec != nil && recErr == nil
		switch {
		case !exists:
			if info != (LockInfo{State: LockNone}) {
				t.Fatalf("no lock observed as %+v", info)
			}
		case holder == "":
			switch {
			case info.State == LockLive:
				t.Fatal("a released lock is observed live")
			case (info.State == LockNone) != !readable:
				t.Fatalf("a released lock with a readable record %v observed as %s", readable, info.State)
			case readable && rec.Abandoned != nil && (info.State != LockExpired || info.Session != rec.Abandoned.Session):
				t.Fatalf("a released record naming abandoned holder %q observed as %s of %q", rec.Abandoned.Session, info.State, info.Session)
			}
		default:
			if wantLive := st != lock.Expired; (info.State == LockLive) != wantLive || (info.State != LockLive && info.State != LockExpired) {
				t.Fatalf("a held lock judged %s observed %s", st, info.State)
			}
			if info.Session != holder || !info.LockedTill.Equal(t0) {
				t.Fatalf("observed holder %q until %s, want %q until %s", info.Session, info.LockedTill, holder, t0)
			}
			if (!readable || rec.Session != holder) && info != (LockInfo{State: info.State, Session: holder, LockedTill: t0}) {
				t.Fatalf("a holder known only by its session is described by a record not its own: %+v", info)
			}
		}
	})
}
