package e2e

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestRecoverStrategyRollback: with --recover-strategy=rollback, recovery
// marks the abandoned revision failed, rolls back to the last deployed
// revision, then runs the requested upgrade; history tells all three steps.
func TestRecoverStrategyRollback(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	ns := env.Namespace(t)
	const rel = "strategy"
	chart := env.Chart("app")
	lease := []string{"--lease-duration", "3s"}
	mustRun(t, env, bin, args([]string{"install", rel, chart, "-n", ns, "--wait", "--timeout", "60s"}, lease)...)
	p := env.Start(t, bin, args([]string{"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m", "--set", "nodeSelector.never=matches"}, lease)...)
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
	p.Kill(t)

	res := mustRun(t, env, bin, args([]string{
		"upgrade", rel, chart, "-n", ns, "--set", "message=v3", "--wait", "--timeout", "60s",
		"--lock-timeout", "30s", "--recover-strategy", "rollback",
	}, lease)...)
	if !strings.Contains(res.Stderr, "rolling release \"strategy\" back to revision 1") {
		t.Fatalf("no rollback announced on stderr:\n%s", res.Stderr)
	}
	revs := wantHistory(t, env, ns, rel, "1:superseded 2:failed 3:superseded 4:deployed")
	if !strings.Contains(revs[2].Description, "Rollback to 1") {
		t.Fatalf("revision 3 description = %q, want helm's rollback to 1", revs[2].Description)
	}
}

// TestRecoverStrategyRollbackKeepsData: helm's rollback would delete a
// PersistentVolumeClaim that only the abandoned revision created; recovery
// keeps it (S7, without --recover-delete-data), so the release is set back
// to the last deployed state without helm's rollback, and stderr says why.
func TestRecoverStrategyRollbackKeepsData(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	ns := env.Namespace(t)
	const rel = "keepdata"
	chart := env.Chart("app")
	lease := []string{"--lease-duration", "3s"}
	mustRun(t, env, bin, args([]string{"install", rel, chart, "-n", ns, "--wait", "--timeout", "60s"}, lease)...)
	p := env.Start(t, bin, args([]string{"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m", "--set", "claim=true"}, lease)...)
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
	claim := waitForClaim(t, env, ns, rel+"-data")
	p.Kill(t)

	res := mustRun(t, env, bin, args([]string{
		"upgrade", rel, chart, "-n", ns, "--set", "message=v3", "--wait", "--timeout", "60s",
		"--lock-timeout", "30s", "--recover-strategy", "rollback",
	}, lease)...)
	if !strings.Contains(res.Stderr, "not rolled back") || !strings.Contains(res.Stderr, "PersistentVolumeClaim "+ns+"/"+rel+"-data") {
		t.Fatalf("stderr does not say why the release was not rolled back:\n%s", res.Stderr)
	}
	wantHistory(t, env, ns, rel, "1:superseded 2:failed 3:deployed")
	after, err := env.Client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), rel+"-data", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the claim only the abandoned revision created is gone: %v", err)
	}
	if after.UID != claim {
		t.Fatalf("the claim was deleted and created again (uid %s, was %s)", after.UID, claim)
	}
}

// TestRecoverStrategyRollbackBeforeUpgrade: an object only the abandoned
// revision created, which the upgrade that follows renders again, is not
// deleted by a rollback first and created again by the upgrade (a
// LoadBalancer's address, a volume's data would go with it): the rollback
// is left out, and said; the upgrade adopts the object as it is.
func TestRecoverStrategyRollbackBeforeUpgrade(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	ns := env.Namespace(t)
	const rel = "rbupgrade"
	chart := env.Chart("app")
	lease := []string{"--lease-duration", "3s"}
	mustRun(t, env, bin, args([]string{"install", rel, chart, "-n", ns, "--wait", "--timeout", "60s"}, lease)...)
	p := env.Start(t, bin, args([]string{"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m", "--set", "extraConfigMap=true", "--set", "nodeSelector.never=matches"}, lease)...)
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
	extra := waitForConfigMap(t, env, ns, rel+"-extra")
	p.Kill(t)

	res := mustRun(t, env, bin, args([]string{
		"upgrade", rel, chart, "-n", ns, "--set", "extraConfigMap=true", "--wait", "--timeout", "60s",
		"--lock-timeout", "30s", "--recover-strategy", "rollback",
	}, lease)...)
	if !strings.Contains(res.Stderr, "not rolled back") || !strings.Contains(res.Stderr, "ConfigMap "+ns+"/"+rel+"-extra") {
		t.Fatalf("stderr does not say why the release was not rolled back:\n%s", res.Stderr)
	}
	wantHistory(t, env, ns, rel, "1:superseded 2:failed 3:deployed")
	after, err := env.Client.CoreV1().ConfigMaps(ns).Get(t.Context(), rel+"-extra", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the ConfigMap the upgrade renders again is gone: %v", err)
	}
	if after.UID != extra {
		t.Fatalf("the ConfigMap was deleted and created again (uid %s, was %s)", after.UID, extra)
	}
}

// waitForConfigMap waits until helm has created the ConfigMap and returns
// its UID.
func waitForConfigMap(t *testing.T, env *testenv.Env, ns, name string) types.UID {
	t.Helper()
	return waitForUID(t, "ConfigMap "+ns+"/"+name, func() (metav1.Object, error) {
		return env.Client.CoreV1().ConfigMaps(ns).Get(t.Context(), name, metav1.GetOptions{})
	})
}

// waitForClaim waits until helm has created the claim and returns its UID.
func waitForClaim(t *testing.T, env *testenv.Env, ns, name string) types.UID {
	t.Helper()
	return waitForUID(t, "claim "+ns+"/"+name, func() (metav1.Object, error) {
		return env.Client.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), name, metav1.GetOptions{})
	})
}

// waitForUID waits up to a minute until get finds the object (what names
// it) and returns its UID.
func waitForUID(t *testing.T, what string, get func() (metav1.Object, error)) types.UID {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		o, err := get()
		if err == nil {
			return o.GetUID()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not created: %v", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestLockMaxHold: an operation that holds its lock longer than
// --lock-max-hold is aborted with exit code 6; its revision ends failed and
// the lock is free, so the next operation runs at once.
func TestLockMaxHold(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	ns := env.Namespace(t)
	const rel = "maxhold"
	chart := env.Chart("app")
	mustRun(t, env, bin, "install", rel, chart, "-n", ns, "--wait", "--timeout", "60s")
	start := time.Now()
	p := env.Start(t, bin, "upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m",
		"--set", "nodeSelector.never=matches", "--lease-duration", "3s", "--lock-max-hold", "6s")
	if code := p.Wait(t, 60*time.Second); code != exitcode.MaxHold {
		t.Fatalf("exit code = %d, want %d; stderr:\n%s", code, exitcode.MaxHold, p.Stderr.String())
	}
	figure(t, "max-hold 6s: aborted after %s", secs(time.Since(start)))
	if !strings.Contains(p.Stderr.String(), "--lock-max-hold") {
		t.Fatalf("stderr does not name --lock-max-hold:\n%s", p.Stderr.String())
	}
	wantHistory(t, env, ns, rel, "1:deployed 2:failed")
	if l, _ := lease(t, env, ns, rel); holderOf(l) != "" {
		t.Fatalf("lock still held by %q after the abort", holderOf(l))
	}
	mustRun(t, env, bin, "upgrade", rel, chart, "-n", ns, "--set", "message=after", "--wait", "--timeout", "60s")
	wantHistory(t, env, ns, rel, "1:superseded 2:failed 3:deployed")
}
