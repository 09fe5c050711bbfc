package inspect

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/cli/output"
	"helm.sh/helm/v4/pkg/release/common"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

func TestClassify(t *testing.T) {
	pending := summary("r", "ns", 2, common.StatusPendingUpgrade, at(-time.Minute))
	uninstalling := summary("r", "ns", 2, common.StatusUninstalling, at(-time.Minute))
	deployed := summary("r", "ns", 2, common.StatusDeployed, at(-time.Minute))
	rec := record("r", "ns", "s1", lock.OpUpgrade, 2, at(-time.Minute), at(-time.Minute))
	free := &lock.Status{Release: "r", Namespace: "ns", Exists: true, State: lock.Free, Record: rec}
	for _, tc := range []struct {
		name   string
		st     *lock.Status
		latest *helmx.Summary
		want   State
	}{
		{"no lease, no history", nil, nil, StateNone},
		{"no lease, deployed", nil, deployed, StateNone},
		{"no lease, pending", nil, pending, StateLegacyPending},
		{"no lease, uninstalling", nil, uninstalling, StateLegacyPending},
		{"missing lease status", &lock.Status{}, pending, StateLegacyPending},
		{"released, pending", free, pending, StateLegacyPending},
		{"released, deployed", free, deployed, StateNone},
		{"live, pending", held(rec, lock.Live), pending, StateLive},
		{"live, no history", held(rec, lock.Live), nil, StateLive},
		{"expired, pending", held(rec, lock.Expired), pending, StateExpired},
		{"expired, deployed", held(rec, lock.Expired), deployed, StateExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Classify(tc.st, tc.latest); got != tc.want {
				t.Errorf("Classify = %s; want %s", got, tc.want)
			}
		})
	}
}

func TestProblem(t *testing.T) {
	good := record("r", "ns", "s1", lock.OpUpgrade, 2, at(-time.Minute), at(-time.Minute))
	withRec := func(mut func(*lock.Status)) *lock.Status {
		r := *good
		st := held(&r, lock.Live)
		mut(st)
		return st
	}
	for _, tc := range []struct {
		name string
		st   *lock.Status
		want string
	}{
		{"no lease", nil, ""},
		{"absent", &lock.Status{Release: "r", Namespace: "ns"}, ""},
		{"held and consistent", held(good, lock.Live), ""},
		{"released without record", &lock.Status{Release: "r", Namespace: "ns", Exists: true}, ""},
		{
			"unreadable", withRec(func(st *lock.Status) {
				st.Record, st.RecordErr = nil, errors.New("decode lock record: unexpected end of JSON input")
			}),
			"its lock record (annotation helm-autorecover.io/lock) cannot be read: decode lock record: unexpected end of JSON input",
		},
		{
			"unreadable sql row", withRec(func(st *lock.Status) {
				st.Store, st.Record, st.RecordErr = lock.StoreSQL, nil, errors.New("decode lock record: unexpected end of JSON input")
			}),
			"its lock row's record cannot be read: decode lock record: unexpected end of JSON input",
		},
		{
			"sql row held without record", withRec(func(st *lock.Status) { st.Store, st.Record = lock.StoreSQL, nil }),
			"it is held by session s1 but its lock row has no lock record: it was created or edited by hand",
		},
		{
			"held without record", withRec(func(st *lock.Status) { st.Record = nil }),
			"it is held by session s1 but carries no lock record (annotation helm-autorecover.io/lock): it was created or edited by hand",
		},
		{
			"holder edited", withRec(func(st *lock.Status) { st.HolderIdentity = "me" }),
			`its holderIdentity "me" does not match the session "s1" of its lock record: it was edited by hand`,
		},
		{
			"foreign release", withRec(func(st *lock.Status) { st.Record.Release = "other" }),
			`its lock record names release "other", not "r": it was copied or edited by hand`,
		},
		{
			"foreign namespace", withRec(func(st *lock.Status) { st.Record.Namespace = "elsewhere" }),
			`its lock record names namespace "elsewhere", not "ns": it was copied or edited by hand`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Problem(tc.st); got != tc.want {
				t.Errorf("Problem =\n  %s\nwant\n  %s", got, tc.want)
			}
		})
	}
}

func TestNewRowTimes(t *testing.T) {
	rows := fixtureRows()
	byName := map[string]Row{}
	for _, r := range rows {
		byName[r.Release] = r
	}
	// LOCKED TILL is 10 s ahead; the takeover margin adds 250 ms.
	if got := byName["web"].TimeLeft; got != "10s" {
		t.Errorf("web: TimeLeft = %q; want 10s", got)
	}
	// LOCKED TILL was 8m45s ago; takeover allowed 250 ms later.
	if got := byName["api"].ExpiredFor; got != "8m45s" {
		t.Errorf("api: ExpiredFor = %q; want 8m45s", got)
	}
	// Pending for 4 minutes of the default 15: recoverable 11 min (plus the
	// timestamps' 1 s resolution) later.
	if r := byName["legacy"]; r.PendingFor != "4m0s" || r.RecoverableIn != "11m1s" {
		t.Errorf("legacy: PendingFor %q, RecoverableIn %q; want 4m0s, 11m1s", r.PendingFor, r.RecoverableIn)
	}
	if r := byName["old"]; r.RecoverableIn != "0s" {
		t.Errorf("old: RecoverableIn %q; want 0s", r.RecoverableIn)
	}
	if r := byName["cache"]; !strings.Contains(r.Problem, "kubectl delete lease -n prod helm-autorecover.v1.cache") {
		t.Errorf("cache: Problem %q does not say how to fix it", r.Problem)
	}
}

func TestNewRowLegacyNever(t *testing.T) {
	r := NewRow(Input{Release: Release{Name: "x", Namespace: "ns", Latest: summary("x", "ns", 1, common.StatusPendingInstall, at(-time.Hour))}, Now: now})
	if r.State != StateLegacyPending || r.RecoverableIn != "never" {
		t.Errorf("state %s, recoverableIn %q; want legacy-pending, never", r.State, r.RecoverableIn)
	}
}

func TestLocksGolden(t *testing.T) {
	for _, f := range []output.Format{output.Table, output.JSON, output.YAML} {
		t.Run(string(f), func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteLocks(&b, f, fixtureRows(), false); err != nil {
				t.Fatal(err)
			}
			golden(t, "locks."+string(f), b.Bytes())
		})
	}
	t.Run("empty", func(t *testing.T) {
		for _, f := range []output.Format{output.Table, output.JSON, output.YAML} {
			var b bytes.Buffer
			if err := WriteLocks(&b, f, nil, false); err != nil {
				t.Fatal(err)
			}
			golden(t, "locks-empty."+string(f), b.Bytes())
		}
	})
	t.Run("no-headers", func(t *testing.T) {
		var b bytes.Buffer
		if err := WriteLocks(&b, output.Table, fixtureRows()[:1], true); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(b.String(), "SESSION ID") {
			t.Errorf("--no-headers printed the header:\n%s", b.String())
		}
	})
	t.Run("bad format", func(t *testing.T) {
		if err := WriteLocks(&bytes.Buffer{}, "xml", nil, false); !errors.Is(err, output.ErrInvalidFormatType) {
			t.Errorf("err = %v; want ErrInvalidFormatType", err)
		}
	})
}

func listFixture() []ListElement {
	var elems []ListElement
	for _, r := range fixtureRows() {
		if r.Revision == 0 {
			continue
		}
		e := ListElement{
			Name: r.Release, Namespace: r.Namespace, Revision: "1", Updated: "2026-12-02 13:09:00.123456789 +0000 UTC",
			Status: r.Status, Chart: "app-0.1.0", AppVersion: "1.0",
		}
		e.LockFields(r)
		elems = append(elems, e)
	}
	return elems
}

func TestListGolden(t *testing.T) {
	for _, f := range []output.Format{output.Table, output.JSON, output.YAML} {
		t.Run(string(f), func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteList(&b, f, listFixture(), false, true); err != nil {
				t.Fatal(err)
			}
			golden(t, "list-locks."+string(f), b.Bytes())
		})
	}
}

func TestReportGolden(t *testing.T) {
	rec := record("api", "prod", "7a9b0000-3333-4a5b-9c8d-000000000003", lock.OpUpgrade, 3, at(-10*time.Minute), at(-9*time.Minute))
	hist := []helmx.Summary{
		*summary("api", "prod", 1, common.StatusPendingInstall, at(-time.Hour)),
		*summary("api", "prod", 2, common.StatusDeployed, at(-30*time.Minute)),
		*carrying(summary("api", "prod", 3, common.StatusPendingUpgrade, at(-9*time.Minute-30*time.Second)), rec),
	}
	expired := recovery.LockInfo{State: recovery.LockExpired, Session: rec.Session, Who: rec.Who, Operation: string(rec.Operation), Revision: 3, LockedTill: rec.LockedTill}
	live := expired
	live.State = recovery.LockLive
	live.LockedTill = at(10 * time.Second)
	st := recovery.ServerTime{Earliest: now.Earliest, Latest: now.Latest}
	decide := func(lk recovery.LockInfo, h []helmx.Summary, p recovery.Policy) recovery.Decision {
		return recovery.Decide(recovery.Input{Release: "api", Namespace: "prod", History: h, Lock: lk, Now: st, Policy: p})
	}
	writes := func(dec recovery.Decision, session string) []Write {
		var ws []Write
		for _, a := range append([]recovery.Abandonment{dec.Target}, dec.Stray...) {
			desc := recovery.DescribeAbandoned(a, recovery.Recoverer{Session: session, At: now.Latest})
			ws = append(ws, Write{Revision: a.Release.Revision, RecordName: a.Release.RecordName, From: a.Release.Status, Description: desc})
		}
		return ws
	}
	fail := recovery.Policy{Autorecover: true, LegacyAfter: 15 * time.Minute, Hints: recovery.CLIHints}
	rollback := fail
	rollback.Strategy = recovery.StrategyRollback

	var b bytes.Buffer
	add := func(title string, r Report) {
		b.WriteString("=== " + title + "\n")
		if err := WriteReport(&b, r); err != nil {
			t.Fatal(err)
		}
	}
	dec := decide(expired, hist, fail)
	add("dry run, expired holder", Report{Release: "api", Namespace: "prod", Decision: dec, DryRun: true, Writes: writes(dec, "<new session>"), Event: "Recovered"})
	add("recovered, expired holder", Report{Release: "api", Namespace: "prod", Decision: dec, Writes: writes(dec, "9e8d0000-7777-4a5b-9c8d-000000000007"), Event: "Recovered"})
	dec = decide(expired, hist, rollback)
	add("dry run, rollback strategy", Report{Release: "api", Namespace: "prod", Decision: dec, DryRun: true, Writes: writes(dec, "<new session>"), Event: "Recovered"})
	add("live holder", Report{Release: "api", Namespace: "prod", Decision: decide(live, hist, fail)})
	add("legacy, too young", Report{Release: "api", Namespace: "prod", DryRun: true, Decision: decide(recovery.LockInfo{}, hist, fail)})
	add("legacy, never", Report{Release: "api", Namespace: "prod", Decision: decide(recovery.LockInfo{}, hist, recovery.Policy{Autorecover: true, Hints: recovery.CLIHints})})
	add("nothing pending", Report{Release: "api", Namespace: "prod", DryRun: true, Decision: decide(recovery.LockInfo{}, hist[:2], fail)})
	golden(t, "report.txt", b.Bytes())
}

func TestVerdict(t *testing.T) {
	for _, tc := range []struct {
		dec    recovery.Decision
		dryRun bool
		want   string
	}{
		{recovery.Decision{Verdict: recovery.NoRelease}, false, "unknown release: nothing is stored for it"},
		{recovery.Decision{Verdict: recovery.Proceed}, true, "nothing to recover"},
		{recovery.Decision{Verdict: recovery.Recover}, true, "recoverable"},
		{recovery.Decision{Verdict: recovery.Recover}, false, "recovered"},
		{recovery.Decision{Verdict: recovery.RecoverThenRollback, RollbackTo: 4}, true, "recoverable, then rolled back to revision 4"},
		{recovery.Decision{Verdict: recovery.RecoverThenRollback, RollbackTo: 4}, false, "recovered and rolled back to revision 4"},
		{recovery.Decision{Verdict: recovery.Blocked}, false, "not recoverable now"},
		{recovery.Decision{Verdict: recovery.Blocked, RetryAfter: 90*time.Second + 300*time.Millisecond}, false, "not recoverable now (recoverable in 1m30s)"},
	} {
		if got := Verdict(tc.dec, tc.dryRun); got != tc.want {
			t.Errorf("Verdict(%s, dryRun %v) = %q; want %q", tc.dec.Verdict, tc.dryRun, got, tc.want)
		}
	}
}

// TestPreemptRequestOf: the request a holder acts on is the first live
// waiter that asked it to stop (--preempt), in arrival order, whoever
// waits ahead of it; the holder's own session never asks itself; a
// holder whose operation helm cannot cancel says so.
func TestPreemptRequestOf(t *testing.T) {
	waiter := func(session string, preempt bool) lock.Waiter {
		w := lock.Waiter{Session: session, Who: session + "@host", Operation: lock.OpUpgrade, EnqueuedAt: at(-time.Second), ExpiresAt: at(14 * time.Second), Preempt: preempt}
		if preempt {
			w.PreemptHolder = "holder"
		}
		return w
	}
	ofAnother := waiter("a", true)
	ofAnother.PreemptHolder = "an earlier holder"
	asker := func(session, declined string) *PreemptRequest {
		return &PreemptRequest{Session: session, Who: session + "@host", Operation: "upgrade", RequestedAt: at(-time.Second), Declined: declined}
	}
	for _, tc := range []struct {
		name     string
		live     []lock.Waiter
		holderOp lock.Operation
		want     *PreemptRequest
	}{
		{"no waiter", nil, lock.OpUpgrade, nil},
		{"waiters that only wait", []lock.Waiter{waiter("a", false), waiter("b", false)}, lock.OpUpgrade, nil},
		{"the first waiter asks", []lock.Waiter{waiter("a", true), waiter("b", true)}, lock.OpUpgrade, asker("a", "")},
		{"an asker behind a waiter", []lock.Waiter{waiter("a", false), waiter("b", true)}, lock.OpInstall, asker("b", "")},
		{"the holder's own entry asks nothing", []lock.Waiter{waiter("holder", true), waiter("b", true)}, lock.OpUpgrade, asker("b", "")},
		{"a rollback will not stop", []lock.Waiter{waiter("a", true)}, lock.OpRollback, asker("a", "helm cannot cancel a rollback")},
		{"an uninstall will not stop", []lock.Waiter{waiter("a", true)}, lock.OpUninstall, asker("a", "helm cannot cancel an uninstall")},
		{"the holder's operation unknown", []lock.Waiter{waiter("a", true)}, "", asker("a", "")},
		{"a request of another holder (its asker died)", []lock.Waiter{ofAnother, waiter("b", true)}, lock.OpUpgrade, asker("b", "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PreemptRequestOf(tc.live, "holder", tc.holderOp)
			switch {
			case got == nil && tc.want == nil:
			case got == nil || tc.want == nil || *got != *tc.want:
				t.Errorf("PreemptRequestOf = %+v; want %+v", got, tc.want)
			}
		})
	}
}

// TestHolderCellNamesTheAsker: the tables' HOLDER cell names who asked the
// holder to stop, since when, and why it will not when it will not; the
// holder alone otherwise, and the JSON holder field stays the holder alone.
func TestHolderCellNamesTheAsker(t *testing.T) {
	byName := map[string]Row{}
	for _, r := range fixtureRows() {
		byName[r.Release] = r
	}
	for _, tc := range []struct{ release, want string }{
		{"web", "alice@ci-7 (pid 4242); asked to stop by carol@ci-9 (session a1b20000-8888-4a5b-9c8d-000000000008, waiting to upgrade) since 2026-12-02T13:09:58Z"},
		{"jobs", "alice@ci-7 (pid 4242); asked to stop by dave@laptop (session c5d60000-aaaa-4a5b-9c8d-00000000000a, waiting to upgrade) since 2026-12-02T13:09:59Z, which it will not do: helm cannot cancel a rollback"},
		{"new", "alice@ci-7 (pid 4242)"},
	} {
		r := byName[tc.release]
		if got := Holder(r) + asked(r.PreemptRequestedBy); got != tc.want {
			t.Errorf("%s: HOLDER cell\n  %s\nwant\n  %s", tc.release, got, tc.want)
		}
		var e ListElement
		e.LockFields(r)
		if e.Holder != "alice@ci-7 (pid 4242)" || e.PreemptRequestedBy != r.PreemptRequestedBy {
			t.Errorf("%s: list element holder %q, preempt_requested_by %+v; want the holder alone and the row's request", tc.release, e.Holder, e.PreemptRequestedBy)
		}
	}
}

// TestBadLockAdviceNamesTheStore: the advice for a lock that cannot be
// trusted names where it is kept and how to clear it there: a Lease with
// kubectl, a lock row of helm's sql database with SQL (no Lease exists).
func TestBadLockAdviceNamesTheStore(t *testing.T) {
	lease := BadLockAdvice(&lock.Status{Store: lock.StoreLease}, "r", "ns", "PROBLEM", ".")
	row := BadLockAdvice(&lock.Status{Store: lock.StoreSQL}, "r", "ns", "PROBLEM", ".")
	for _, c := range []struct {
		got        string
		want, none []string
	}{
		{lease, []string{"Lease helm-autorecover.v1.r: PROBLEM.", "kubectl delete lease -n ns helm-autorecover.v1.r", "helm-autorecover recover r -n ns"}, []string{"DELETE FROM"}},
		{row, []string{"lock row helm-autorecover.v1.r", "DELETE FROM helm_autorecover_locks_v1 WHERE namespace = 'ns' AND name = 'helm-autorecover.v1.r'", "helm-autorecover recover r -n ns"}, []string{"kubectl", "Lease"}},
	} {
		for _, w := range c.want {
			if !strings.Contains(c.got, w) {
				t.Errorf("advice %q lacks %q", c.got, w)
			}
		}
		for _, n := range c.none {
			if strings.Contains(c.got, n) {
				t.Errorf("advice %q says %q", c.got, n)
			}
		}
	}
}

// TestLockObjectNamesTheStore: the object a message names, and how to
// delete it, follow where the lock is kept.
func TestLockObjectNamesTheStore(t *testing.T) {
	for _, c := range []struct {
		store        lock.StoreKind
		object, gone string
	}{
		{lock.StoreLease, "Lease helm-autorecover.v1.r", "kubectl delete lease -n ns helm-autorecover.v1.r"},
		{lock.StoreRelease, "beat helm-autorecover.v1.r", "kubectl delete secret,configmap -n ns helm-autorecover.v1.r"},
		{lock.StoreSQL, "lock row helm-autorecover.v1.r", "DELETE FROM helm_autorecover_locks_v1 WHERE namespace = 'ns' AND name = 'helm-autorecover.v1.r'"},
	} {
		st := &lock.Status{Store: c.store}
		if got := LockObject(st, "r"); got != c.object {
			t.Errorf("%s: LockObject = %q, want %q", c.store, got, c.object)
		}
		if got := DeleteLockObject(st, "r", "ns"); got != c.gone {
			t.Errorf("%s: DeleteLockObject = %q, want %q", c.store, got, c.gone)
		}
	}
}
