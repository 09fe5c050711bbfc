package recovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The objects of the "converge" test chart, for release convRelease.
const (
	convRelease  = "conv"
	cmConfig     = convRelease + "-config"         // in every revision; data.message changes
	cmExtra      = convRelease + "-extra"          // only the abandoned revision: deleted
	cmKeep       = convRelease + "-extra-keep"     // only abandoned, resource-policy keep: stays
	cmDisowned   = convRelease + "-extra-disowned" // only abandoned, ownership removed by a user: stays
	cmAdopted    = convRelease + "-extra-adopted"  // existed before, adopted by the abandoned revision: stays
	cmBystander  = convRelease + "-extra-bystander"
	convDeploy   = convRelease
	neverMatches = "nodeSelector.never=matches"
)

// TestIntegrationConvergeAbandonedUpgrade: an upgrade that adds a
// nodeSelector no node matches and new objects is SIGKILLed while it waits
// (pending-upgrade, everything applied). After MarkFailed and Converge the
// Deployment is back to the deployed revision, the object only the
// abandoned revision created is gone, and objects that are kept, not owned,
// or existed before are untouched; a later `upgrade --wait` succeeds and
// leaves none of the abandoned revision behind. Run for both apply methods
// helm 4 uses: client-side (release first installed by helm 3, abandoned by
// helm 4 or by helm 3) and server-side (installed by helm 4).
func TestIntegrationConvergeAbandonedUpgrade(t *testing.T) {
	env := testenv.Get(t)
	cases := []struct {
		name               string
		installer, upgrade string
		method             ApplyMethod
		storedMethod       string
	}{
		{"client-side/installed-by-helm3/abandoned-by-helm4", env.Helm3, env.Helm4, ClientSideApply, "csa"},
		{"client-side/installed-by-helm3/abandoned-by-helm3", env.Helm3, env.Helm3, ClientSideApply, ""},
		{"server-side/installed-by-helm4/abandoned-by-helm4", env.Helm4, env.Helm4, ServerSideApply, "ssa"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			convergeUpgradeScenario(t, env, c.installer, c.upgrade, c.method, c.storedMethod)
		})
	}
}

func convergeUpgradeScenario(t *testing.T, env *testenv.Env, installer, upgrader string, method ApplyMethod, storedMethod string) {
	ctx := context.Background()
	ns := env.Namespace(t)
	chart := env.Chart("converge")
	cms := env.Client.CoreV1().ConfigMaps(ns)

	// Unowned objects named like the chart's: one the abandoned revision
	// adopts (--take-ownership), one no revision mentions.
	for _, name := range []string{cmAdopted, cmBystander} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"owner": "someone-else"}}}
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	mustRun(t, env, installer, "install", convRelease, chart, "-n", ns, "--wait", "--timeout", "3m")
	env.WaitForStatus(t, ns, convRelease, 1, "deployed", 10*time.Second)

	// The upgrade to abandon: pods never schedule, so --wait holds it open.
	start := time.Now()
	p := env.Start(t, upgrader, "upgrade", convRelease, chart, "-n", ns, "--wait", "--timeout", "10m", "--take-ownership",
		"--set", neverMatches, "--set", "extraConfigMap=true", "--set", "message=v2")
	env.WaitForStatus(t, ns, convRelease, 2, "pending-upgrade", 2*time.Minute)
	waitFor(t, 2*time.Minute, "the abandoned revision's objects to be applied", func() (bool, string) {
		d, err := env.Client.AppsV1().Deployments(ns).Get(ctx, convDeploy, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if d.Spec.Template.Spec.NodeSelector["never"] != "matches" {
			return false, fmt.Sprintf("nodeSelector %v", d.Spec.Template.Spec.NodeSelector)
		}
		for _, name := range []string{cmExtra, cmKeep, cmDisowned, cmAdopted} {
			cm, err := cms.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if cm.Annotations[AnnotationReleaseName] != convRelease {
				return false, name + " not owned yet"
			}
		}
		cm, err := cms.Get(ctx, cmConfig, metav1.GetOptions{})
		if err != nil || cm.Data["message"] != "v2" {
			return false, fmt.Sprintf("config %v %v", cm.Data, err)
		}
		return true, ""
	})
	p.Kill(t)
	t.Logf("killed the upgrade %s after it started, with revision 2 pending-upgrade and applied", time.Since(start).Round(time.Millisecond))

	abandoned := revisionSummary(t, env, ns, 2)
	if got := storedApplyMethod(t, env, ns, 2); got != storedMethod {
		t.Fatalf("revision 2 records apply_method %q, want %q", got, storedMethod)
	}
	if _, err := MarkFailed(ctx, helmx.SecretRecords(env.Client), ns, abandoned, "Abandoned pending-upgrade (test)", time.Time{}); err != nil {
		t.Fatal(err)
	}

	// A user takes one of the abandoned revision's objects over.
	disowned, err := cms.Get(ctx, cmDisowned, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(disowned.Annotations, AnnotationReleaseName)
	delete(disowned.Annotations, AnnotationReleaseNamespace)
	if _, err = cms.Update(ctx, disowned, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := map[string]*corev1.ConfigMap{}
	for _, name := range []string{cmKeep, cmDisowned, cmAdopted, cmBystander} {
		if before[name], err = cms.Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// A holder that lost its lock writes nothing.
	lost := errors.New("lock lost (test)")
	_, err = ConvergeAbandoned(ctx, func() (*Kube, error) { return NewKube(env.Config) }, helmx.SecretRecords(env.Client), abandoned, ConvergeOptions{BeforeWrite: func() error { return lost }})
	if !errors.Is(err, ErrFenced) || !errors.Is(err, lost) {
		t.Fatalf("fenced Converge: %v, want ErrFenced wrapping the lock error", err)
	}
	if d, err := env.Client.AppsV1().Deployments(ns).Get(ctx, convDeploy, metav1.GetOptions{}); err != nil || d.Spec.Template.Spec.NodeSelector["never"] != "matches" {
		t.Fatalf("a fenced Converge wrote the Deployment: %v", err)
	}

	writes := 0
	opts := ConvergeOptions{BeforeWrite: func() error { writes++; return nil }}
	convStart := time.Now()
	rep, err := ConvergeAbandoned(ctx, func() (*Kube, error) { return NewKube(env.Config) }, helmx.SecretRecords(env.Client), abandoned, opts)
	if err != nil {
		t.Fatalf("Converge: %v\nreport: %s", err, rep.Summary())
	}
	t.Logf("converged in %s with %d writes: %s", time.Since(convStart).Round(time.Millisecond), writes, rep.Summary())
	if rep.Method != method || rep.Base != 1 || rep.Abandoned != 2 {
		t.Errorf("report: method %s base %d abandoned %d; want %s, 1, 2", rep.Method, rep.Base, rep.Abandoned, method)
	}
	wantActions := map[string]ConvergeAction{
		"Deployment " + ns + "/" + convDeploy: ActionReverted,
		"ConfigMap " + ns + "/" + cmConfig:    ActionReverted,
		"ConfigMap " + ns + "/" + cmExtra:     ActionDeleted,
		"ConfigMap " + ns + "/" + cmKeep:      ActionKept,
		"ConfigMap " + ns + "/" + cmDisowned:  ActionKept,
		"ConfigMap " + ns + "/" + cmAdopted:   ActionKept,
	}
	for _, o := range rep.Objects {
		want, ok := wantActions[o.Object.String()]
		if !ok {
			t.Errorf("report names an unexpected object: %+v", o)
			continue
		}
		if o.Action != want {
			t.Errorf("%s: %s (%s), want %s", o.Object, o.Action, o.Reason, want)
		}
		delete(wantActions, o.Object.String())
	}
	for obj := range wantActions {
		t.Errorf("report lacks %s", obj)
	}
	if writes != 3 {
		t.Errorf("%d writes, want 3 (two reverts, one delete)", writes)
	}

	// The live objects are those of revision 1 again, before helm runs.
	d, err := env.Client.AppsV1().Deployments(ns).Get(ctx, convDeploy, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Spec.Template.Spec.NodeSelector) != 0 {
		t.Errorf("after Converge the Deployment keeps nodeSelector %v", d.Spec.Template.Spec.NodeSelector)
	}
	if d.Annotations[AnnotationReleaseName] != convRelease || d.Labels[LabelManagedBy] != ManagedByHelm {
		t.Errorf("after Converge the Deployment lost its ownership: %v %v", d.Annotations, d.Labels)
	}
	if cm, err := cms.Get(ctx, cmConfig, metav1.GetOptions{}); err != nil || cm.Data["message"] != "hello" {
		t.Errorf("after Converge %s holds %v (%v), want message=hello", cmConfig, cm.Data, err)
	}
	checkGone(t, env, ns, cmExtra)
	checkUntouched(t, env, ns, before, cmKeep, cmDisowned, cmAdopted, cmBystander)

	// Converge is idempotent.
	writes = 0
	rep2, err := ConvergeAbandoned(ctx, func() (*Kube, error) { return NewKube(env.Config) }, helmx.SecretRecords(env.Client), abandoned, opts)
	if err != nil || rep2.Changed() || writes != 0 {
		t.Errorf("second Converge: changed %v, %d writes, err %v: %s", rep2.Changed(), writes, err, rep2.Summary())
	}

	// Helm's own upgrade, to a revision without the abandoned values.
	mustRun(t, env, upgrader, "upgrade", convRelease, chart, "-n", ns, "--wait", "--timeout", "3m", "--set", "message=v3")
	if got := strings.Join(env.Summary(t, ns, convRelease), " "); got != "1:superseded 2:failed 3:deployed" {
		t.Errorf("history %s, want 1:superseded 2:failed 3:deployed", got)
	}
	d, err = env.Client.AppsV1().Deployments(ns).Get(ctx, convDeploy, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Spec.Template.Spec.NodeSelector) != 0 {
		t.Errorf("after the upgrade the Deployment keeps nodeSelector %v", d.Spec.Template.Spec.NodeSelector)
	}
	if d.Status.ReadyReplicas != 1 || d.Status.UpdatedReplicas != 1 {
		t.Errorf("after the upgrade the Deployment is not ready: %+v", d.Status)
	}
	if cm, err := cms.Get(ctx, cmConfig, metav1.GetOptions{}); err != nil || cm.Data["message"] != "v3" {
		t.Errorf("after the upgrade %s holds %v (%v), want message=v3", cmConfig, cm.Data, err)
	}
	checkGone(t, env, ns, cmExtra)
	checkUntouched(t, env, ns, before, cmKeep, cmDisowned, cmAdopted, cmBystander)
}

// TestIntegrationConvergeAbandonedInstall: with no deployed revision (an
// abandoned pending-install) Converge writes nothing, and helm's own
// `upgrade --install` removes what the abandoned install applied, because
// it diffs against the latest revision when none is deployed. This is the
// behaviour converge.go documents and relies on.
func TestIntegrationConvergeAbandonedInstall(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	chart := env.Chart("converge")
	cms := env.Client.CoreV1().ConfigMaps(ns)

	p := env.Start(t, env.Helm4, "install", convRelease, chart, "-n", ns, "--wait", "--timeout", "10m",
		"--set", neverMatches, "--set", "extraConfigMap=true")
	env.WaitForStatus(t, ns, convRelease, 1, "pending-install", 2*time.Minute)
	waitFor(t, 2*time.Minute, "the abandoned install's objects to be applied", func() (bool, string) {
		d, err := env.Client.AppsV1().Deployments(ns).Get(ctx, convDeploy, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if _, err := cms.Get(ctx, cmExtra, metav1.GetOptions{}); err != nil {
			return false, err.Error()
		}
		return d.Spec.Template.Spec.NodeSelector["never"] == "matches", "no nodeSelector yet"
	})
	p.Kill(t)

	abandoned := revisionSummary(t, env, ns, 1)
	if _, err := MarkFailed(ctx, helmx.SecretRecords(env.Client), ns, abandoned, "Abandoned pending-install (test)", time.Time{}); err != nil {
		t.Fatal(err)
	}
	writes := 0
	rep, err := ConvergeAbandoned(ctx, func() (*Kube, error) { return NewKube(env.Config) }, helmx.SecretRecords(env.Client), abandoned, ConvergeOptions{BeforeWrite: func() error { writes++; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(rep.Summary())
	if rep.Skipped == "" || writes != 0 || rep.Changed() {
		t.Fatalf("Converge with no deployed revision: skipped %q, %d writes", rep.Skipped, writes)
	}
	if _, err := cms.Get(ctx, cmExtra, metav1.GetOptions{}); err != nil {
		t.Fatalf("Converge touched %s with no deployed revision: %v", cmExtra, err)
	}

	// Values are given: with none, helm reuses those of its base revision,
	// here the abandoned one.
	mustRun(t, env, env.Helm4, "upgrade", "--install", convRelease, chart, "-n", ns, "--wait", "--timeout", "3m", "--set", "message=v3")
	// Stock helm marks its base revision superseded after a successful
	// upgrade, even the failed one it falls back to when none is deployed;
	// the description of the abandonment stays.
	if got := strings.Join(env.Summary(t, ns, convRelease), " "); got != "1:superseded 2:deployed" {
		t.Errorf("history %s, want 1:superseded 2:deployed", got)
	}
	if d := revisionSummary(t, env, ns, 1).Description; d != "Abandoned pending-install (test)" {
		t.Errorf("revision 1 description %q", d)
	}
	d, err := env.Client.AppsV1().Deployments(ns).Get(ctx, convDeploy, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Spec.Template.Spec.NodeSelector) != 0 {
		t.Errorf("after upgrade --install the Deployment keeps nodeSelector %v", d.Spec.Template.Spec.NodeSelector)
	}
	checkGone(t, env, ns, cmExtra)
	if _, err := cms.Get(ctx, cmKeep, metav1.GetOptions{}); err != nil {
		t.Errorf("%s (resource-policy keep) is gone: %v", cmKeep, err)
	}
}

func mustRun(t *testing.T, env *testenv.Env, bin string, args ...string) {
	t.Helper()
	res := env.Run(t, bin, args...)
	if res.ExitCode != 0 {
		t.Fatalf("%s %s: exit %d\nstdout:\n%s\nstderr:\n%s", bin, strings.Join(args, " "), res.ExitCode, res.Stdout, res.Stderr)
	}
}

// waitFor polls cond every 100 ms until it holds, failing the test after
// timeout with the last reason cond gave.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var why string
	for time.Now().Before(deadline) {
		var ok bool
		if ok, why = cond(); ok {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s: %s", timeout, what, why)
}

func revisionSummary(t *testing.T, env *testenv.Env, ns string, rev int) helmx.Summary {
	t.Helper()
	s, err := env.Client.CoreV1().Secrets(ns).Get(context.Background(), helmx.ReleaseSecretName(convRelease, rev), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := helmx.Summarize(s)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

func storedApplyMethod(t *testing.T, env *testenv.Env, ns string, rev int) string {
	t.Helper()
	s, err := env.Client.CoreV1().Secrets(ns).Get(context.Background(), helmx.ReleaseSecretName(convRelease, rev), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	doc, err := helmx.DecodeReleaseJSON(s.Data[helmx.ReleaseDataKey])
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		ApplyMethod string `json:"apply_method"`
	}
	if err := json.Unmarshal(doc, &r); err != nil {
		t.Fatal(err)
	}
	return r.ApplyMethod
}

func checkGone(t *testing.T, env *testenv.Env, ns, name string) {
	t.Helper()
	cm, err := env.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), name, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("%s survives (err %v): %v", name, err, cm)
	}
}

// checkUntouched: not written at all since it was read.
func checkUntouched(t *testing.T, env *testenv.Env, ns string, before map[string]*corev1.ConfigMap, names ...string) {
	t.Helper()
	for _, name := range names {
		cm, err := env.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("unowned %s: %v", name, err)
			continue
		}
		if cm.ResourceVersion != before[name].ResourceVersion {
			t.Errorf("unowned %s was written: resourceVersion %s, was %s", name, cm.ResourceVersion, before[name].ResourceVersion)
		}
	}
}
