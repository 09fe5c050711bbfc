package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// The caps of issue 18: a lock must never be what fills etcd.
const (
	// maxRecordWritesWhileHeld: writes to the release's records between
	// the holder's take and its release, whatever the number of waiters
	// (helm's own: the pending revision, its final status, the superseded
	// one).
	maxRecordWritesWhileHeld = 3
	// maxRecordWritesPerUpgrade: take, create, supersede, final status,
	// release.
	maxRecordWritesPerUpgrade = 5
	// maxLockObjectBytes: every write of renewal or waiting traffic (the
	// beat object, the Lease).
	maxLockObjectBytes = 2048
)

// TestLockTrafficStaysSmall is issue 18's scenario, counted from the API
// server's audit log: a release whose record is near 1 MiB, a holder that
// works for 20 s renewing every 3 s, and five waiters with --lock-timeout
// queued behind it. Waiting and renewing must not rewrite the record: at
// most 3 record writes while the holder works (helm's own), at most 5 per
// upgrade, and every write of the lock's small objects under 2 KB. Both
// backends.
func TestLockTrafficStaysSmall(t *testing.T) {
	for _, backend := range []string{"release", "lease"} {
		t.Run(backend, func(t *testing.T) { lockTraffic(t, backend, 5) })
	}
}

func lockTraffic(t *testing.T, backend string, waiters int) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	chart := env.Chart("app")
	ns := env.Namespace(t)
	const rel = "big"
	auditLog := testenv.AuditLog()
	if _, err := os.Stat(auditLog); err != nil {
		t.Fatalf("this test reads the local cluster's audit log: %v", err)
	}
	blob := bigValue(t, 800_000)
	common := []string{"-n", ns, "--lock-backend", backend, "--set-file", "blob=" + blob}
	as := func(user string) []string {
		return []string{"--kube-as-user", user, "--kube-as-group", "system:masters"}
	}
	mustRun(t, env, ha, args([]string{"install", rel, chart}, common, as("setup"))...)
	size := recordSize(t, env, ns, rel, 1)
	if size < 700_000 {
		t.Fatalf("the release record is %d bytes; the scenario needs one near 1 MiB", size)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	meter, err := testenv.StartMeter(ctx, env.Client, ns)
	if err != nil {
		t.Fatal(err)
	}
	defer meter.Stop()

	holder := env.Start(t, ha, args([]string{"upgrade", rel, chart, "--wait", "--timeout", "20s", "--lease-duration", "9s", "--set", "message=holder"},
		common, unschedulable, as("holder"))...)
	waitForWriterIn(t, env, recordLock, ns, rel, 2, time.Minute)
	procs := make([]*testenv.Proc, waiters)
	for i := range procs {
		procs[i] = env.Start(t, ha, args([]string{"upgrade", rel, chart, "--lock-timeout", "3m", "--lease-duration", "9s", "--set", fmt.Sprintf("message=waiter%d", i)},
			common, as(fmt.Sprintf("waiter-%d", i)))...)
	}
	if code := holder.Wait(t, 2*time.Minute); code == 0 {
		t.Fatalf("the holder's upgrade waited on pods that never schedule and succeeded:\n%s", holder.Stderr.String())
	}
	for i, p := range procs {
		if code := p.Wait(t, 3*time.Minute); code != 0 {
			t.Fatalf("waiter %d: exit %d\n%s", i, code, p.Stderr.String())
		}
	}
	if revs := revisions(t, env, ns, rel); len(revs) != 2+waiters {
		t.Fatalf("history has %d revisions; want %d (install, the holder's, one per waiter)", len(revs), 2+waiters)
	}

	isRecord := func(name string) bool { return strings.HasPrefix(name, "sh.helm.release.v1."+rel+".v") }
	writes := readAuditWrites(t, auditLog, ns)
	byUser := map[string][]auditEvent{}
	var recordWrites []auditEvent
	for _, w := range writes {
		u := w.ImpersonatedUser.Username
		byUser[u] = append(byUser[u], w)
		if w.ObjectRef.Resource == "secrets" && isRecord(w.ObjectRef.Name) && u != "setup" {
			recordWrites = append(recordWrites, w)
		}
	}
	// The holder's first and last record writes are its take and its
	// release of the lock (the gate on the newest record).
	var take, release *auditEvent
	for i, w := range byUser["holder"] {
		if w.ObjectRef.Resource == "secrets" && isRecord(w.ObjectRef.Name) {
			if take == nil {
				take = &byUser["holder"][i]
			}
			release = &byUser["holder"][i]
		}
	}
	if take == nil || take == release {
		t.Fatalf("the audit log shows %v as the holder's record writes; want its take and its release", byUser["holder"])
	}
	whileHeld, waiterRecordWrites := 0, 0
	for _, w := range recordWrites {
		if w.RequestReceived.After(take.StageTimestamp) && w.StageTimestamp.Before(release.RequestReceived) {
			whileHeld++
			if w.ImpersonatedUser.Username != "holder" {
				waiterRecordWrites++
				t.Errorf("%s wrote %s (%s) while the holder held the release", w.ImpersonatedUser.Username, w.ObjectRef.Name, w.Verb)
			}
		}
	}
	if whileHeld > maxRecordWritesWhileHeld {
		t.Errorf("%d writes to the release's records while the holder worked, with %d waiters; want at most %d", whileHeld, waiters, maxRecordWritesWhileHeld)
	}
	upgrades := 1 + waiters
	for _, u := range append([]string{"holder"}, waiterNames(waiters)...) {
		n := 0
		for _, w := range byUser[u] {
			if w.ObjectRef.Resource == "secrets" && isRecord(w.ObjectRef.Name) {
				n++
			}
		}
		if n > maxRecordWritesPerUpgrade {
			t.Errorf("%s's upgrade wrote the release's records %d times; want at most %d", u, n, maxRecordWritesPerUpgrade)
		}
	}

	// Bytes, from the watch: every write of the lock's small objects, and
	// the holder's renewals among them.
	if err := meter.WaitFor(ctx, "secrets", recordName(rel, 2+waiters), 3); err != nil {
		t.Fatal(err)
	}
	lockWrites, lockBytes, maxLock, recordBytes, holderRenewals := 0, 0, 0, 0, 0
	for _, w := range meter.Writes() {
		switch {
		case w.Name == lock.LeaseName(rel):
			lockWrites++
			lockBytes += w.Bytes
			maxLock = max(maxLock, w.Bytes)
			if w.Bytes > maxLockObjectBytes {
				t.Errorf("a write of %s %s was %d bytes; want at most %d", w.Resource, w.Name, w.Bytes, maxLockObjectBytes)
			}
		case w.Resource == "secrets" && isRecord(w.Name):
			recordBytes += w.Bytes
		}
	}
	for _, w := range byUser["holder"] {
		if w.ObjectRef.Name == lock.LeaseName(rel) && w.Verb == "update" {
			holderRenewals++
		}
	}
	// A 9 s lease renews every 3 s: about six renewals in 20 s. Without
	// them the holder would not have kept its lock, and this test would
	// prove nothing about where renewals go. (A 6 s lease, a renew
	// deadline 5 s after the last renewal was sent, lost a waiter's lock
	// once while the whole suite loaded the 2-core machine.)
	if holderRenewals < 4 {
		t.Errorf("the holder wrote the lock's small objects %d times in 20 s; want its renewals there (at least 4)", holderRenewals)
	}
	if lockWrites == 0 {
		t.Error("the meter saw no write of the lock's small objects")
	}
	figure(t, "lock traffic (%s backend, record %d KB, %d waiters): %d record writes while the holder worked (%d by waiters), %.1f record writes per upgrade (%d in all), %d writes of the lock's small objects (%d renewals by the holder), largest %d bytes, %d KB in all; records %d KB in all",
		backend, size/1000, waiters, whileHeld, waiterRecordWrites, float64(len(recordWrites))/float64(upgrades), len(recordWrites),
		lockWrites, holderRenewals, maxLock, lockBytes/1000, recordBytes/1000)
}

func waiterNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("waiter-%d", i)
	}
	return out
}

func recordName(rel string, rev int) string {
	return fmt.Sprintf("sh.helm.release.v1.%s.v%d", rel, rev)
}

// bigValue writes n bytes of incompressible text for --set-file: helm
// stores it in the release's record, which then is about as large.
func bigValue(t *testing.T, n int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "blob.txt")
	if err := os.WriteFile(p, testenv.Incompressible(n), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// recordSize is the size of revision rev's record as stored (its release
// payload).
func recordSize(t *testing.T, env *testenv.Env, ns, rel string, rev int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := env.Client.CoreV1().Secrets(ns).Get(ctx, recordName(rel, rev), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading revision %d of %s/%s: %v", rev, ns, rel, err)
	}
	return len(s.Data["release"])
}
