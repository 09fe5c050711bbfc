package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/guard"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// lockRow is the part of `locks -o json` these tests read.
type lockRow struct {
	Release string `json:"release"`
	State   string `json:"lock_state"`
	Session string `json:"session_id"`
	Status  string `json:"status"`
}

// TestLockCommandsUnderEachRole runs every lock command as a ServiceAccount
// bound to exactly each documented Role (docs/rbac.md, plus the chart's
// rights), with the default --lock-backend=auto: locks, list --locks,
// recover --dry-run, recover and unlock all work on releases a killed
// upgrade of the same user left stuck, and the release backend's user never
// needs a Lease.
func TestLockCommandsUnderEachRole(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	for _, role := range []struct {
		name  string
		rules []rbacv1.PolicyRule
	}{
		{"release", releaseBackendRules},
		{"lease", leaseBackendRules},
	} {
		t.Run(role.name, func(t *testing.T) {
			ns := env.Namespace(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			kc := restrictedKubeconfig(ctx, t, env, ns, "deployer", append(append([]rbacv1.PolicyRule{}, role.rules...), chartRules...))
			run := func(a ...string) testenv.Result {
				return env.RunEnv(t, []string{"KUBECONFIG=" + kc}, bin, append(a, "-n", ns)...)
			}
			chart := env.Chart("app")
			// Two releases, each with an upgrade killed mid-way: one to
			// recover, one to unlock.
			for _, rel := range []string{"torecover", "tounlock"} {
				if res := run("install", rel, chart, "--wait", "--timeout", "60s"); res.ExitCode != 0 {
					t.Fatalf("install %s: exit %d: %s", rel, res.ExitCode, res.Stderr)
				}
				p := env.StartEnv(t, []string{"KUBECONFIG=" + kc}, bin, args([]string{"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m", "--lease-duration", "3s"}, unschedulable)...)
				env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
				waitForWriterIn(t, env, recordLock, ns, rel, 2, 10*time.Second)
				p.Kill(t)
			}
			// locks shows the dead holder from what this user may read,
			// expired once its lease has run out.
			var row lockRow
			deadline := time.Now().Add(60 * time.Second)
			for row.State != "expired" {
				if time.Now().After(deadline) {
					t.Fatalf("locks tounlock never showed the killed holder's lock expired; last %+v", row)
				}
				res := run("locks", "tounlock", "-o", "json")
				if res.ExitCode != 0 {
					t.Fatalf("locks tounlock: exit %d: %s", res.ExitCode, res.Stderr)
				}
				var rows []lockRow
				if err := json.Unmarshal([]byte(res.Stdout), &rows); err != nil || len(rows) != 1 {
					t.Fatalf("locks -o json: %v: %s", err, res.Stdout)
				}
				row = rows[0]
				time.Sleep(200 * time.Millisecond)
			}
			if row.Session == "" || row.Status != "pending-upgrade" {
				t.Fatalf("locks tounlock: %+v; want the killed holder's session on revision 2 pending-upgrade", row)
			}
			for _, a := range [][]string{{"locks"}, {"locks", "--all"}, {"list", "--locks"}, {"locks", "--lock-backend", "release"}} {
				res := run(a...)
				if res.ExitCode != 0 || !strings.Contains(res.Stdout, "tounlock") || !strings.Contains(res.Stdout, row.Session) {
					t.Errorf("%s: exit %d, stdout:\n%s\nstderr:\n%s", strings.Join(a, " "), res.ExitCode, res.Stdout, res.Stderr)
				}
			}
			res := env.RunEnv(t, []string{"KUBECONFIG=" + kc, guard.EnvLockBackend + "=release"}, bin, "locks", "tounlock", "-n", ns)
			if res.ExitCode != 0 || !strings.Contains(res.Stdout, row.Session) {
				t.Errorf("%s=release locks: exit %d: %s%s", guard.EnvLockBackend, res.ExitCode, res.Stdout, res.Stderr)
			}
			if res := run("recover", "torecover", "--dry-run"); res.ExitCode != 0 || !strings.Contains(res.Stdout, "torecover") {
				t.Errorf("recover --dry-run: exit %d: %s%s", res.ExitCode, res.Stdout, res.Stderr)
			}
			if res := run("recover", "torecover"); res.ExitCode != 0 {
				t.Errorf("recover: exit %d: %s%s", res.ExitCode, res.Stdout, res.Stderr)
			}
			if res := run("unlock", "tounlock", "--session", row.Session); res.ExitCode != 0 {
				t.Errorf("unlock: exit %d: %s%s", res.ExitCode, res.Stdout, res.Stderr)
			}
			for _, rel := range []string{"torecover", "tounlock"} {
				if got := strings.Join(env.Summary(t, ns, rel), " "); got != "1:deployed 2:failed" {
					t.Errorf("history of %s = %s; want 1:deployed 2:failed", rel, got)
				}
			}
			if role.name == "release" {
				for _, rel := range []string{"torecover", "tounlock"} {
					if l, _ := lease(t, env, ns, rel); l != nil {
						t.Errorf("a Lease %s exists for a user without rights on Leases", l.Name)
					}
				}
			}
		})
	}
}

// TestNothingLeftForUnknownRelease: upgrade (without --install), rollback
// and uninstall of a release that does not exist, and an install that fails
// before it writes a revision, fail with helm's own error and leave no lock
// object behind, under either backend; locks then calls the release
// unknown (exit 7) and lists nothing.
func TestNothingLeftForUnknownRelease(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	for _, backend := range []string{"lease", "release"} {
		t.Run(backend, func(t *testing.T) {
			ns := env.Namespace(t)
			const rel = "nosuch"
			for _, a := range [][]string{
				{"upgrade", rel, env.Chart("app")},
				{"rollback", rel, "1"},
				{"uninstall", rel},
				{"install", rel, env.Chart("app") + "-missing"},
			} {
				res := env.Run(t, bin, append(a, "-n", ns, "--lock-backend", backend)...)
				if res.ExitCode != exitcode.Failure {
					t.Errorf("%s: exit %d, want helm's %d: %s", strings.Join(a, " "), res.ExitCode, exitcode.Failure, res.Stderr)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if l, _ := lease(t, env, ns, rel); l != nil {
					t.Errorf("%s left Lease %s (holder %q)", a[0], l.Name, holderOf(l))
				}
				if s, err := env.Client.CoreV1().Secrets(ns).Get(ctx, lock.LeaseName(rel), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					t.Errorf("%s left the beat Secret %s (%v)", a[0], s.GetName(), err)
				}
				cancel()
			}
			if res := env.Run(t, bin, "locks", rel, "-n", ns); res.ExitCode != exitcode.NotFound {
				t.Errorf("locks %s: exit %d, want %d: %s%s", rel, res.ExitCode, exitcode.NotFound, res.Stdout, res.Stderr)
			}
			if res := env.Run(t, bin, "locks", "--all", "-n", ns); res.ExitCode != 0 || strings.Contains(res.Stdout, rel) {
				t.Errorf("locks --all: exit %d, lists %s:\n%s", res.ExitCode, rel, res.Stdout)
			}
		})
	}
}

// TestForbiddenKeepsTheServersMessage: a user with no right on helm's
// records gets the API server's own refusal (user, verb, resource,
// namespace) and the rights of the backend in use, not advice about a
// backend it does not use.
func TestForbiddenKeepsTheServersMessage(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	ns := env.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kc := restrictedKubeconfig(ctx, t, env, ns, "nobody", chartRules)
	res := env.RunEnv(t, []string{"KUBECONFIG=" + kc}, bin, "upgrade", "--install", "denied", env.Chart("app"), "-n", ns)
	if res.ExitCode == 0 {
		t.Fatalf("upgrade --install with no right on secrets succeeded")
	}
	for _, want := range []string{`User "system:serviceaccount:` + ns + `:nobody"`, `cannot list resource "secrets"`, `in the namespace "` + ns + `"`, "the release lock backend", "docs/rbac.md"} {
		if !strings.Contains(res.Stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, res.Stderr)
		}
	}
	for _, unwanted := range []string{"unknown (", "use --lock-backend=auto", "Lease", " lease "} {
		if strings.Contains(res.Stderr, unwanted) {
			t.Errorf("stderr has %q:\n%s", unwanted, res.Stderr)
		}
	}
	res = env.RunEnv(t, []string{"KUBECONFIG=" + kc}, bin, "locks", "-n", ns)
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, `cannot list resource "secrets"`) || strings.Contains(res.Stderr, "unknown (") {
		t.Errorf("locks with no right on secrets: exit %d:\n%s", res.ExitCode, res.Stderr)
	}
}

// TestDeadLocalHolderHints: a lease longer than the bound is refused (exit
// 2); a holder killed on this machine under a long lease is named as not
// running, with the unlock command that frees the release; after
// --lock-timeout runs out the flag is not suggested again and no context
// error is printed. (A 45 s lease: long enough that both refusals come
// while the dead holder's lock is live, short enough for the forced unlock,
// which recovers once LOCKED TILL has passed, to finish soon.)
func TestDeadLocalHolderHints(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	ns := env.Namespace(t)
	const rel = "longlease"
	chart := env.Chart("app")
	if res := env.Run(t, bin, "install", rel, chart, "-n", ns, "--lease-duration", "100h"); res.ExitCode != exitcode.Usage || !strings.Contains(res.Stderr, "--lease-duration=100h0m0s: must be at most 10m0s") {
		t.Fatalf("--lease-duration 100h: exit %d: %s", res.ExitCode, res.Stderr)
	}
	mustRun(t, env, bin, "install", rel, chart, "-n", ns)
	p := env.Start(t, bin, args([]string{"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m", "--lease-duration", "45s"}, unschedulable)...)
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
	holder := waitForWriterIn(t, env, recordLock, ns, rel, 2, 10*time.Second)
	p.Kill(t)

	unlock := "helm-autorecover unlock " + rel + " -n " + ns + " --session " + holder.Session + " --force"
	res := env.Run(t, bin, "upgrade", rel, chart, "-n", ns)
	if res.ExitCode != exitcode.Locked {
		t.Fatalf("upgrade under the dead holder's lock: exit %d, want %d: %s", res.ExitCode, exitcode.Locked, res.Stderr)
	}
	for _, want := range []string{"is not running on this machine", unlock, "--lock-timeout=DURATION"} {
		if !strings.Contains(res.Stderr, want) {
			t.Errorf("refusal lacks %q:\n%s", want, res.Stderr)
		}
	}
	res = env.Run(t, bin, "upgrade", rel, chart, "-n", ns, "--lock-timeout", "2s")
	if res.ExitCode != exitcode.Locked {
		t.Fatalf("upgrade with --lock-timeout 2s: exit %d, want %d: %s", res.ExitCode, exitcode.Locked, res.Stderr)
	}
	for _, want := range []string{"gave up after waiting 2s (--lock-timeout)", unlock} {
		if !strings.Contains(res.Stderr, want) {
			t.Errorf("refusal after waiting lacks %q:\n%s", want, res.Stderr)
		}
	}
	for _, unwanted := range []string{"--lock-timeout=DURATION", "context deadline exceeded"} {
		if strings.Contains(res.Stderr, unwanted) {
			t.Errorf("refusal after waiting has %q:\n%s", unwanted, res.Stderr)
		}
	}
	// The command the hint gives frees the release.
	res = env.Run(t, bin, "unlock", rel, "-n", ns, "--session", holder.Session, "--force", "--yes")
	if res.ExitCode != 0 {
		t.Fatalf("unlock --force --yes: exit %d: %s%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	mustRun(t, env, bin, "upgrade", rel, chart, "-n", ns)
	if got := strings.Join(env.Summary(t, ns, rel), " "); got != "1:superseded 2:failed 3:deployed" {
		t.Errorf("history = %s; want 1:superseded 2:failed 3:deployed", got)
	}
}
