package e2e

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// controllerProc is a helm-autorecover controller run as a local process
// against the cluster (the local fake node runs no containers).
type controllerProc struct {
	*testenv.Proc
	metrics string // http://127.0.0.1:PORT/metrics
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

// startController starts a controller on ns with extra flags; kubeconfig
// "" is the admin's.
func startController(t *testing.T, env *testenv.Env, kubeconfig string, flags ...string) *controllerProc {
	t.Helper()
	var extra []string
	if kubeconfig != "" {
		extra = []string{"KUBECONFIG=" + kubeconfig}
	}
	return startControllerEnv(t, env, extra, flags...)
}

// startControllerEnv starts a controller with extra environment variables.
func startControllerEnv(t *testing.T, env *testenv.Env, extra []string, flags ...string) *controllerProc {
	t.Helper()
	mp, hp := freePort(t), freePort(t)
	args := append([]string{
		"controller",
		"--metrics-bind-address", "127.0.0.1:" + strconv.Itoa(mp),
		"--health-probe-bind-address", "127.0.0.1:" + strconv.Itoa(hp),
		"--log-level", "debug",
	}, flags...)
	p := env.StartEnv(t, extra, env.Bin(t), args...)
	// Ready once /readyz answers.
	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := http.Get("http://127.0.0.1:" + strconv.Itoa(hp) + "/readyz")
		if err == nil {
			_ = res.Body.Close()
			if res.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("controller not ready within 60s; stderr:\n%s", p.Stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("controller stderr:\n%s", p.Stderr.String())
		}
	})
	return &controllerProc{Proc: p, metrics: "http://127.0.0.1:" + strconv.Itoa(mp) + "/metrics"}
}

// metric reads the sum of a metric's series whose labels contain match.
func (c *controllerProc) metric(t *testing.T, name, match string) float64 {
	t.Helper()
	res, err := http.Get(c.metrics)
	if err != nil {
		t.Fatalf("scraping %s: %v", c.metrics, err)
	}
	defer func() { _ = res.Body.Close() }()
	sum := 0.0
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (match != "" && !strings.Contains(line, match)) {
			continue
		}
		if rest := strings.TrimPrefix(line, name); rest != "" && rest[0] != '{' && rest[0] != ' ' {
			continue // another metric with this prefix
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// waitRecovered waits until revision rev of rel is failed with a
// description written by a helm-autorecover recovery, and returns it.
func waitRecovered(t *testing.T, env *testenv.Env, ns, rel string, rev int, limit time.Duration) helmx.Summary {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		for _, s := range revisions(t, env, ns, rel) {
			if s.Revision == rev && s.Status == "failed" {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("revision %d of %s/%s not recovered within %s: %s", rev, ns, rel, limit, describe(revisions(t, env, ns, rel)))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// recoveredEvents counts the controller's Recovered Events in ns, waiting
// (at most limit) until there are at least want: the controller writes the
// Event after the record it recovered, so a test that has just seen the
// record change may be a few requests ahead of it.
func recoveredEvents(t *testing.T, env *testenv.Env, ns string, want int, limit time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		evs, err := env.Client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
		cancel()
		if err != nil {
			t.Fatalf("events: %v", err)
		}
		n := 0
		for _, e := range evs.Items {
			if e.Reason == "Recovered" && strings.Contains(e.Note, "helm-autorecover controller") {
				n++
			}
		}
		if n >= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestControllerRecovers: the controller recovers a release our CLI left
// when SIGKILLed (once its lease has expired), and one stock helm left
// (once --recover-legacy-after has passed), through the one recovery core:
// revision failed with a description naming the controller's session, an
// Event, the lock free; and an uninstall killed mid-way. A live holder of
// each backend is never touched while it renews.
func TestControllerRecovers(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	ns := env.Namespace(t)
	chart := env.Chart("app")
	c := startController(t, env, "", "--namespaces", ns, "--leader-elect=false", "--recover-legacy-after", "8s")

	// Live holders, one per backend, renewing every second.
	live := map[string]*testenv.Proc{}
	for _, backend := range []string{"lease", "release"} {
		rel := "live-" + backend
		mustRun(t, env, bin, "install", rel, chart, "-n", ns)
		live[backend] = env.Start(t, bin, args([]string{"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m", "--lease-duration", "3s", "--lock-backend", backend}, unschedulable)...)
		env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
	}

	// Our CLI, killed: recovered once its 3 s lease has run out.
	mustRun(t, env, bin, "install", "killed", chart, "-n", ns)
	p := env.Start(t, bin, args([]string{"upgrade", "killed", chart, "-n", ns, "--wait", "--timeout", "5m", "--lease-duration", "3s"}, unschedulable)...)
	env.WaitForStatus(t, ns, "killed", 2, "pending-upgrade", 60*time.Second)
	holder := waitForWriterIn(t, env, recordLock, ns, "killed", 2, 10*time.Second)
	p.Kill(t)
	killedAt := time.Now()
	got := waitRecovered(t, env, ns, "killed", 2, 60*time.Second)
	figure(t, "controller: our CLI killed (lease 3s) recovered %s after the kill", secs(time.Since(killedAt)))
	if !strings.Contains(got.Description, holder.Session) || !strings.Contains(got.Description, "recovered by helm-autorecover session") {
		t.Errorf("description %q does not name the dead holder and the recovering session", got.Description)
	}

	// Stock helm, killed: recovered once pending for 8 s.
	mustRun(t, env, env.Helm4, "install", "stock", chart, "-n", ns)
	sp := env.Start(t, env.Helm4, args([]string{"upgrade", "stock", chart, "-n", ns, "--wait", "--timeout", "5m"}, unschedulable)...)
	env.WaitForStatus(t, ns, "stock", 2, "pending-upgrade", 60*time.Second)
	sp.Kill(t)
	got = waitRecovered(t, env, ns, "stock", 2, 60*time.Second)
	if !strings.Contains(got.Description, "no lock record (stock helm)") {
		t.Errorf("stock helm's revision description %q", got.Description)
	}
	// An uninstall killed mid-way (held open by a pre-delete hook whose pod
	// never schedules) leaves "uninstalling": recovered too.
	mustRun(t, env, bin, args([]string{"install", "leaving", chart, "-n", ns, "--wait", "--timeout", "60s"}, hookUnschedulable)...)
	// The uninstalling write must fall in a later server second than the
	// install (see opCases in kill_test.go).
	time.Sleep(1100 * time.Millisecond)
	up := env.Start(t, bin, "uninstall", "leaving", "-n", ns, "--timeout", "5m", "--lease-duration", "3s")
	env.WaitForStatus(t, ns, "leaving", 1, "uninstalling", 60*time.Second)
	waitForWriterIn(t, env, recordLock, ns, "leaving", 1, 10*time.Second)
	up.Kill(t)
	waitRecovered(t, env, ns, "leaving", 1, 60*time.Second)

	if n := recoveredEvents(t, env, ns, 3, 30*time.Second); n < 3 {
		t.Errorf("%d Recovered Events from the controller; want at least 3", n)
	}
	if v := c.metric(t, "helm_autorecover_recoveries_total", `reason="expired-lock"`); v < 1 {
		t.Errorf("recoveries_total{reason=expired-lock} = %v", v)
	}
	if v := c.metric(t, "helm_autorecover_recoveries_total", `reason="legacy"`); v < 1 {
		t.Errorf("recoveries_total{reason=legacy} = %v", v)
	}

	// The live holders were never touched: still pending under their own
	// running processes, which end by themselves when killed now... and are
	// then recovered too.
	for backend, lp := range live {
		rel := "live-" + backend
		revs := revisions(t, env, ns, rel)
		if last := revs[len(revs)-1]; last.Revision != 2 || last.Status != "pending-upgrade" {
			t.Errorf("live %s holder's release was touched: %s", backend, describe(revs))
		}
		if lp.Cmd.ProcessState != nil {
			t.Errorf("live %s holder exited: %s", backend, lp.Stderr.String())
		}
		lp.Kill(t)
		waitRecovered(t, env, ns, rel, 2, 60*time.Second)
	}
}

// TestControllerLeaderDies: two replicas elect a leader; when the leader is
// killed, the other takes over within a lease period and recovers a release
// left stuck after that; every release is recovered once.
func TestControllerLeaderDies(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	ns := env.Namespace(t)
	chart := env.Chart("app")
	id := "har-" + ns
	flags := []string{"--namespaces", ns, "--leader-elect", "--leader-election-namespace", ns, "--leader-election-id", id}
	a := startController(t, env, "", flags...)
	b := startController(t, env, "", flags...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	leader := ""
	for leader == "" {
		l, err := env.Client.CoordinationV1().Leases(ns).Get(ctx, id, metav1.GetOptions{})
		if err == nil && l.Spec.HolderIdentity != nil {
			leader = *l.Spec.HolderIdentity
		}
		if ctx.Err() != nil {
			t.Fatal("no leader elected")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The leader's identity names its host and a UUID, the same host for
	// both: the one that leads says so in its log.
	first, second := a, b
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(a.Stderr.String(), "leading: ") && !strings.Contains(b.Stderr.String(), "leading: ") {
		if time.Now().After(deadline) {
			t.Fatalf("neither replica logged the lease it acquired; leader %q", leader)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if strings.Contains(b.Stderr.String(), "leading: ") {
		first, second = b, a
	}
	first.Kill(t)
	killedAt := time.Now()

	mustRun(t, env, bin, "install", "orphan", chart, "-n", ns)
	p := env.Start(t, bin, args([]string{"upgrade", "orphan", chart, "-n", ns, "--wait", "--timeout", "5m", "--lease-duration", "3s"}, unschedulable)...)
	env.WaitForStatus(t, ns, "orphan", 2, "pending-upgrade", 60*time.Second)
	waitForWriterIn(t, env, recordLock, ns, "orphan", 2, 10*time.Second)
	p.Kill(t)
	waitRecovered(t, env, ns, "orphan", 2, 90*time.Second)
	figure(t, "controller: leader killed, stuck release recovered by the new leader %s after the kill", secs(time.Since(killedAt)))
	// The Event is written after the metric is counted: once it is
	// there, the count is final.
	if n := recoveredEvents(t, env, ns, 1, 30*time.Second); n != 1 {
		t.Errorf("%d Recovered Events; want exactly 1", n)
	}
	if v := second.metric(t, "helm_autorecover_recoveries_total", ""); v != 1 {
		t.Errorf("the surviving replica recovered %v releases; want 1", v)
	}
}

// stuckForReadOnly leaves release "stuck" in ns pending under the lock of
// an upgrade killed by SIGKILL (lease 3 s), and returns a kubeconfig that
// may read helm's records and Leases in ns but write nothing.
func stuckForReadOnly(t *testing.T, env *testenv.Env, ns string) string {
	t.Helper()
	bin, chart := env.Bin(t), env.Chart("app")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kc := restrictedKubeconfig(ctx, t, env, ns, "readonly", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch"}},
	})
	mustRun(t, env, bin, "install", "stuck", chart, "-n", ns)
	p := env.Start(t, bin, args([]string{"upgrade", "stuck", chart, "-n", ns, "--wait", "--timeout", "5m", "--lease-duration", "3s"}, unschedulable)...)
	env.WaitForStatus(t, ns, "stuck", 2, "pending-upgrade", 60*time.Second)
	waitForWriterIn(t, env, recordLock, ns, "stuck", 2, 10*time.Second)
	p.Kill(t)
	return kc
}

// TestControllerForbiddenRetriesWithBackoff: a controller without the
// right to update helm's records cannot recover; it reports it (errors
// metric, log) and retries with backoff, not in a hot loop, and writes
// nothing.
func TestControllerForbiddenRetriesWithBackoff(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	kc := stuckForReadOnly(t, env, ns)

	c := startController(t, env, kc, "--namespaces", ns, "--leader-elect=false")
	// Wait for the first failures to be reported.
	deadline := time.Now().Add(60 * time.Second)
	for c.metric(t, "helm_autorecover_errors_total", "") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no error reported within 60s; stderr:\n%s", c.Stderr.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	start := c.metric(t, "helm_autorecover_errors_total", "")
	startAt := time.Now()
	// Watch for ten seconds: with backoff from 1 s doubling, a handful of
	// attempts at most (a hot loop makes hundreds).
	for time.Since(startAt) < 10*time.Second {
		time.Sleep(500 * time.Millisecond)
	}
	attempts := c.metric(t, "helm_autorecover_errors_total", "") - start
	figure(t, "controller: forbidden recovery retried %v times in 10s", attempts)
	if attempts > 6 {
		t.Errorf("%v failed attempts in 10 s: a hot loop", attempts)
	}
	if c.metric(t, "helm_autorecover_errors_total", `kind="forbidden"`) < 1 {
		t.Errorf("no forbidden error counted")
	}
	if !strings.Contains(c.Stderr.String(), "forbidden") || !strings.Contains(c.Stderr.String(), `"release":"stuck"`) {
		t.Errorf("the log does not report the forbidden recovery of stuck:\n%s", c.Stderr.String())
	}
	revs := revisions(t, env, ns, "stuck")
	if last := revs[len(revs)-1]; last.Status != "pending-upgrade" {
		t.Errorf("a controller without rights wrote the release: %s", describe(revs))
	}
}

// TestControllerScopeFromNamespaceFlag is issue 35 item 1 with the real
// binary: `controller -n NS` serves NS alone (it was accepted and ignored,
// and the controller served every namespace); -n and --namespaces naming
// different namespaces are refused (exit 2); a namespace that does not
// exist gets a warning.
func TestControllerScopeFromNamespaceFlag(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	ns := env.Namespace(t)
	c := startController(t, env, "", "-n", ns, "--leader-elect=false")
	want := `"namespaces":["` + ns + `"]`
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(c.Stderr.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("controller -n %s does not say it serves %s alone; stderr:\n%s", ns, want, c.Stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.Kill(t)

	res := env.Run(t, bin, "controller", "-n", ns, "--namespaces", "other", "--leader-elect=false")
	if res.ExitCode != 2 || !strings.Contains(res.Stderr, "name different scopes") {
		t.Errorf("-n and --namespaces naming different namespaces: exit %d, stderr:\n%s", res.ExitCode, res.Stderr)
	}

	c = startController(t, env, "", "--namespaces", ns+",nosuchns-"+ns[len(ns)-5:], "--leader-elect=false")
	deadline = time.Now().Add(30 * time.Second)
	for !strings.Contains(c.Stderr.String(), "namespace does not exist") {
		if time.Now().After(deadline) {
			t.Fatalf("no warning for a namespace that does not exist; stderr:\n%s", c.Stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if strings.Contains(c.Stderr.String(), `"namespace does not exist: nothing to serve there until it is created; check -n/--namespaces for a typo","namespace":"`+ns+`"`) {
		t.Errorf("a warning for %s, which exists:\n%s", ns, c.Stderr.String())
	}
}
