package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestConfigMapDriver is S1, S2 and S6 with helm's configmap storage driver
// (HELM_DRIVER=configmap), for both lock backends: the lock lives on the
// newest release ConfigMap (and, for lease, also in a Lease), stock helm 4
// and 3 stay blocked by our pending revision, and after the holder is
// killed the next upgrade recovers the release from the ConfigMaps alone.
// No release Secret is ever written.
func TestConfigMapDriver(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	chart := env.Chart("app")
	cm := []string{"HELM_DRIVER=configmap"}
	records, err := helmx.NewRecords(env.Client, "configmap")
	if err != nil {
		t.Fatal(err)
	}
	for _, backend := range []string{"release", "lease"} {
		t.Run(backend, func(t *testing.T) {
			ns := env.Namespace(t)
			const rel = "cmdriver"
			run := func(bin string, a ...string) testenv.Result { return env.RunEnv(t, cm, bin, a...) }
			flag := []string{"--lock-backend", backend, "--lease-duration", killLease.String()}
			if res := run(ha, args([]string{"install", rel, chart, "-n", ns, "--wait", "--timeout", "60s"}, flag)...); res.ExitCode != 0 {
				t.Fatalf("install: exit %d\n%s", res.ExitCode, res.Stderr)
			}
			p := env.StartEnv(t, cm, ha, args([]string{"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m", "--set", "message=v2"}, unschedulable, flag)...)
			read := configMapLock(records)
			for deadline := time.Now().Add(60 * time.Second); cmHistory(t, records, ns, rel) != "1:deployed 2:pending-upgrade"; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("history in ConfigMaps never became 1:deployed 2:pending-upgrade: %s", cmHistory(t, records, ns, rel))
				}
			}
			holder := waitForWriterIn(t, env, read, ns, rel, 2, 10*time.Second)
			for _, h := range []struct{ name, bin string }{{"helm4", env.Helm4}, {"helm3", env.Helm3}} {
				res := run(h.bin, "upgrade", rel, chart, "-n", ns, "--set", "message="+h.name)
				if res.ExitCode == 0 || !strings.Contains(res.Stderr, anotherOperation) {
					t.Fatalf("stock %s upgrade while ours runs: exit %d, stderr %q; want %q", h.name, res.ExitCode, res.Stderr, anotherOperation)
				}
			}
			if res := run(ha, "upgrade", rel, chart, "-n", ns, "--set", "message=rival", "--lock-backend", "release"); res.ExitCode != 3 || !strings.Contains(res.Stderr, holder.Session) {
				t.Fatalf("a second live client: exit %d, stderr %q; want exit 3 naming session %s", res.ExitCode, res.Stderr, holder.Session)
			}
			if res := run(ha, "locks", rel, "-n", ns, "-o", "json"); res.ExitCode != 0 || !strings.Contains(res.Stdout, holder.Session) {
				t.Errorf("locks with the configmap driver: exit %d; want session %s in\n%s%s", res.ExitCode, holder.Session, res.Stdout, res.Stderr)
			}

			// As in TestKillRecovers: let the holder renew, so the lock it
			// leaves behind is a renewed one, as in real life.
			waitRenewed(t, func(a ...string) testenv.Result { return run(ha, a...) }, ns, rel, holder.Session)
			killAt := time.Now()
			p.Kill(t)
			res := run(ha, args([]string{"upgrade", rel, chart, "-n", ns, "--lock-timeout", "30s", "--set", "message=v3"}, flag)...)
			took := time.Since(killAt)
			if res.ExitCode != 0 {
				t.Fatalf("upgrade after the kill: exit %d\n%s", res.ExitCode, res.Stderr)
			}
			figure(t, "HELM_DRIVER=configmap --lock-backend=%s: kill to success %s (lease %s)", backend, secs(took), killLease)
			if !strings.Contains(res.Stderr, "recovered") || !strings.Contains(res.Stderr, holder.Session) {
				t.Errorf("the recovering upgrade does not report the recovery of session %s:\n%s", holder.Session, res.Stderr)
			}
			if got := cmHistory(t, records, ns, rel); got != "1:superseded 2:failed 3:deployed" {
				t.Fatalf("history in ConfigMaps after recovery = %s", got)
			}
			hist, err := helmx.ReadHistory(context.Background(), records, ns, rel)
			if err != nil {
				t.Fatal(err)
			}
			abandoned(t, hist[1], "pending-upgrade", holder.Session)
			waitLockFreeIn(t, env, read, ns, rel, 5*time.Second)

			// Stock helm reads what we wrote, recovery included.
			out := run(env.Helm4, "history", rel, "-n", ns)
			if out.ExitCode != 0 || !strings.Contains(out.Stdout, "Abandoned pending-upgrade") {
				t.Errorf("stock helm history with the configmap driver: exit %d\n%s%s", out.ExitCode, out.Stdout, out.Stderr)
			}
			secrets, err := env.Client.CoreV1().Secrets(ns).List(context.Background(), metav1.ListOptions{LabelSelector: helmx.HistorySelector(rel)})
			if err != nil {
				t.Fatal(err)
			}
			if n := len(secrets.Items); n != 0 {
				t.Errorf("%d release Secrets written with HELM_DRIVER=configmap", n)
			}
			l, _ := lease(t, env, ns, rel)
			if backend == "release" && l != nil {
				t.Errorf("--lock-backend=release wrote Lease %s", l.Name)
			}
			if backend == "lease" && l == nil {
				t.Errorf("--lock-backend=lease wrote no Lease")
			}
		})
	}
}

// configMapLock reads the lock from the newest release record of records.
func configMapLock(records helmx.Records) lockReader {
	return func(t *testing.T, _ *testenv.Env, ns, rel string) (string, *lock.Record) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		list, _, err := records.List(ctx, ns, helmx.HistorySelector(rel))
		if err != nil {
			t.Fatalf("reading the %ss of %s/%s: %v", records.Kind(), ns, rel, err)
		}
		var newest *helmx.Record
		for i := range list {
			if newest == nil || list[i].Revision() > newest.Revision() {
				newest = &list[i]
			}
		}
		if newest == nil {
			return "", nil
		}
		v, ok := newest.Meta.Annotations[lock.AnnotationRecord]
		if !ok {
			return "", nil
		}
		rec, err := lock.DecodeRecord(v)
		if err != nil {
			t.Fatalf("lock record on %s: %v", newest.Describe(), err)
		}
		if !rec.ReleasedAt.IsZero() {
			return "", rec
		}
		return rec.Session, rec
	}
}

// cmHistory is "1:deployed 2:failed ..." read from records.
func cmHistory(t *testing.T, records helmx.Records, ns, rel string) string {
	t.Helper()
	hist, err := helmx.ReadHistory(context.Background(), records, ns, rel)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, 0, len(hist))
	for _, h := range hist {
		out = append(out, fmt.Sprintf("%d:%s", h.Revision, h.Status))
	}
	return strings.Join(out, " ")
}
