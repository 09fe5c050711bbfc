package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestFailedRecoveryHandsOn: a client takes over a dead holder's expired
// lock but cannot recover (it may not patch Deployments, so undoing what the
// abandoned revision applied fails). It fails with the reason and leaves the
// revision pending; the next client, with the rights, recovers it at once,
// naming the dead holder, instead of waiting --recover-legacy-after (15 min)
// for a revision pending under a released lock. Under each backend.
func TestFailedRecoveryHandsOn(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	chart := env.Chart("app")
	for _, backend := range []string{"lease", "release"} {
		t.Run(backend, func(t *testing.T) {
			ns := env.Namespace(t)
			const rel = "handon"
			flag := []string{"-n", ns, "--lock-backend", backend}
			mustRun(t, env, ha, args([]string{"install", rel, chart, "--wait", "--timeout", "60s"}, flag)...)
			p := env.Start(t, ha, args([]string{"upgrade", rel, chart, "--wait", "--timeout", "5m", "--lease-duration", "3s", "--set", "message=v2"}, unschedulable, flag)...)
			env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
			read := leaseLock
			if backend == "release" {
				read = recordLock
			}
			dead := waitForWriterIn(t, env, read, ns, rel, 2, 10*time.Second)
			p.Kill(t)

			// Every right of the documented Role, and the chart's, but patch
			// on Deployments.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			rules := append(append([]rbacv1.PolicyRule{}, leaseBackendRules...), chartRules...)
			for i, r := range rules {
				if len(r.Resources) == 1 && r.Resources[0] == "deployments" {
					rules[i].Verbs = []string{"get", "list", "watch", "create", "update", "delete"}
				}
			}
			nopatch := restrictedKubeconfig(ctx, t, env, ns, "nopatch", rules)
			res := env.RunEnv(t, []string{"KUBECONFIG=" + nopatch}, ha, args([]string{"upgrade", rel, chart, "--lock-timeout", "30s", "--set", "message=v3"}, flag)...)
			if res.ExitCode == 0 {
				t.Fatalf("the upgrade that may not patch Deployments succeeded:\n%s", res.Stderr)
			}
			if !strings.Contains(res.Stderr, "patch") || !strings.Contains(res.Stderr, "deployments") {
				t.Errorf("its error does not name the missing right:\n%s", res.Stderr)
			}
			if got := strings.Join(env.Summary(t, ns, rel), " "); got != "1:deployed 2:pending-upgrade" {
				t.Fatalf("history after the failed recovery = %s; want revision 2 still pending", got)
			}

			start := time.Now()
			res = env.Run(t, ha, args([]string{"upgrade", rel, chart, "--set", "message=v4"}, flag)...)
			if res.ExitCode != 0 {
				t.Fatalf("the next upgrade (no --lock-timeout) did not recover at once: exit %d\n%s", res.ExitCode, res.Stderr)
			}
			figure(t, "after a failed recovery (--lock-backend=%s), the next upgrade recovered in %s", backend, secs(time.Since(start)))
			if !strings.Contains(res.Stderr, "recovered") || !strings.Contains(res.Stderr, dead.Session) {
				t.Errorf("the next upgrade does not report recovering the dead session %s:\n%s", dead.Session, res.Stderr)
			}
			revs := wantHistory(t, env, ns, rel, "1:superseded 2:failed 3:deployed")
			abandoned(t, revs[1], "pending-upgrade", dead.Session)
		})
	}
}
