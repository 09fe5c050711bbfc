package inspect

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata from the current output")

// golden compares got with testdata/name, or rewrites it under -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (go test -update rewrites it)\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// Server time of every fixture: the API server's clock is known to within
// 200 ms.
var (
	t0  = time.Date(2026, 12, 2, 13, 10, 0, 0, time.UTC)
	now = servertime.Bounds{Earliest: t0, Latest: t0.Add(200 * time.Millisecond)}
)

func at(d time.Duration) time.Time { return t0.Add(d) }

func summary(rel, ns string, rev int, status common.Status, created time.Time) *helmx.Summary {
	return &helmx.Summary{
		RecordName:        helmx.ReleaseSecretName(rel, rev),
		RecordNamespace:   ns,
		Name:              rel,
		Namespace:         ns,
		Revision:          rev,
		Status:            status,
		CreationTimestamp: created,
		ResourceVersion:   "100",
	}
}

// carrying is s whose record carries the lock rec, as a holder's fenced
// create writes it.
func carrying(s *helmx.Summary, rec *lock.Record) *helmx.Summary {
	s.LockSession = rec.Session
	return s
}

func record(rel, ns, session string, op lock.Operation, rev int, acquired, renewed time.Time) *lock.Record {
	return &lock.Record{
		Schema: lock.SchemaVersion, Session: session, Operation: op, Release: rel, Namespace: ns, Revision: rev,
		Who: "alice@ci-7", PID: 4242, ToolVersion: "v0.1.0",
		LeaseDuration: metav1Duration(15 * time.Second),
		AcquiredAt:    acquired, RenewedAt: renewed, LockedTill: renewed.Add(15 * time.Second),
	}
}

func held(rec *lock.Record, state lock.State) *lock.Status {
	return &lock.Status{
		Release: rec.Release, Namespace: rec.Namespace, Exists: true, State: state,
		Record: rec, HolderIdentity: rec.Session, LockedTill: rec.LockedTill, Now: now,
	}
}

// fixtureInputs covers every state and problem a row can show.
func fixtureInputs() []Input {
	live := record("web", "prod", "0f3c6a2e-1111-4a5b-9c8d-000000000001", lock.OpUpgrade, 8, at(-40*time.Second), at(-5*time.Second))
	live.CIJobURL = "https://github.com/acme/web/actions/runs/42"
	liveSt := held(live, lock.Live)
	// bob waits; carol, behind him, asked the holder to stop (--preempt).
	liveSt.Waiters = []lock.Waiter{
		{Session: "5d1e0000-2222-4a5b-9c8d-000000000002", Who: "bob@laptop", Operation: lock.OpUpgrade, EnqueuedAt: at(-3 * time.Second), HeartbeatAt: at(-time.Second), ExpiresAt: at(14 * time.Second)},
		{Session: "a1b20000-8888-4a5b-9c8d-000000000008", Who: "carol@ci-9", Operation: lock.OpUpgrade, EnqueuedAt: at(-2 * time.Second), HeartbeatAt: at(-2 * time.Second), ExpiresAt: at(13 * time.Second), Preempt: true, PreemptHolder: "0f3c6a2e-1111-4a5b-9c8d-000000000001"},
	}

	dead := record("api", "prod", "7a9b0000-3333-4a5b-9c8d-000000000003", lock.OpUpgrade, 3, at(-10*time.Minute), at(-9*time.Minute))
	released := record("db", "prod", "c4d50000-4444-4a5b-9c8d-000000000004", lock.OpInstall, 1, at(-time.Hour), at(-time.Hour))
	released.ReleasedAt = at(-59 * time.Minute)
	corrupt := &lock.Status{
		Release: "cache", Namespace: "prod", Exists: true, State: lock.Live,
		RecordErr: errors.New("decode lock record: invalid character 'x' looking for beginning of value"), HolderIdentity: "e6f70000-5555-4a5b-9c8d-000000000005",
		LockedTill: at(5 * time.Second), Now: now,
	}
	installing := record("new", "staging", "f8090000-6666-4a5b-9c8d-000000000006", lock.OpInstall, 0, at(-2*time.Second), at(-2*time.Second))
	// A rollback, which helm cannot cancel, asked to stop all the same.
	rollingBack := record("jobs", "staging", "b3c40000-9999-4a5b-9c8d-000000000009", lock.OpRollback, 6, at(-20*time.Second), at(-4*time.Second))
	rollingBackSt := held(rollingBack, lock.Live)
	rollingBackSt.Waiters = []lock.Waiter{{Session: "c5d60000-aaaa-4a5b-9c8d-00000000000a", Who: "dave@laptop", Operation: lock.OpUpgrade, EnqueuedAt: at(-time.Second), HeartbeatAt: at(-time.Second), ExpiresAt: at(14 * time.Second), Preempt: true, PreemptHolder: "b3c40000-9999-4a5b-9c8d-000000000009"}}

	return []Input{
		{Lock: liveSt, Release: Release{Name: "web", Namespace: "prod", Latest: summary("web", "prod", 8, common.StatusPendingUpgrade, at(-30*time.Second))}},
		{Lock: held(dead, lock.Expired), Release: Release{Name: "api", Namespace: "prod", Latest: carrying(summary("api", "prod", 3, common.StatusPendingUpgrade, at(-9*time.Minute-30*time.Second)), dead)}},
		{Release: Release{Name: "legacy", Namespace: "prod", Latest: summary("legacy", "prod", 2, common.StatusPendingRollback, at(-4*time.Minute))}},
		{Release: Release{Name: "old", Namespace: "prod", Latest: summary("old", "prod", 5, common.StatusPendingInstall, at(-2*time.Hour))}},
		{Lock: &lock.Status{Release: "db", Namespace: "prod", Exists: true, State: lock.Free, Record: released, Now: now}, Release: Release{Name: "db", Namespace: "prod", Latest: summary("db", "prod", 1, common.StatusDeployed, at(-time.Hour))}},
		{Lock: corrupt, Release: Release{Name: "cache", Namespace: "prod", Latest: summary("cache", "prod", 4, common.StatusDeployed, at(-time.Hour))}},
		{Lock: held(installing, lock.Live), Release: Release{Name: "new", Namespace: "staging"}},
		{Lock: rollingBackSt, Release: Release{Name: "jobs", Namespace: "staging", Latest: summary("jobs", "staging", 6, common.StatusPendingRollback, at(-15*time.Second))}},
		{Release: Release{Name: "broken", Namespace: "staging", Err: errors.New(`reading Secret "sh.helm.release.v1.broken.v1" in namespace "staging": decoding the release payload: not base64 text`)}},
	}
}

func fixtureRows() []Row {
	var rows []Row
	for _, in := range fixtureInputs() {
		in.Now, in.Margin, in.LegacyAfter = now, lock.TakeoverMargin, 15*time.Minute
		rows = append(rows, NewRow(in))
	}
	SortRows(rows)
	return rows
}

func metav1Duration(d time.Duration) metav1.Duration { return metav1.Duration{Duration: d} }
