package recovery

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"helm.sh/helm/v4/pkg/release/common"
)

// t0 is the server time the lock in these cases expired at.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const (
	pInstall   = common.StatusPendingInstall
	pUpgrade   = common.StatusPendingUpgrade
	pRollback  = common.StatusPendingRollback
	deployed   = common.StatusDeployed
	superseded = common.StatusSuperseded
	failed     = common.StatusFailed
	uninstalng = common.StatusUninstalling
)

// rev is a stored revision created at the given server time, by the holder
// of session s-old (its record carries that lock, as a fenced create
// writes it; see stock and takenOver for other records).
func rev(n int, st common.Status, created time.Time) helmx.Summary {
	return helmx.Summary{
		LockSession:       "s-old",
		RecordName:        helmx.ReleaseSecretName("web", n),
		RecordNamespace:   "shop",
		Name:              "web",
		Namespace:         "shop",
		Revision:          n,
		Status:            st,
		CreationTimestamp: created,
		ResourceVersion:   "100",
	}
}

func history(revs ...helmx.Summary) []helmx.Summary { return revs }

// stock is s written by stock helm: its record carries no lock.
func stock(s helmx.Summary) helmx.Summary {
	s.LockSession, s.LockAbandoned = "", ""
	return s
}

// heldBy is s whose record carries the lock of session by alone.
func heldBy(s helmx.Summary, by string) helmx.Summary {
	s.LockSession, s.LockAbandoned = by, ""
	return s
}

// takenOver is s after session by took the lock over from s-old: its record
// names by as holder and s-old as the holder it abandoned.
func takenOver(s helmx.Summary, by string) helmx.Summary {
	s.LockSession, s.LockAbandoned = by, "s-old"
	return s
}

func expired(revision int, op string) LockInfo {
	return LockInfo{State: LockExpired, Session: "s-old", Who: "alice@ci-7", Operation: op, Revision: revision, AcquiredAt: t0.Add(-10*time.Minute + 300*time.Millisecond), LockedTill: t0}
}

func at(t time.Time) ServerTime {
	return ServerTime{Earliest: t, Latest: t.Add(200 * time.Millisecond)}
}

// looked is the caller's lookup of a pending revision's hooks that found
// none.
var looked = Work{Looked: true}

var (
	on       = Policy{Autorecover: true, LegacyAfter: 15 * time.Minute, Hints: CLIHints}
	rollback = Policy{Autorecover: true, LegacyAfter: 15 * time.Minute, Strategy: StrategyRollback, Hints: CLIHints}
)

func TestDecide(t *testing.T) {
	legacyReady := t0.Add(-time.Hour).Add(time.Second + 15*time.Minute) // exact boundary for a revision created at t0-1h

	cases := []struct {
		name string
		in   Input

		verdict    Verdict
		target     int  // Target.Release.Revision
		ours       bool // Target attributed to the lock record
		stray      []int
		rollbackTo int
		retryAfter time.Duration
		reasonHas  []string
	}{
		{
			name:      "no history",
			in:        Input{Release: "web", Namespace: "shop", Policy: on},
			verdict:   NoRelease,
			reasonHas: []string{`release "web" in namespace "shop" has no stored revision`},
		},
		{
			name:      "latest deployed",
			in:        Input{History: history(rev(1, superseded, t0), rev(2, deployed, t0)), Now: at(t0), Policy: on},
			verdict:   Proceed,
			reasonHas: []string{`latest revision 2 is deployed; nothing is pending`},
		},
		{
			name:    "latest failed, older stray pending is left alone",
			in:      Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0), rev(3, failed, t0)), Now: at(t0.Add(time.Hour)), Policy: on},
			verdict: Proceed,
		},
		{
			name:      "expired holder finished its revision before dying",
			in:        Input{History: history(rev(1, superseded, t0), rev(2, deployed, t0.Add(-time.Minute))), Lock: expired(2, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on},
			verdict:   Proceed,
			reasonHas: []string{"finished writing it"},
		},
		{
			name:      "live lock and nothing pending",
			in:        Input{History: history(rev(1, deployed, t0)), Lock: LockInfo{State: LockLive, LockedTill: t0}, Now: at(t0), Policy: on},
			verdict:   Proceed,
			reasonHas: []string{"nothing is pending"},
		},

		// Rule 4: written under our expired lock.
		{
			name:      "expired lock names the pending revision",
			in:        Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Minute))), Lock: expired(2, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on},
			verdict:   Recover,
			target:    2,
			ours:      true,
			reasonHas: []string{`revision 2 is pending-upgrade, written by alice@ci-7 (session s-old, operation upgrade) whose lock expired at 2026-03-01T12:00:00Z; it is abandoned and will be marked failed`},
		},
		{
			name:      "record taken over: it names the expired holder as abandoned",
			in:        Input{History: history(rev(1, deployed, t0), takenOver(rev(2, pUpgrade, t0.Add(-time.Minute)), "s-new")), Lock: expired(2, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on},
			verdict:   Recover,
			target:    2,
			ours:      true,
			reasonHas: []string{`written by alice@ci-7 (session s-old, operation upgrade)`},
		},
		{
			// Stock helm created revision 2 between the holder's stamp of
			// revision 2 (on the Lease, or on revision 1's record) and its own
			// create; stock helm may still be running it.
			name:       "stock helm's revision under the number the expired lock names is legacy",
			in:         Input{History: history(rev(1, deployed, t0), stock(rev(2, pUpgrade, t0.Add(-time.Minute)))), Lock: expired(2, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on},
			verdict:    Blocked,
			target:     2,
			retryAfter: 14 * time.Minute,
			reasonHas:  []string{"with no lock record covering it (stock helm may have written it)"},
		},
		{
			name:       "a record another holder took without naming the expired one is legacy",
			in:         Input{History: history(rev(1, deployed, t0), heldBy(rev(2, pUpgrade, t0.Add(-time.Minute)), "s-new")), Lock: expired(2, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on},
			verdict:    Blocked,
			target:     2,
			retryAfter: 14 * time.Minute,
		},
		{
			name:    "expired lock with unknown revision, upgrade wrote pending-upgrade",
			in:      Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Minute))), Lock: expired(0, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on},
			verdict: Recover,
			target:  2,
			ours:    true,
		},
		{
			name:    "expired lock with unknown revision, upgrade --install wrote pending-install",
			in:      Input{History: history(rev(1, pInstall, t0.Add(-time.Minute))), Lock: expired(0, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on},
			verdict: Recover,
			target:  1,
			ours:    true,
		},
		{
			name:    "expired lock with unknown revision, install wrote pending-install",
			in:      Input{History: history(rev(1, pInstall, t0.Add(-time.Minute))), Lock: expired(0, OpInstall), Now: at(t0.Add(time.Second)), Policy: on},
			verdict: Recover,
			target:  1,
			ours:    true,
		},
		{
			name:    "expired rollback lock, pending-rollback",
			in:      Input{History: history(rev(1, deployed, t0), rev(2, superseded, t0), rev(3, pRollback, t0.Add(-time.Minute))), Lock: expired(3, OpRollback), Now: at(t0.Add(time.Second)), Policy: on},
			verdict: Recover,
			target:  3,
			ours:    true,
		},
		{
			name: "expired uninstall lock, uninstalling edited in place long after creation",
			in: Input{
				History: history(withWrite(rev(4, uninstalng, t0.Add(-48*time.Hour)), t0.Add(-time.Minute))),
				Lock:    expired(0, OpUninstall), Now: at(t0.Add(time.Second)), Policy: on,
			},
			verdict: Recover,
			target:  4,
			ours:    true,
		},
		{
			name:       "a released lock attributes nothing: its pending revision is legacy",
			in:         Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Minute))), Lock: LockInfo{State: LockReleased, Who: "bob", Operation: OpUpgrade, Revision: 2, AcquiredAt: t0.Add(-2 * time.Minute), LockedTill: t0}, Now: at(t0), Policy: on},
			verdict:    Blocked,
			target:     2,
			retryAfter: 14*time.Minute + time.Second,
			reasonHas:  []string{"with no lock record covering it"},
		},
		{
			name:    "an old released record does not claim a later stock helm upgrade",
			in:      Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(24*time.Hour))), Lock: LockInfo{State: LockReleased, Operation: OpUpgrade, LockedTill: t0}, Now: at(t0.Add(24*time.Hour + time.Minute)), Policy: on},
			verdict: Blocked, target: 2, retryAfter: 14*time.Minute + time.Second,
		},
		{
			name:    "expired record without LockedTill attributes nothing",
			in:      Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Minute))), Lock: LockInfo{State: LockExpired, Operation: OpUpgrade, Revision: 2}, Now: at(t0), Policy: on},
			verdict: Blocked, target: 2, retryAfter: 14*time.Minute + time.Second,
		},
		{
			name:    "pending revision written before the lock was acquired is not ours",
			in:      Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-10*time.Minute-time.Second))), Lock: expired(0, OpUpgrade), Now: at(t0), Policy: on},
			verdict: Blocked, target: 2, retryAfter: 5 * time.Minute,
		},
		{
			name:    "pending revision stamped in the second the lock was acquired is ours",
			in:      Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-10*time.Minute))), Lock: expired(0, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on},
			verdict: Recover, target: 2, ours: true,
		},
		{
			name:    "pending revision written exactly at LockedTill is ours",
			in:      Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0)), Lock: expired(2, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on},
			verdict: Recover,
			target:  2,
			ours:    true,
		},
		{
			// Its holder named it, and its record carries the holder's
			// lock: the holder's LOCKED TILL, stamped through Date headers
			// running behind the API server's clock, proves nothing.
			name:    "pending revision named by the lock, written after LockedTill, is ours",
			in:      Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(10*time.Minute))), Lock: expired(2, OpUpgrade), Now: at(t0.Add(11 * time.Minute)), Policy: on},
			verdict: Recover,
			target:  2,
			ours:    true,
		},
		{
			name:       "pending revision written after LockedTill of a lock that named none is not ours",
			in:         Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(time.Second))), Lock: expired(0, OpUpgrade), Now: at(t0.Add(2 * time.Second)), Policy: on},
			verdict:    Blocked,
			target:     2,
			retryAfter: 15 * time.Minute,
			reasonHas:  []string{"with no lock record covering it"},
		},

		// An upgrade's --rollback-on-failure writes a second revision under
		// the lock taken for the first, which the lock may still name
		// (every copy the holder renewed before it learnt of the second):
		// the revision's own record names itself under the holder's lock.
		{
			name: "rollback-on-failure: the rollback's record names itself under the holder's lock",
			in: Input{
				History: history(rev(1, superseded, t0), names(rev(2, failed, t0.Add(-2*time.Minute))), names(rev(3, pRollback, t0.Add(-time.Minute)))),
				Lock:    expired(2, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on,
			},
			verdict:   Recover,
			target:    3,
			ours:      true,
			reasonHas: []string{`revision 3 is pending-rollback, written by alice@ci-7 (session s-old, operation upgrade) whose lock expired at`},
		},
		{
			name: "rollback-on-failure with legacy recovery off",
			in: Input{
				History: history(rev(1, superseded, t0), names(rev(2, failed, t0.Add(-2*time.Minute))), names(rev(3, pRollback, t0.Add(-time.Minute)))),
				Lock:    expired(2, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: Policy{Autorecover: true, Hints: CLIHints},
			},
			verdict: Recover,
			target:  3,
			ours:    true,
		},
		{
			name: "rollback-on-failure: the upgrade's revision still pending, the lock naming the rollback's",
			in: Input{
				History: history(rev(1, deployed, t0), names(rev(2, pUpgrade, t0.Add(-2*time.Minute)))),
				Lock:    expired(3, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on,
			},
			verdict: Recover,
			target:  2,
			ours:    true,
		},
		{
			// Named by itself: like a revision the lock names, its write
			// time is not compared with the holder's stamps.
			name: "a record naming itself under the holder's lock, written after its LockedTill, is ours",
			in: Input{
				History: history(rev(1, deployed, t0), names(rev(2, failed, t0)), names(rev(3, pRollback, t0.Add(10*time.Minute)))),
				Lock:    expired(2, OpUpgrade), Now: at(t0.Add(11 * time.Minute)), Policy: on,
			},
			verdict: Recover,
			target:  3,
			ours:    true,
		},
		{
			name: "a record naming itself under another session's lock is not the expired holder's",
			in: Input{
				History: history(rev(1, deployed, t0), names(rev(2, failed, t0)), names(heldBy(rev(3, pRollback, t0.Add(-time.Minute)), "s-new"))),
				Lock:    expired(2, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on,
			},
			verdict:    Blocked,
			target:     3,
			retryAfter: 14 * time.Minute,
		},
		{
			// The taker's own lock (s-new) names the revision it wrote: the
			// holder it names abandoned did not write it.
			name: "a record naming itself under its taker's lock is not the abandoned holder's",
			in: Input{
				History: history(rev(1, deployed, t0), names(rev(2, failed, t0)), names(takenOver(rev(3, pRollback, t0.Add(-time.Minute)), "s-new"))),
				Lock:    expired(2, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on,
			},
			verdict:    Blocked,
			target:     3,
			retryAfter: 14 * time.Minute,
		},
		{
			name: "a record naming another revision under the holder's lock is not named by itself",
			in: Input{
				History: history(rev(1, deployed, t0), names(rev(2, failed, t0)), withLockRevision(rev(3, pRollback, t0.Add(-time.Minute)), 2)),
				Lock:    expired(2, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on,
			},
			verdict:    Blocked,
			target:     3,
			retryAfter: 14 * time.Minute,
		},
		{
			name: "stock helm's rollback after the holder's revision is legacy",
			in: Input{
				History: history(rev(1, deployed, t0), names(rev(2, failed, t0)), stock(rev(3, pRollback, t0.Add(-time.Minute)))),
				Lock:    expired(2, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on,
			},
			verdict:    Blocked,
			target:     3,
			retryAfter: 14 * time.Minute,
			reasonHas:  []string{"with no lock record covering it (stock helm may have written it)"},
		},
		{
			name: "a released lock attributes nothing, even a record naming itself under it",
			in: Input{
				History: history(rev(1, deployed, t0), names(rev(2, pUpgrade, t0.Add(-time.Minute)))),
				Lock:    LockInfo{State: LockReleased, Session: "s-old", Operation: OpUpgrade, Revision: 1, LockedTill: t0}, Now: at(t0), Policy: on,
			},
			verdict:    Blocked,
			target:     2,
			retryAfter: 14*time.Minute + time.Second,
		},

		// Rule 4 does not hold: legacy.
		{
			name:       "pending revision newer than the expired lock's revision is legacy",
			in:         Input{History: history(rev(1, deployed, t0), rev(2, failed, t0), rev(3, pUpgrade, t0.Add(-time.Minute))), Lock: expired(2, OpUpgrade), Now: at(t0), Policy: on},
			verdict:    Blocked,
			target:     3,
			retryAfter: 14*time.Minute + time.Second,
		},
		{
			name:    "pending revision older than the expired lock's revision is legacy",
			in:      Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Hour))), Lock: expired(3, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on, Work: looked},
			verdict: Recover,
			target:  2,
		},
		{
			name:       "unknown revision and an operation that does not write this status",
			in:         Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Minute))), Lock: expired(0, OpRollback), Now: at(t0), Policy: on},
			verdict:    Blocked,
			target:     2,
			retryAfter: 14*time.Minute + time.Second,
		},
		{
			name:       "install lock does not own pending-upgrade",
			in:         Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Minute))), Lock: expired(0, OpInstall), Now: at(t0), Policy: on},
			verdict:    Blocked,
			target:     2,
			retryAfter: 14*time.Minute + time.Second,
		},

		// Rule 3.
		{
			name:      "pending under a live lock",
			in:        Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Hour))), Lock: LockInfo{State: LockLive, Session: "s-live", Who: "carol@laptop", Operation: OpUpgrade, Revision: 2, LockedTill: t0.Add(10 * time.Second)}, Now: at(t0), Policy: on},
			verdict:   Blocked,
			target:    2,
			reasonHas: []string{`revision 2 is pending-upgrade under a live lock held by carol@laptop (session s-live, operation upgrade) until 2026-03-01T12:00:10Z; it is not abandoned`},
		},
		{
			name:    "legacy pending under a live lock is protected however old",
			in:      Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-48*time.Hour))), Lock: LockInfo{State: LockLive, LockedTill: t0.Add(time.Second)}, Now: at(t0), Policy: on},
			verdict: Blocked,
			target:  2,
		},

		// Autorecover off.
		{
			name:      "autorecover off, ours",
			in:        Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Minute))), Lock: expired(2, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: Policy{LegacyAfter: time.Minute, Hints: CLIHints}},
			verdict:   Blocked,
			target:    2,
			ours:      true,
			reasonHas: []string{"autorecover is off (--autorecover=false)"},
		},
		{
			name:      "autorecover off, old legacy",
			in:        Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-48*time.Hour))), Now: at(t0), Policy: Policy{LegacyAfter: time.Minute, Hints: CLIHints}},
			verdict:   Blocked,
			target:    2,
			reasonHas: []string{"autorecover is off"},
		},

		// Rule 5: legacy age, in server time.
		{
			name:      "legacy, LegacyAfter 0 means never",
			in:        Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-48*time.Hour))), Now: at(t0), Policy: Policy{Autorecover: true, Hints: CLIHints}},
			verdict:   Blocked,
			target:    2,
			reasonHas: []string{"--recover-legacy-after is 0, so it is never recovered automatically"},
		},
		{
			name:    "legacy, negative LegacyAfter means never",
			in:      Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-48*time.Hour))), Now: at(t0), Policy: Policy{Autorecover: true, LegacyAfter: -time.Second}},
			verdict: Blocked,
			target:  2,
		},
		{
			name:    "legacy, exactly old enough",
			in:      Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Hour))), Now: at(legacyReady), Policy: on, Work: looked},
			verdict: Recover,
			target:  2,
			reasonHas: []string{
				`revision 2 is pending-upgrade with no lock record covering it (stock helm may have written it); pending since 2026-03-01T11:00:00Z, age 15m1s, at least --recover-legacy-after 15m0s; it is abandoned and will be marked failed`,
			},
		},
		{
			name:       "legacy, one nanosecond too young",
			in:         Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Hour))), Now: at(legacyReady.Add(-time.Nanosecond)), Policy: on},
			verdict:    Blocked,
			target:     2,
			retryAfter: time.Nanosecond,
			reasonHas:  []string{"Retry in 1s"},
		},
		{
			name:       "legacy, young",
			in:         Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-5*time.Minute))), Now: at(t0), Policy: on},
			verdict:    Blocked,
			target:     2,
			retryAfter: 10*time.Minute + time.Second,
			reasonHas: []string{
				`release "web" in namespace "shop": revision 2 is pending-upgrade with no lock record covering it (stock helm may have written it); pending since 2026-03-01T11:55:00Z, age 5m0s; a helm process may still be running it, so it is recoverable from 2026-03-01T12:10:01Z (--recover-legacy-after 15m0s). Retry in 10m1s, or lower --recover-legacy-after if you know none is running`,
			},
		},
		{
			name:    "legacy age judged from the earliest server time, not the latest",
			in:      Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Hour))), Now: ServerTime{Earliest: legacyReady.Add(-time.Second), Latest: legacyReady.Add(time.Second)}, Policy: on},
			verdict: Blocked, target: 2, retryAfter: time.Second,
		},
		{
			name:      "legacy, server time unknown",
			in:        Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-48*time.Hour))), Policy: on},
			verdict:   Blocked,
			target:    2,
			reasonHas: []string{"its age in server time is unknown"},
		},
		{
			name:    "legacy, inconsistent server time bounds",
			in:      Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-48*time.Hour))), Now: ServerTime{Earliest: t0, Latest: t0.Add(-time.Second)}, Policy: on},
			verdict: Blocked,
			target:  2,
		},
		{
			name:       "legacy uninstalling: age counts from the in-place write, not creation",
			in:         Input{History: history(withWrite(rev(3, uninstalng, t0.Add(-48*time.Hour)), t0.Add(-2*time.Minute))), Now: at(t0), Policy: on},
			verdict:    Blocked,
			target:     3,
			retryAfter: 13*time.Minute + time.Second,
		},
		{
			name:    "legacy uninstalling, old enough",
			in:      Input{History: history(withWrite(rev(3, uninstalng, t0.Add(-48*time.Hour)), t0.Add(-time.Hour))), Now: at(t0), Policy: on, Work: looked},
			verdict: Recover,
			target:  3,
		},
		{
			name:      "legacy uninstalling with no write time: age unknown",
			in:        Input{History: history(rev(3, uninstalng, t0.Add(-48*time.Hour))), Now: at(t0), Policy: on},
			verdict:   Blocked,
			target:    3,
			reasonHas: []string{"age in server time is unknown"},
		},
		{
			name:       "a later write to a pending-upgrade restarts its legacy age",
			in:         Input{History: history(rev(1, deployed, t0), withWrite(rev(2, pUpgrade, t0.Add(-time.Hour)), t0.Add(-time.Minute))), Now: at(t0), Policy: on},
			verdict:    Blocked,
			target:     2,
			retryAfter: 14*time.Minute + time.Second,
		},

		// Several pending revisions.
		{
			name: "older pending revisions are listed as strays, newest first",
			in: Input{
				History: history(rev(1, deployed, t0), rev(2, pInstall, t0), rev(3, pUpgrade, t0), rev(4, failed, t0), rev(5, pUpgrade, t0.Add(-time.Minute))),
				Lock:    expired(5, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on,
			},
			verdict:   Recover,
			target:    5,
			ours:      true,
			stray:     []int{3, 2},
			reasonHas: []string{"with older pending revisions 3 (pending-upgrade), 2 (pending-install)"},
		},
		{
			name: "history in any order",
			in: Input{
				History: history(rev(5, pUpgrade, t0.Add(-time.Minute)), rev(1, deployed, t0), rev(3, pUpgrade, t0), rev(2, superseded, t0)),
				Lock:    expired(5, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: on,
			},
			verdict: Recover,
			target:  5,
			ours:    true,
			stray:   []int{3},
		},
		{
			name: "blocked latest lists no strays",
			in: Input{
				History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-48*time.Hour)), rev(3, pUpgrade, t0.Add(-time.Minute))),
				Now:     at(t0), Policy: on,
			},
			verdict:    Blocked,
			target:     3,
			retryAfter: 14*time.Minute + time.Second,
		},

		// Rule 6: rollback strategy.
		{
			name:       "rollback to the last deployed revision",
			in:         Input{History: history(rev(1, superseded, t0), rev(2, deployed, t0), rev(3, pUpgrade, t0.Add(-time.Minute))), Lock: expired(3, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: rollback},
			verdict:    RecoverThenRollback,
			target:     3,
			ours:       true,
			rollbackTo: 2,
			reasonHas:  []string{", then rolled back to revision 2, the last deployed"},
		},
		{
			name: "rollback skips failed, superseded and stray pending revisions",
			in: Input{
				History: history(rev(1, superseded, t0), rev(2, deployed, t0), rev(3, failed, t0), rev(4, pUpgrade, t0), rev(5, pUpgrade, t0.Add(-time.Minute))),
				Lock:    expired(5, OpUpgrade), Now: at(t0.Add(time.Second)), Policy: rollback,
			},
			verdict:    RecoverThenRollback,
			target:     5,
			ours:       true,
			stray:      []int{4},
			rollbackTo: 2,
		},
		{
			name:      "rollback with nothing deployed before falls back to fail",
			in:        Input{History: history(rev(1, pInstall, t0.Add(-time.Minute))), Lock: expired(1, OpInstall), Now: at(t0.Add(time.Second)), Policy: rollback},
			verdict:   Recover,
			target:    1,
			ours:      true,
			reasonHas: []string{"there is no deployed revision to roll back to, so it is only marked failed"},
		},
		{
			name:       "rollback for an old legacy pending revision",
			in:         Input{History: history(rev(1, deployed, t0), rev(2, pRollback, t0.Add(-time.Hour))), Now: at(t0), Policy: rollback, Work: looked},
			verdict:    RecoverThenRollback,
			target:     2,
			rollbackTo: 1,
		},
		{
			name:       "rollback strategy does not unblock a young legacy revision",
			in:         Input{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Minute))), Now: at(t0), Policy: rollback},
			verdict:    Blocked,
			target:     2,
			retryAfter: 14*time.Minute + time.Second,
		},
	}

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := slices.Clone(c.in.History)
			d := Decide(c.in)
			if !slices.Equal(before, c.in.History) {
				t.Errorf("Decide reordered or changed its input")
			}
			if d.Verdict != c.verdict {
				t.Errorf("verdict = %v, want %v (reason: %s)", d.Verdict, c.verdict, d.Reason)
			}
			if d.Target.Release.Revision != c.target {
				t.Errorf("target = %d, want %d", d.Target.Release.Revision, c.target)
			}
			if (d.Target.Lock != nil) != c.ours {
				t.Errorf("target attributed to the lock record = %v, want %v", d.Target.Lock != nil, c.ours)
			}
			var stray []int
			for _, s := range d.Stray {
				stray = append(stray, s.Release.Revision)
			}
			if !slices.Equal(stray, c.stray) {
				t.Errorf("stray = %v, want %v", stray, c.stray)
			}
			if d.RollbackTo != c.rollbackTo {
				t.Errorf("rollbackTo = %d, want %d", d.RollbackTo, c.rollbackTo)
			}
			if d.RetryAfter != c.retryAfter {
				t.Errorf("retryAfter = %v, want %v", d.RetryAfter, c.retryAfter)
			}
			if d.Reason == "" {
				t.Errorf("empty reason")
			}
			if d.Verdict != NoRelease && !strings.HasPrefix(d.Reason, `release "web" in namespace "shop"`) {
				t.Errorf("reason does not name the release and namespace: %s", d.Reason)
			}
			for _, want := range c.reasonHas {
				if !strings.Contains(d.Reason, want) {
					t.Errorf("reason\n  %s\nlacks\n  %s", d.Reason, want)
				}
			}
		})
	}
}

// names is s whose record's lock names s's own revision, as the write
// fence's create or rewrite of it writes it.
func names(s helmx.Summary) helmx.Summary { return withLockRevision(s, s.Revision) }

// withLockRevision is s whose record's lock names revision n.
func withLockRevision(s helmx.Summary, n int) helmx.Summary {
	s.LockRevision = n
	return s
}

func withWrite(s helmx.Summary, t time.Time) helmx.Summary {
	s.LastWriteTime = t
	return s
}

// TestDecideHolderMayStillWrite: a lock a person released before it ran
// out (unlock --force) hands its holder on, but its revision is recovered
// only once the server clock has certainly passed the holder's LOCKED TILL
// plus the takeover margin: until then the holder may still be writing.
// A holder known to have stopped (its taker confirmed its expiry on its own
// clock) is recovered at once, even while its LOCKED TILL lies ahead in
// server time: a holder that stamped its lock through a Date header running
// ahead left a LOCKED TILL minutes in the future (the simulation, seed 12,
// found every later client waiting those minutes).
func TestDecideHolderMayStillWrite(t *testing.T) {
	in := Input{
		History: history(rev(1, deployed, t0.Add(-time.Hour)), rev(2, pUpgrade, t0.Add(-time.Minute))),
		Lock:    expired(2, OpUpgrade), // LOCKED TILL t0
		Policy:  on,
	}
	stopped := in
	stopped.Lock.Stopped = true
	for _, now := range []ServerTime{at(t0.Add(-5 * time.Second)), at(t0.Add(-10 * time.Minute)), {}} {
		stopped.Now = now
		if d := Decide(stopped); d.Verdict != Recover || d.HolderMayWrite {
			t.Errorf("holder stopped, now %v: %s (%s); want Recover", now.Earliest, d.Verdict, d.Reason)
		}
	}
	for _, c := range []struct {
		now       ServerTime
		want      Verdict
		wantRetry time.Duration
	}{
		{at(t0.Add(-5 * time.Second)), Blocked, 5*time.Second + 250*time.Millisecond + time.Millisecond},
		{at(t0), Blocked, 250*time.Millisecond + time.Millisecond},
		{at(t0.Add(250 * time.Millisecond)), Blocked, time.Millisecond},
		{at(t0.Add(251 * time.Millisecond)), Recover, 0},
		{ServerTime{}, Blocked, 0},
	} {
		in.Now = c.now
		d := Decide(in)
		if d.Verdict != c.want || d.RetryAfter != c.wantRetry {
			t.Errorf("now %v: %s retry %s (%s); want %s retry %s", c.now.Earliest, d.Verdict, d.RetryAfter, d.Reason, c.want, c.wantRetry)
		}
		if d.Verdict == Blocked && (!d.HolderMayWrite || !strings.Contains(d.Reason, "may still be writing until 2026-03-01T12:00:00Z")) {
			t.Errorf("reason %q (holder may write: %v) does not say until when the holder may write", d.Reason, d.HolderMayWrite)
		}
	}
	// With autorecover off the holder still comes first: a rollback or
	// uninstall that would run through "autorecover is off" must wait too.
	in.Policy, in.Now = Policy{}, at(t0)
	if d := Decide(in); d.Verdict != Blocked || !d.HolderMayWrite || d.RetryAfter != 251*time.Millisecond {
		t.Errorf("autorecover off: %s, holder may write %v, retry %s; want Blocked on the holder", d.Verdict, d.HolderMayWrite, d.RetryAfter)
	}
	in.Now = at(t0.Add(time.Second))
	if d := Decide(in); d.Verdict != Blocked || d.HolderMayWrite {
		t.Errorf("autorecover off, holder done: %s, holder may write %v; want Blocked by the policy alone", d.Verdict, d.HolderMayWrite)
	}
}

// TestDecideFullReasons pins whole sentences, as a user reads them.
func TestDecideFullReasons(t *testing.T) {
	d := Decide(Input{
		History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Minute))),
		Lock:    expired(2, OpUpgrade),
		Now:     at(t0.Add(time.Second)),
		Policy:  rollback,
	})
	want := `release "web" in namespace "shop": revision 2 is pending-upgrade, written by alice@ci-7 (session s-old, operation upgrade) whose lock expired at 2026-03-01T12:00:00Z; it is abandoned and will be marked failed, then rolled back to revision 1, the last deployed`
	if d.Reason != want {
		t.Errorf("reason\n got %s\nwant %s", d.Reason, want)
	}

	d = Decide(Input{
		History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Minute))),
		Now:     at(t0),
		Policy:  Policy{Autorecover: true, Hints: CLIHints},
	})
	want = `release "web" in namespace "shop": revision 2 is pending-upgrade with no lock record covering it (stock helm may have written it); --recover-legacy-after is 0, so it is never recovered automatically. Set --recover-legacy-after, or run helm rollback once no helm process is running`
	if d.Reason != want {
		t.Errorf("reason\n got %s\nwant %s", d.Reason, want)
	}

	// A library user (no hints) reads no CLI flag.
	for _, in := range []Input{
		{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Minute))), Now: at(t0), Policy: Policy{Autorecover: true}},
		{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Minute))), Now: at(t0), Policy: Policy{LegacyAfter: time.Hour}},
		{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Minute))), Now: at(t0), Policy: Policy{Autorecover: true, LegacyAfter: time.Hour}},
		{History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-time.Minute))), Lock: LockInfo{State: LockLive, Session: "s"}, Now: at(t0), Policy: Policy{Autorecover: true}},
	} {
		if d := Decide(in); strings.Contains(d.Reason, "--") {
			t.Errorf("library reason names a CLI flag: %s", d.Reason)
		}
	}
}

func TestDecideAgeAndPendingSince(t *testing.T) {
	d := Decide(Input{
		History: history(rev(1, deployed, t0), rev(2, pUpgrade, t0.Add(-20*time.Minute))),
		Now:     at(t0),
		Policy:  on,
		Work:    looked,
	})
	if d.Verdict != Recover {
		t.Fatalf("verdict %v: %s", d.Verdict, d.Reason)
	}
	if !d.Target.PendingSince.Equal(t0.Add(-20*time.Minute)) || d.Target.Age != 20*time.Minute {
		t.Errorf("pendingSince %v age %v", d.Target.PendingSince, d.Target.Age)
	}
	if d.Target.Release.ResourceVersion != "100" {
		t.Errorf("target lost its resourceVersion")
	}
}

func TestIsPending(t *testing.T) {
	for st, want := range map[common.Status]bool{
		pInstall: true, pUpgrade: true, pRollback: true, uninstalng: true,
		deployed: false, failed: false, superseded: false,
		common.StatusUninstalled: false, common.StatusUnknown: false, "": false,
	} {
		if got := IsPending(st); got != want {
			t.Errorf("IsPending(%q) = %v, want %v", st, got, want)
		}
	}
}

func TestStrings(t *testing.T) {
	for v, want := range map[Verdict]string{NoRelease: "NoRelease", Proceed: "Proceed", Recover: "Recover", RecoverThenRollback: "RecoverThenRollback", Blocked: "Blocked", Verdict(9): "Verdict(9)"} {
		if v.String() != want {
			t.Errorf("%d: %q", int(v), v.String())
		}
	}
	for s, want := range map[LockState]string{LockNone: "none", LockReleased: "released", LockExpired: "expired", LockLive: "live", LockState(7): "LockState(7)"} {
		if s.String() != want {
			t.Errorf("%d: %q", int(s), s.String())
		}
	}
}

// TestDecideHelmStillAtWork: a legacy pending revision old enough to be
// recovered is held back while a hook Job or Pod its record names, created
// no earlier than the revision, has not finished: its helm may still be at
// work on it (issue 31). Its hooks are looked at only then (LookForWork):
// a young revision, or one written under an expired lock, asks nothing.
func TestDecideHelmStillAtWork(t *testing.T) {
	created := t0.Add(-time.Hour) // the pending revision's creationTimestamp
	pending := history(rev(1, deployed, t0.Add(-48*time.Hour)), stock(rev(2, pUpgrade, created)))
	job := func(name string, at time.Time, finished bool) HookObject {
		return HookObject{Kind: "Job", Namespace: "shop", Name: name, Created: at, Finished: finished}
	}
	pod := func(name string, at time.Time, finished bool) HookObject {
		return HookObject{Kind: "Pod", Namespace: "shop", Name: name, Created: at, Finished: finished}
	}
	uninstalling := history(withWrite(stock(rev(3, uninstalng, t0.Add(-48*time.Hour))), created))
	cases := []struct {
		name      string
		in        Input
		verdict   Verdict
		look      bool
		retry     time.Duration
		reasonHas string
	}{
		{
			name: "not looked yet: look, then decide again", in: Input{History: pending},
			verdict: Blocked, look: true, reasonHas: "whether a helm process is still at work on it (a hook Job or Pod still running) was not looked at",
		},
		{name: "looked, no hook", in: Input{History: pending, Work: looked}, verdict: Recover},
		{
			name:    "a hook Job created after the revision still runs",
			in:      Input{History: pending, Work: Work{Looked: true, Hooks: []HookObject{job("web-migrate", created.Add(50*time.Minute+2*time.Second), false)}}},
			verdict: Blocked, retry: HookRecheck,
			reasonHas: "at least --recover-legacy-after 15m0s, but its hook Job shop/web-migrate, created at 2026-03-01T11:50:02Z, is still running: a helm process may still be at work on it. Retry in 30s",
		},
		{
			// helm waits for one hook at most its --timeout, which the
			// legacy age exceeds: one stuck since (a Pod that never
			// schedules) would hold the release for ever (review 2).
			name:    "a hook Job as old as the legacy age does not hold it back",
			in:      Input{History: pending, Work: Work{Looked: true, Hooks: []HookObject{job("web-migrate", created, false), pod("web-check", t0.Add(time.Second-15*time.Minute), false)}}},
			verdict: Recover,
		},
		{
			name:    "a running hook Pod",
			in:      Input{History: pending, Work: Work{Looked: true, Hooks: []HookObject{job("web-done", created.Add(time.Second), true), pod("web-check", created.Add(51*time.Minute), false), job("web-seed", created.Add(51*time.Minute), false)}}},
			verdict: Blocked, retry: HookRecheck, reasonHas: "its hook Pod shop/web-check (and 1 more), created at 2026-03-01T11:51:00Z, is still running",
		},
		{
			name:    "a hook whose creation time is unknown counts",
			in:      Input{History: pending, Work: Work{Looked: true, Hooks: []HookObject{job("web-migrate", time.Time{}, false)}}},
			verdict: Blocked, retry: HookRecheck,
		},
		{
			name:    "a finished hook Job does not hold it back",
			in:      Input{History: pending, Work: Work{Looked: true, Hooks: []HookObject{job("web-migrate", created.Add(time.Second), true)}}},
			verdict: Recover,
		},
		{
			name:    "a running Job of the same name from before the revision is an earlier operation's",
			in:      Input{History: pending, Work: Work{Looked: true, Hooks: []HookObject{job("web-migrate", created.Add(-time.Second), false)}}},
			verdict: Recover,
		},
		{
			name:    "hooks that could not be read hold it back",
			in:      Input{History: pending, Work: Work{Looked: true, Unknown: `reading Job shop/web-migrate: jobs.batch "web-migrate" is forbidden`}},
			verdict: Blocked, retry: HookRecheck,
			reasonHas: `but whether a helm process is still at work on it cannot be told: reading Job shop/web-migrate: jobs.batch "web-migrate" is forbidden. Retry in 30s`,
		},
		{
			name:    "uninstalling: a hook created before the uninstall's write is an earlier operation's",
			in:      Input{History: uninstalling, Work: Work{Looked: true, Hooks: []HookObject{job("web-cleanup", created.Add(-time.Second), false)}}},
			verdict: Recover,
		},
		{
			name:    "uninstalling: a pre-delete hook created after the uninstall's write",
			in:      Input{History: uninstalling, Work: Work{Looked: true, Hooks: []HookObject{job("web-cleanup", created.Add(50*time.Minute), false)}}},
			verdict: Blocked, retry: HookRecheck, reasonHas: "hook Job shop/web-cleanup",
		},
		{
			name:    "a young revision is not looked at: its age holds it back",
			in:      Input{History: history(rev(1, deployed, t0.Add(-48*time.Hour)), stock(rev(2, pUpgrade, t0.Add(-time.Minute))))},
			verdict: Blocked, retry: 14 * time.Minute,
		},
		{
			name:    "a revision written under an expired lock is not looked at",
			in:      Input{History: history(rev(1, deployed, t0.Add(-48*time.Hour)), rev(2, pUpgrade, t0.Add(-time.Minute))), Lock: expired(2, OpUpgrade)},
			verdict: Recover,
		},
		{
			name:    "autorecover off is not looked at",
			in:      Input{History: pending, Policy: Policy{LegacyAfter: time.Minute}},
			verdict: Blocked,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := c.in
			in.Release, in.Namespace = "web", "shop"
			in.Now = at(t0.Add(time.Second))
			if in.Policy == (Policy{}) {
				in.Policy = on
			}
			d := Decide(in)
			if d.Verdict != c.verdict || d.LookForWork != c.look || d.RetryAfter != c.retry {
				t.Errorf("%s, look for work %v, retry %s; want %s, %v, %s\nreason: %s", d.Verdict, d.LookForWork, d.RetryAfter, c.verdict, c.look, c.retry, d.Reason)
			}
			if !strings.Contains(d.Reason, c.reasonHas) {
				t.Errorf("reason\n  %s\nlacks\n  %s", d.Reason, c.reasonHas)
			}
			if d.AtWork != (c.retry == HookRecheck) {
				t.Errorf("at work %v with retry %s", d.AtWork, d.RetryAfter)
			}
			if d.LookForWork && d.Target.Release.Revision != 2 {
				t.Errorf("look for work names revision %d, want 2", d.Target.Release.Revision)
			}
		})
	}
}
