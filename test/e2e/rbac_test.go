package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// leaseBackendRules is the minimal Role of docs/rbac.md for the lease
// backend, without the chart's own resources.
var leaseBackendRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "create", "update", "delete"}},
	{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
	{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create"}},
}

// chartRules are what the test chart itself needs (helm's own requirement).
var chartRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"apps"}, Resources: []string{"replicasets"}, Verbs: []string{"get", "list", "watch"}},
}

// TestLeaseBackendLeastPrivilege runs the guarded commands as a
// ServiceAccount bound to exactly the documented Role: install, an upgrade
// killed mid-way and the recovering upgrade all work. Without the right to
// update Leases, the command fails with a message naming the verb and the
// resource, and writes no revision.
func TestLeaseBackendLeastPrivilege(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	ns := env.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	full := restrictedKubeconfig(ctx, t, env, ns, "deployer", append(append([]rbacv1.PolicyRule{}, leaseBackendRules...), chartRules...))
	run := func(kubeconfig string, a ...string) testenv.Result {
		return env.RunEnv(t, []string{"KUBECONFIG=" + kubeconfig}, bin, a...)
	}
	chart := env.Chart("app")
	const rel = "least"
	if res := run(full, "install", rel, chart, "-n", ns, "--wait", "--timeout", "60s"); res.ExitCode != 0 {
		t.Fatalf("install with the documented Role: exit %d: %s", res.ExitCode, res.Stderr)
	}
	p := env.Start(t, bin, "upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m", "--lease-duration", "3s",
		"--set", "nodeSelector.never=matches", "--kubeconfig", full, "--lock-backend", "lease")
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
	p.Kill(t)
	res := run(full, "upgrade", rel, chart, "-n", ns, "--set", "message=v3", "--lock-timeout", "30s", "--lease-duration", "3s", "--lock-backend", "lease")
	if res.ExitCode != 0 {
		t.Fatalf("recovering upgrade with the documented Role: exit %d: %s", res.ExitCode, res.Stderr)
	}
	if got := strings.Join(env.Summary(t, ns, rel), " "); got != "1:superseded 2:failed 3:deployed" {
		t.Fatalf("history after recovery = %s", got)
	}

	// One verb fewer: no update on leases.
	fewer := append([]rbacv1.PolicyRule{}, chartRules...)
	fewer = append(fewer, leaseBackendRules[0], leaseBackendRules[2], rbacv1.PolicyRule{
		APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "delete"},
	})
	short := restrictedKubeconfig(ctx, t, env, ns, "short", fewer)
	// (With the default --lock-backend=auto this user would get the release
	// backend; TestReleaseBackendLeastPrivilege covers that.)
	res = run(short, "upgrade", rel, chart, "-n", ns, "--set", "message=v4", "--lock-backend", "lease")
	if res.ExitCode == 0 {
		t.Fatalf("upgrade without update on leases succeeded")
	}
	for _, want := range []string{`cannot update resource "leases"`, `API group "coordination.k8s.io"`, `lock release "least"`, ns, "docs/rbac.md"} {
		if !strings.Contains(res.Stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, res.Stderr)
		}
	}
	if got := strings.Join(env.Summary(t, ns, rel), " "); got != "1:superseded 2:failed 3:deployed" {
		t.Fatalf("history after the refused upgrade = %s; nothing may be written", got)
	}
}

// releaseBackendRules is the minimal Role of docs/rbac.md for the release
// backend: helm's own rights on its records, plus watch to wait for a lock.
var releaseBackendRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
	{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create"}},
}

// TestReleaseBackendLeastPrivilege runs the guarded commands as a
// ServiceAccount with no right on Leases at all: --lock-backend=auto (the
// default) picks the release backend, and install, an upgrade killed
// mid-way and the recovering upgrade all work without any Lease. Without
// update on secrets the command fails naming the verb and the resource.
func TestReleaseBackendLeastPrivilege(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	ns := env.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	full := restrictedKubeconfig(ctx, t, env, ns, "deployer", append(append([]rbacv1.PolicyRule{}, releaseBackendRules...), chartRules...))
	run := func(kubeconfig string, a ...string) testenv.Result {
		return env.RunEnv(t, []string{"KUBECONFIG=" + kubeconfig}, bin, a...)
	}
	chart := env.Chart("app")
	const rel = "noleases"
	if res := run(full, "install", rel, chart, "-n", ns, "--wait", "--timeout", "60s", "--debug"); res.ExitCode != 0 {
		t.Fatalf("install with the documented Role: exit %d: %s", res.ExitCode, res.Stderr)
	} else if !strings.Contains(res.Stderr, "lock backend auto chose release") {
		t.Errorf("--debug does not report auto's choice of the release backend:\n%s", res.Stderr)
	}
	p := env.Start(t, bin, "upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m", "--lease-duration", "3s",
		"--set", "nodeSelector.never=matches", "--kubeconfig", full)
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
	holder := waitForWriterIn(t, env, recordLock, ns, rel, 2, 10*time.Second)
	p.Kill(t)
	res := run(full, "upgrade", rel, chart, "-n", ns, "--set", "message=v3", "--lock-timeout", "30s", "--lease-duration", "3s")
	if res.ExitCode != 0 {
		t.Fatalf("recovering upgrade with the documented Role: exit %d: %s", res.ExitCode, res.Stderr)
	}
	if !strings.Contains(res.Stderr, holder.Session) {
		t.Errorf("the recovery does not name the dead holder's session %s:\n%s", holder.Session, res.Stderr)
	}
	if got := strings.Join(env.Summary(t, ns, rel), " "); got != "1:superseded 2:failed 3:deployed" {
		t.Fatalf("history after recovery = %s", got)
	}
	if l, _ := lease(t, env, ns, rel); l != nil {
		t.Errorf("a Lease %s exists for a user without rights on Leases", l.Name)
	}

	// One verb fewer: no update on secrets.
	fewer := append([]rbacv1.PolicyRule{}, chartRules...)
	fewer = append(fewer, releaseBackendRules[1], rbacv1.PolicyRule{
		APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch", "create", "delete"},
	})
	short := restrictedKubeconfig(ctx, t, env, ns, "short", fewer)
	res = run(short, "upgrade", rel, chart, "-n", ns, "--set", "message=v4")
	if res.ExitCode == 0 {
		t.Fatalf("upgrade without update on secrets succeeded")
	}
	for _, want := range []string{`cannot update resource "secrets"`, `"noleases"`, ns, "docs/rbac.md", "the release lock backend (what --lock-backend=auto chose) needs"} {
		if !strings.Contains(res.Stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, res.Stderr)
		}
	}
	if got := strings.Join(env.Summary(t, ns, rel), " "); got != "1:superseded 2:failed 3:deployed" {
		t.Fatalf("history after the refused upgrade = %s; nothing may be written", got)
	}
}

// restrictedKubeconfig creates a ServiceAccount bound to a Role with rules in
// ns and writes a kubeconfig that authenticates with its token.
func restrictedKubeconfig(ctx context.Context, t *testing.T, env *testenv.Env, ns, name string, rules []rbacv1.PolicyRule) string {
	t.Helper()
	c := env.Client
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("service account: %v", err)
	}
	if _, err := c.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("role: %v", err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}},
	}
	if _, err := c.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatalf("role binding: %v", err)
	}
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s: %v", name, err)
	}
	admin, err := clientcmd.LoadFromFile(env.Kubeconfig)
	if err != nil {
		t.Fatalf("admin kubeconfig: %v", err)
	}
	cluster := admin.Clusters[admin.Contexts[admin.CurrentContext].Cluster]
	cfg := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: %s\n    certificate-authority: %s\nusers:\n- name: %s\n  user:\n    token: %s\ncontexts:\n- name: local\n  context: {cluster: local, user: %s, namespace: %s}\ncurrent-context: local\n",
		cluster.Server, cluster.CertificateAuthority, name, tr.Status.Token, name, ns)
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func ptrTo[T any](v T) *T { return &v }

// TestAutoBackendRightsTakenAway: --lock-backend=auto remembers its choice
// (no access reviews on every deploy); when the Lease rights it chose the
// lease backend for are taken away, the next deploy is refused once by the
// API server, forgets the choice, asks again and runs with the release
// backend.
func TestAutoBackendRightsTakenAway(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	ns := env.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kc := restrictedKubeconfig(ctx, t, env, ns, "deployer", append(append([]rbacv1.PolicyRule{}, leaseBackendRules...), chartRules...))
	run := func(a ...string) testenv.Result {
		return env.RunEnv(t, []string{"KUBECONFIG=" + kc}, bin, a...)
	}
	chart := env.Chart("app")
	const rel = "rights"
	for i, want := range []string{"lock backend auto chose lease", "remembered from"} {
		res := run("upgrade", "--install", rel, chart, "-n", ns, "--set", fmt.Sprintf("message=m%d", i), "--debug")
		if res.ExitCode != 0 || !strings.Contains(res.Stderr, want) {
			t.Fatalf("deploy %d with Lease rights: exit %d, want %q in:\n%s", i+1, res.ExitCode, want, res.Stderr)
		}
	}
	role, err := env.Client.RbacV1().Roles(ns).Get(ctx, "deployer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var kept []rbacv1.PolicyRule
	for _, r := range role.Rules {
		if len(r.APIGroups) == 0 || r.APIGroups[0] != "coordination.k8s.io" {
			kept = append(kept, r)
		}
	}
	role.Rules = append(kept, releaseBackendRules...)
	if _, err := env.Client.RbacV1().Roles(ns).Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The authorizer's view of the Role follows a watch: wait until it
	// denies the update of Leases.
	for deadline := time.Now().Add(30 * time.Second); ; {
		sar, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:" + ns + ":deployer",
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "update", Group: "coordination.k8s.io", Resource: "leases"},
		}}, metav1.CreateOptions{})
		if err == nil && !sar.Status.Allowed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Lease rights were not taken away: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	res := run("upgrade", rel, chart, "-n", ns, "--set", "message=after", "--debug")
	if res.ExitCode != 0 {
		t.Fatalf("deploy after the Lease rights were taken away: exit %d:\n%s", res.ExitCode, res.Stderr)
	}
	if !strings.Contains(res.Stderr, "lock backend auto chose release") {
		t.Errorf("auto did not choose again:\n%s", res.Stderr)
	}
	if got := strings.Join(env.Summary(t, ns, rel), " "); got != "1:superseded 2:superseded 3:deployed" {
		t.Fatalf("history = %s", got)
	}
}
