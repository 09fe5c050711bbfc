package sqlstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
	"github.com/helm-autorecover/helm-autorecover/internal/sqlstore"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// fixture is a fresh database with helm's table (created by helm's own
// driver) and a store over it whose clock is the local cluster's.
type fixture struct {
	// ns is a namespace of the local cluster, for the Lease of a lock.
	ns    string
	dsn   string
	store *sqlstore.Store
	conn  *protocol.Conn
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	env := testenv.Get(t)
	dsn := env.Postgres(t)
	t.Setenv(sqlstore.EnvConnectionString, dsn)
	conn, err := protocol.Connect(env.Config, clock.RealClock{}, protocol.DriverSQL)
	if err != nil {
		t.Fatal(err)
	}
	if conn.SQL() == nil {
		t.Fatal("HELM_DRIVER=sql with a connection string gave no sql store")
	}
	t.Cleanup(func() { _ = conn.SQL().Close() })
	// helm's own driver creates its table, as helm's first command does.
	if _, err := driver.NewSQL(dsn, "default"); err != nil {
		t.Fatalf("helm's sql driver: %v", err)
	}
	return fixture{ns: env.Namespace(t), dsn: dsn, store: conn.SQL(), conn: conn}
}

// helmAs is helm's own sql driver on a connection that names session (""
// is stock helm, which names none).
func helmAs(t *testing.T, dsn, ns, session string) *driver.SQL {
	t.Helper()
	if session != "" {
		var err error
		if dsn, err = sqlstore.WithSession(dsn, session); err != nil {
			t.Fatal(err)
		}
	}
	d, err := driver.NewSQL(dsn, ns)
	if err != nil {
		t.Fatalf("helm's sql driver: %v", err)
	}
	return d
}

func release(name, ns string, rev int, status common.Status) *rspb.Release {
	return &rspb.Release{
		Name: name, Namespace: ns, Version: rev,
		Info: &rspb.Info{Status: status, Description: "test"},
	}
}

func key(name string, rev int) string { return fmt.Sprintf("sh.helm.release.v1.%s.v%d", name, rev) }

// lockRow writes the release's lock row naming holder ("": released),
// through the lock rows' own store, as the lock does.
func lockRow(t *testing.T, ctx context.Context, s *sqlstore.Store, ns, rel, holder string) {
	t.Helper()
	st := s.Locks(ns)
	name := lock.LeaseName(rel)
	now := time.Now().UTC().Truncate(time.Millisecond)
	rec := lock.Record{
		Schema: lock.SchemaVersion, Session: holder, Operation: lock.OpUpgrade, Release: rel, Namespace: ns,
		LeaseDuration: metav1.Duration{Duration: time.Minute}, AcquiredAt: now, RenewedAt: now, LockedTill: now.Add(time.Minute),
	}
	if holder == "" {
		rec.Session, rec.ReleasedAt = "released", now
	}
	cur, err := st.Read(ctx, name)
	if apierrors.IsNotFound(err) {
		if _, err := st.Create(ctx, name, rec); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Take(ctx, cur, rec, nil); err != nil {
		t.Fatal(err)
	}
}

// TestLockRowsAreConditional: the lock rows answer as the lock's
// compare-and-swap needs: a create fails with AlreadyExists, a write or a
// delete made from a stale read with Conflict, one of a deleted row with
// NotFound, and every write changes the row's version.
func TestLockRowsAreConditional(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	st := f.store.Locks("shop")
	now := time.Now().UTC().Truncate(time.Millisecond)
	rec := func(session string) lock.Record {
		return lock.Record{
			Schema: lock.SchemaVersion, Session: session, Operation: lock.OpUpgrade, Release: "web", Namespace: "shop",
			LeaseDuration: metav1.Duration{Duration: time.Minute}, AcquiredAt: now, RenewedAt: now, LockedTill: now.Add(time.Minute),
		}
	}
	c1, err := st.Create(ctx, "x", rec("s1"))
	if err != nil {
		t.Fatal(err)
	}
	if lock.HolderOf(&c1.Spec) != "s1" || c1.Record == nil || c1.Record.Session != "s1" || c1.Release != "web" {
		t.Fatalf("created row = %+v; want s1's record", c1)
	}
	if _, err := st.Create(ctx, "x", rec("s2")); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("second Create = %v, want AlreadyExists", err)
	}
	// The holder column, which the trigger on helm's rows checks, and the
	// version, which every write changes.
	column := func(what string) (string, int64) {
		t.Helper()
		var holder string
		var version int64
		if err := f.store.DB().QueryRowContext(ctx, `SELECT holder, version FROM `+sqlstore.TableLocks+` WHERE namespace = 'shop' AND name = 'x'`).Scan(&holder, &version); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return holder, version
	}
	h0, v0 := column("created")
	ws := []lock.Waiter{{Session: "w", EnqueuedAt: now, HeartbeatAt: now, ExpiresAt: now.Add(time.Minute)}}
	q1, err := st.Enqueue(ctx, c1, ws)
	if err != nil {
		t.Fatal(err)
	}
	if h1, v1 := column("queued"); h0 != "s1" || h1 != "s1" || v1 == v0 || q1.Raw != c1.Raw {
		t.Fatalf("holder column %q when created, %q once a waiter queued (version %d, then %d), record %s then %s; want s1 both times, a new version, the record kept",
			h0, h1, v0, v1, c1.Raw, q1.Raw)
	}
	if _, err := st.Take(ctx, c1, rec("s2"), nil); !apierrors.IsConflict(err) {
		t.Fatalf("Take from a stale read = %v, want Conflict", err)
	}
	got, err := st.Read(ctx, "x")
	if err != nil || lock.HolderOf(&got.Spec) != "s1" || len(got.Queue) != 1 || got.Queue[0].Session != "w" {
		t.Fatalf("Read = %+v, %v; want s1 holding, w queued", got, err)
	}
	released := rec("s1")
	released.ReleasedAt = now.Add(time.Second)
	r1, err := st.Release(ctx, q1, released, "")
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := column("released"); lock.HolderOf(&r1.Spec) != "" || len(r1.Queue) != 1 || h != "" {
		t.Fatalf("released row = %+v, holder column %q; want no holder, the queue kept", r1, h)
	}
	if _, err := st.Read(ctx, "y"); !apierrors.IsNotFound(err) {
		t.Fatalf("Read of a missing row = %v, want NotFound", err)
	}
	if _, err := f.store.Locks("other").Read(ctx, "x"); !apierrors.IsNotFound(err) {
		t.Fatalf("Read in another namespace = %v, want NotFound", err)
	}
	all, err := f.store.Locks("").List(ctx)
	if err != nil || len(all) != 1 || all[0].Namespace != "shop" || all[0].Name != "x" {
		t.Fatalf("List of every namespace = %v, %v; want the one row", all, err)
	}
	if none, err := f.store.Locks("other").List(ctx); err != nil || len(none) != 0 {
		t.Fatalf("List of another namespace = %v, %v; want none", none, err)
	}
	if err := st.Delete(ctx, q1); !apierrors.IsConflict(err) {
		t.Fatalf("Delete from a stale read = %v, want Conflict", err)
	}
	if err := st.Delete(ctx, r1); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctx, r1); !apierrors.IsNotFound(err) {
		t.Fatalf("Delete of a deleted row = %v, want NotFound", err)
	}
	if _, err := st.Renew(ctx, r1, rec("s1")); !apierrors.IsNotFound(err) {
		t.Fatalf("Renew of a deleted row = %v, want NotFound", err)
	}
}

// TestTriggerFencesHelmsWrites: helm's own driver, on a connection that
// names a session, writes a release's rows only while that session holds
// the release's lock row; stock helm (no session) is not fenced; each
// write's session is what the history reads.
func TestTriggerFencesHelmsWrites(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const ns, rel = "shop", "web"
	if err := f.store.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	a, b := helmAs(t, f.dsn, ns, "session-a"), helmAs(t, f.dsn, ns, "session-b")

	// No lock row: a session's write is refused.
	err := a.Create(key(rel, 1), release(rel, ns, 1, common.StatusPendingInstall))
	if !sqlstore.IsRefused(err) {
		t.Fatalf("a write with no lock row = %v, want the trigger's refusal", err)
	}
	lockRow(t, ctx, f.store, ns, rel, "session-a")
	if err := a.Create(key(rel, 1), release(rel, ns, 1, common.StatusPendingInstall)); err != nil {
		t.Fatalf("the holder's write: %v", err)
	}
	if err := b.Update(key(rel, 1), release(rel, ns, 1, common.StatusDeployed)); !sqlstore.IsRefused(err) {
		t.Fatalf("another session's write = %v, want the trigger's refusal", err)
	}
	hist, err := f.conn.History(ctx, ns, rel)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 1 || hist[0].Status != common.StatusPendingInstall || hist[0].LockSession != "session-a" || hist[0].RecordKind != sqlstore.KindRow {
		t.Fatalf("history = %+v; want revision 1 pending-install written by session-a", hist)
	}
	if hist[0].CreationTimestamp.IsZero() {
		t.Fatal("the revision's write time is unknown")
	}

	// The lock is taken over: the old holder's writes are refused, the
	// new holder's pass.
	lockRow(t, ctx, f.store, ns, rel, "session-b")
	if err := a.Update(key(rel, 1), release(rel, ns, 1, common.StatusDeployed)); !sqlstore.IsRefused(err) {
		t.Fatalf("the old holder's write after a takeover = %v, want the trigger's refusal", err)
	}
	if _, err := a.Delete(key(rel, 1)); !sqlstore.IsRefused(err) {
		t.Fatalf("the old holder's delete after a takeover = %v, want the trigger's refusal", err)
	}

	// Recovery marks it failed as the new holder, conditional on what it
	// read; as the old holder it is refused with lock.ErrLost.
	recs := f.store.Records()
	now, err := f.conn.ServerNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := recovery.MarkFailedHeld(ctx, recs, ns, hist[0], "session-a", "x", now.Latest); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("marking failed as the old holder = %v, want lock.ErrLost", err)
	}
	if _, err := recovery.MarkFailed(ctx, recs, ns, hist[0], "x", now.Latest); err == nil {
		t.Fatal("an unfenced write (no session) to the sql driver's rows succeeded")
	}
	if _, err := recovery.MarkFailedHeld(ctx, recs, ns, hist[0], "session-b", "recovered", now.Latest); err != nil {
		t.Fatalf("marking failed as the holder: %v", err)
	}
	if _, err := recovery.MarkFailedHeld(ctx, recs, ns, hist[0], "session-b", "again", now.Latest); !errors.Is(err, recovery.ErrNotPending) {
		t.Fatalf("marking it failed again = %v, want ErrNotPending", err)
	}
	got, err := a.Get(key(rel, 1))
	if err != nil {
		t.Fatal(err)
	}
	if r := got.(*rspb.Release); r.Info.Status != common.StatusFailed || r.Info.Description != "recovered" {
		t.Fatalf("helm reads revision 1 as %s %q, want failed \"recovered\"", r.Info.Status, r.Info.Description)
	}

	// A conditional write at a stale read is a conflict.
	stale := hist[0]
	lockRow(t, ctx, f.store, ns, rel, "session-b")
	if err := b.Update(key(rel, 1), release(rel, ns, 1, common.StatusPendingUpgrade)); err != nil {
		t.Fatal(err)
	}
	if _, err := recovery.MarkFailedHeld(ctx, recs, ns, stale, "session-b", "x", now.Latest); !errors.Is(err, recovery.ErrConflict) {
		t.Fatalf("marking failed at a stale read = %v, want ErrConflict", err)
	}

	// Stock helm names no session and is not fenced; its write names none.
	stock := helmAs(t, f.dsn, ns, "")
	if err := stock.Create(key(rel, 2), release(rel, ns, 2, common.StatusPendingUpgrade)); err != nil {
		t.Fatalf("stock helm's write: %v", err)
	}
	hist, err = f.conn.History(ctx, ns, rel)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 2 || hist[1].Revision != 2 || hist[1].LockSession != "" {
		t.Fatalf("history = %+v; want revision 2 written by no session", hist)
	}
}

// TestRowsWrittenBeforeTheTrigger: rows helm wrote before the trigger
// existed are aged from the first time a client read them.
func TestRowsWrittenBeforeTheTrigger(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const ns, rel = "shop", "old"
	if err := helmAs(t, f.dsn, ns, "").Create(key(rel, 1), release(rel, ns, 1, common.StatusPendingInstall)); err != nil {
		t.Fatal(err)
	}
	before, err := f.conn.ServerNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hist, err := f.conn.History(ctx, ns, rel)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 1 || hist[0].LockSession != "" || hist[0].CreationTimestamp.Before(before.Earliest.Add(-time.Second)) {
		t.Fatalf("history = %+v; want revision 1 by no session, first seen no earlier than %s", hist, before.Earliest)
	}
}

// TestLockTakenInRows: the lock, kept in the rows (lock.StoreSQL), excludes
// a second client as the Lease does.
func TestLockTakenInRows(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	// The release backend takes the lock row alone, the lease backend the
	// lock row and then the Lease.
	for b, want := range map[string][]string{
		protocol.BackendRelease: {string(lock.StoreSQL)},
		protocol.BackendLease:   {string(lock.StoreSQL), string(lock.StoreLease)},
	} {
		chosen, got, err := f.conn.Stores(ctx, f.ns, b)
		if err != nil {
			t.Fatal(err)
		}
		if kinds := got.Kinds(); chosen != b || !slices.Equal(kinds, want) {
			t.Fatalf("--lock-backend=%s with sql = %s %v, want %v", b, chosen, kinds, want)
		}
	}
	// The lock row alone excludes a second client too.
	rows, err := f.conn.GateBackend()
	if err != nil {
		t.Fatal(err)
	}
	req := lock.Request{Release: "web", Namespace: f.ns, Operation: lock.OpUpgrade, LeaseDuration: 30 * time.Second}
	first, _, err := rows.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = rows.TryAcquire(ctx, req)
	if _, ok := protocol.IsLocked(err); !ok {
		t.Fatalf("a second Acquire = %v, want locked", err)
	}
	// The row names the holder, which is what the trigger checks.
	l, err := f.store.Locks(f.ns).Read(ctx, lock.LeaseName("web"))
	if err != nil || lock.HolderOf(&l.Spec) != first.Session() {
		t.Fatalf("lock row = %+v, %v; want holder %s", l, err, first.Session())
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	again, _, err := rows.TryAcquire(ctx, req)
	if err != nil {
		t.Fatalf("Acquire after the release: %v", err)
	}
	_ = again.Release(ctx)
}

// TestWriteTimeIsCommitTime: a row's write is noted when its transaction
// commits, not when its statement ran: helm's create is a transaction, and
// a row noted at its insert would look older than it is once it becomes
// visible (a stock helm stalled between the two would have its live
// revision recovered by age).
func TestWriteTimeIsCommitTime(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if err := f.store.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	db := f.store.DB()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `INSERT INTO releases_v1 ("key", type, body, name, namespace, version, status, owner, createdat, modifiedat)
		VALUES ('sh.helm.release.v1.slow.v1', 'helm.sh/release.v1', 'x', 'slow', 'shop', 1, 'pending-install', 'helm', 0, 0)`); err != nil {
		t.Fatal(err)
	}
	var beforeCommit time.Time
	if err := db.QueryRowContext(ctx, `SELECT clock_timestamp()`).Scan(&beforeCommit); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var written time.Time
	if err := db.QueryRowContext(ctx, `SELECT written_at FROM helm_autorecover_writes_v1 WHERE "key" = 'sh.helm.release.v1.slow.v1'`).Scan(&written); err != nil {
		t.Fatal(err)
	}
	if written.Before(beforeCommit) {
		t.Fatalf("the row's write is noted at %s, before its transaction committed (after %s)", written, beforeCommit)
	}
}

// TestOlderPendingRevisionsRecovered: recovery under a lock kept in the
// database marks the pending revision and an older one left pending too,
// writing both as the holder (the trigger refuses a write that names no
// session); stock helm's uninstalling revision has a known age.
func TestOlderPendingRevisionsRecovered(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	ns := f.ns
	const rel = "strays"
	stock := helmAs(t, f.dsn, ns, "")
	if err := f.store.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	for rev, st := range map[int]common.Status{1: common.StatusPendingInstall, 2: common.StatusPendingUpgrade} {
		if err := stock.Create(key(rel, rev), release(rel, ns, rev, st)); err != nil {
			t.Fatal(err)
		}
	}
	l, err := f.conn.Take(ctx, protocol.Request{Release: rel, Namespace: ns, Operation: protocol.OpUpgrade, LeaseDuration: 30 * time.Second, Backend: protocol.BackendRelease})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx) }()
	// Ages are whole seconds: the revisions are old enough a moment on.
	var out protocol.Outcome
	for range 20 {
		out, err = l.Recover(ctx, protocol.Procedure{Policy: recovery.Policy{Autorecover: true, LegacyAfter: time.Nanosecond}, Next: lock.OpRollback})
		if err != nil {
			t.Fatalf("recovery: %v (decision: %s)", err, out.Decision.Reason)
		}
		if out.Decision.Verdict != recovery.Blocked || out.Decision.RetryAfter <= 0 {
			break
		}
		time.Sleep(out.Decision.RetryAfter)
	}
	if len(out.Marked) != 2 {
		t.Fatalf("marked %d revisions, want 2: %s", len(out.Marked), out.Decision.Reason)
	}
	hist, err := f.conn.History(ctx, ns, rel)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hist {
		if h.Status != common.StatusFailed || h.LockSession != l.Session() {
			t.Errorf("revision %d is %s written by %q; want failed, written by the holder %s", h.Revision, h.Status, h.LockSession, l.Session())
		}
	}

	// An interrupted uninstall stock helm left: its age is known.
	if err := stock.Update(key(rel, 2), release(rel, ns, 2, common.StatusUninstalling)); err != nil {
		t.Fatal(err)
	}
	if hist, err = f.conn.History(ctx, ns, rel); err != nil {
		t.Fatal(err)
	}
	if last := hist[len(hist)-1]; last.Status != common.StatusUninstalling || last.LastWriteTime.IsZero() {
		t.Fatalf("revision 2 = %s, last written %s; want uninstalling with a known write time", last.Status, last.LastWriteTime)
	}
}

// TestCheckSession: a store whose connections do not name the command's
// session is refused (helm's writes would not be fenced); one that does
// passes.
func TestCheckSession(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if err := f.store.CheckSession(ctx, "S"); !errors.Is(err, sqlstore.ErrNoSession) {
		t.Fatalf("CheckSession on a connection naming no session = %v, want ErrNoSession", err)
	}
	dsn, err := sqlstore.WithSession(f.dsn, "S")
	if err != nil {
		t.Fatal(err)
	}
	st, err := sqlstore.Open(dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	if err := st.CheckSession(ctx, "S"); err != nil {
		t.Fatalf("CheckSession on a connection naming S: %v", err)
	}
	if err := st.CheckSession(ctx, "T"); !errors.Is(err, sqlstore.ErrNoSession) {
		t.Fatalf("CheckSession(T) on a connection naming S = %v, want ErrNoSession", err)
	}
}

// TestTablesBesideHelmsTable: with helm's table in another schema (a
// search_path in the connection's options), helm-autorecover's tables and
// triggers go beside it, and a writer whose search_path differs (stock
// helm as another client) still writes through the trigger.
func TestTablesBesideHelmsTable(t *testing.T) {
	env := testenv.Get(t)
	base := env.Postgres(t)
	ctx := context.Background()
	plain, err := sqlstore.Open(base, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = plain.Close() }()
	if _, err := plain.DB().ExecContext(ctx, `CREATE SCHEMA helmschema`); err != nil {
		t.Fatal(err)
	}
	dsn := base + " options='-c search_path=helmschema'"
	if _, err := driver.NewSQL(dsn, "default"); err != nil {
		t.Fatal(err)
	}
	st, err := sqlstore.Open(dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	if err := st.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	var locks, public bool
	if err := plain.DB().QueryRowContext(ctx, `SELECT to_regclass('helmschema.helm_autorecover_locks_v1') IS NOT NULL, to_regclass('public.helm_autorecover_locks_v1') IS NOT NULL`).Scan(&locks, &public); err != nil {
		t.Fatal(err)
	}
	if !locks || public {
		t.Fatalf("lock table in helmschema: %v, in public: %v; want it beside helm's table only", locks, public)
	}
	if _, err := plain.DB().ExecContext(ctx, `INSERT INTO helmschema.releases_v1 ("key", type, body, name, namespace, version, status, owner, createdat, modifiedat)
		VALUES ('sh.helm.release.v1.web.v1', 'helm.sh/release.v1', 'x', 'web', 'shop', 1, 'deployed', 'helm', 0, 0)`); err != nil {
		t.Fatalf("a write from another search_path: %v", err)
	}
}

// TestDisabledTriggerRecreated: a fence trigger switched off (or set to
// fire for replicas only) is found by the next client's schema check and
// created again, so writes are fenced again.
func TestDisabledTriggerRecreated(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if err := f.store.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	for _, off := range []string{"DISABLE TRIGGER", "ENABLE REPLICA TRIGGER"} {
		if _, err := f.store.DB().ExecContext(ctx, `ALTER TABLE releases_v1 `+off+` helm_autorecover_fence_v1`); err != nil {
			t.Fatal(err)
		}
		next, err := sqlstore.Open(f.dsn, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := next.EnsureSchema(ctx); err != nil {
			t.Fatal(err)
		}
		_ = next.Close()
		err = helmAs(t, f.dsn, "shop", "nobody").Create(key("web", 1), release("web", "shop", 1, common.StatusPendingInstall))
		if !sqlstore.IsRefused(err) {
			t.Fatalf("after %s and a client's schema check, a write with no lock = %v, want the trigger's refusal", off, err)
		}
	}
}

// TestLockRowHolderItsRecordDoesNotName: a row whose holder column, which
// the trigger checks, names a session its record does not (a row of the
// earlier layout, which kept a Lease object; a row edited by hand) is held
// by that session with no expiry: never judged free from the record alone
// while the trigger lets that session write. The lock's ForceRelease of
// that session clears it.
func TestLockRowHolderItsRecordDoesNotName(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if err := f.store.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	live := lock.Record{
		Schema: lock.SchemaVersion, Session: "old-session", Operation: lock.OpUpgrade, Release: "web", Namespace: f.ns,
		LeaseDuration: metav1.Duration{Duration: time.Hour}, AcquiredAt: now, RenewedAt: now, LockedTill: now.Add(time.Hour),
	}
	enc, err := live.Encode()
	if err != nil {
		t.Fatal(err)
	}
	// The earlier layout: the Lease object the lease store keeps.
	earlier := coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: lock.LeaseName("web"), Namespace: f.ns, Labels: lock.LockLabels("web"), Annotations: map[string]string{lock.AnnotationRecord: enc}},
	}
	lock.ApplyHolder(&earlier.Spec, &live)
	leaseJSON, err := json.Marshal(earlier)
	if err != nil {
		t.Fatal(err)
	}
	released := live
	released.ReleasedAt = now
	relEnc, err := released.Encode()
	if err != nil {
		t.Fatal(err)
	}
	handEdited, err := json.Marshal(map[string]string{"record": relEnc})
	if err != nil {
		t.Fatal(err)
	}
	for name, object := range map[string]string{"earlier layout": string(leaseJSON), "released record, holder set by hand": string(handEdited)} {
		t.Run(name, func(t *testing.T) {
			if _, err := f.store.DB().ExecContext(ctx, `DELETE FROM helm_autorecover_locks_v1`); err != nil {
				t.Fatal(err)
			}
			if _, err := f.store.DB().ExecContext(ctx, `INSERT INTO helm_autorecover_locks_v1 (namespace, name, release, holder, version, uid, object)
				VALUES ($1, $2, 'web', 'old-session', nextval('helm_autorecover_rv_v1'), 'uid-1', $3)`, f.ns, lock.LeaseName("web"), object); err != nil {
				t.Fatal(err)
			}
			l, err := f.store.Locks(f.ns).Read(ctx, lock.LeaseName("web"))
			if err != nil {
				t.Fatal(err)
			}
			if h := lock.HolderOf(&l.Spec); h != "old-session" || l.RecordErr == nil {
				t.Fatalf("row read as held by %q (record error %v); want old-session, the row named as not agreeing with its record", h, l.RecordErr)
			}
			rows, err := f.conn.GateBackend()
			if err != nil {
				t.Fatal(err)
			}
			req := lock.Request{Release: "web", Namespace: f.ns, Operation: lock.OpUpgrade, LeaseDuration: 30 * time.Second}
			if held, _, err := rows.TryAcquire(ctx, req); err == nil {
				_ = held.Release(ctx)
				t.Fatal("the lock of a row whose holder column names old-session was taken")
			} else if _, ok := protocol.IsLocked(err); !ok {
				t.Fatalf("TryAcquire = %v, want locked", err)
			}
			if _, err := rows.ForceRelease(ctx, f.ns, "web", "old-session", "test"); err != nil {
				t.Fatalf("unlock --force of old-session: %v", err)
			}
			held, _, err := rows.TryAcquire(ctx, req)
			if err != nil {
				t.Fatalf("TryAcquire after unlock --force: %v", err)
			}
			_ = held.Release(ctx)
		})
	}
}
