package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
)

// kwokNode is the local cluster's one fake node (hack/local-cluster.sh).
const kwokNode = "kwok-node-0"

// TestIntegrationLegacyWaitsForRunningHook: a stock helm v4 upgrade is
// SIGKILLed while it waits for its pre-upgrade hook Job, whose pod cannot
// schedule yet (a nodeSelector on a label the node lacks). Its revision,
// pending with no lock record, is past --recover-legacy-after, but its
// hook Job, created after it, still runs: `recover` refuses it (exit 5),
// naming the Job, and writes nothing. Once the node gets the label, kwok
// runs the pod to completion and the Job completes: `recover` then marks
// the revision failed (issue 31, item 4).
func TestIntegrationLegacyWaitsForRunningHook(t *testing.T) {
	x := newIT(t)
	ctx := context.Background()
	const rel = "hookwait"
	hold := "hold-" + x.ns // a node label only this test sets
	job := rel + "-hook"

	x.install(true, rel)
	p := x.env.Start(t, x.env.Helm4, "upgrade", rel, x.env.Chart("app"), "-n", x.ns, "--timeout", "10m",
		"--set", "hook=true", "--set", "hookEvents=pre-upgrade", "--set", "hookNodeSelector."+hold+"=yes", "--set", "message=v2")
	x.env.WaitForStatus(t, x.ns, rel, 2, "pending-upgrade", 2*time.Minute)
	x.waitFor(time.Minute, "stock helm to create its hook Job and wait for it", func() (bool, string) {
		j, err := x.env.Client.BatchV1().Jobs(x.ns).Get(ctx, job, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return jobActive(j), fmt.Sprintf("job status %+v", j.Status)
	})
	p.Kill(t)
	t.Logf("killed stock helm's upgrade of %s while its hook Job %s/%s runs", rel, x.ns, job)

	// Past the legacy age, a hook as old as the revision is no sign of a
	// live helm (helm waits for one hook at most its --timeout, which the
	// legacy age exceeds): the dry run calls the revision recoverable.
	const legacy = "15s"
	x.waitFor(time.Minute, "the revision to be older than "+legacy, func() (bool, string) {
		r := x.env.Run(t, x.ha, "recover", rel, "--recover-legacy-after", legacy, "-n", x.ns, "--dry-run")
		return r.ExitCode == 0 && strings.Contains(r.Stdout, "recoverable"), "stdout:\n" + r.Stdout + "\nstderr:\n" + r.Stderr
	})
	// A helm still at work has created its current hook within its
	// --timeout: the hook Job made again now stands for one created late
	// (a post-upgrade hook after a long --wait).
	propagation := metav1.DeletePropagationForeground
	if err := x.env.Client.BatchV1().Jobs(x.ns).Delete(ctx, job, metav1.DeleteOptions{PropagationPolicy: &propagation}); err != nil {
		t.Fatal(err)
	}
	x.waitFor(time.Minute, "the old hook Job to be gone", func() (bool, string) {
		_, err := x.env.Client.BatchV1().Jobs(x.ns).Get(ctx, job, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if _, err := x.env.Client.BatchV1().Jobs(x.ns).Create(ctx, &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: job, Annotations: map[string]string{"helm.sh/hook": "pre-upgrade"}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			NodeSelector:  map[string]string{hold: "yes"},
			Containers:    []corev1.Container{{Name: "hook", Image: "registry.example/hook:1.0"}},
		}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var res struct {
		code           int
		stdout, stderr string
	}
	x.waitFor(time.Minute, "recover to refuse the revision for its hook", func() (bool, string) {
		r := x.env.Run(t, x.ha, "recover", rel, "--recover-legacy-after", legacy, "-n", x.ns)
		res.code, res.stdout, res.stderr = r.ExitCode, r.Stdout, r.Stderr
		if r.ExitCode != exitcode.Pending {
			t.Fatalf("recover of a legacy revision whose hook Job runs: exit %d; want %d (pending)\nstdout:\n%s\nstderr:\n%s", r.ExitCode, exitcode.Pending, r.Stdout, r.Stderr)
		}
		return strings.Contains(r.Stdout+r.Stderr, "its hook Job"), "stdout:\n" + r.Stdout + "\nstderr:\n" + r.Stderr
	})
	t.Logf("recover refused:\n%s%s", res.stdout, res.stderr)
	wantContains(t, "recover's refusal", res.stdout+res.stderr, "not recoverable now (its helm may still be at work; looked at again in 30s)",
		fmt.Sprintf("its hook Job %s/%s", x.ns, job), "is still running: a helm process may still be at work on it", "at least --recover-legacy-after "+legacy)
	if got := strings.Join(x.env.Summary(t, x.ns, rel), " "); got != "1:deployed 2:pending-upgrade" {
		t.Fatalf("history after the refusal %s; want it untouched (1:deployed 2:pending-upgrade)", got)
	}

	// The hook finishes: the node gets the label its pod waits for.
	labelNode(t, x, hold, "yes")
	t.Cleanup(func() { labelNode(t, x, hold, "") })
	x.waitFor(2*time.Minute, "the hook Job to complete", func() (bool, string) {
		j, err := x.env.Client.BatchV1().Jobs(x.ns).Get(ctx, job, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range j.Status.Conditions {
			if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, fmt.Sprintf("job status %+v", j.Status)
	})

	r := x.run(0, "recover", rel, "--recover-legacy-after", legacy)
	t.Logf("recover once the hook finished:\n%s", r.Stdout)
	if got := strings.Join(x.env.Summary(t, x.ns, rel), " "); got != "1:deployed 2:failed" {
		t.Errorf("history after the recovery %s; want 1:deployed 2:failed", got)
	}
	wantContains(t, "the description of revision 2", x.latest(rel).Description, "Abandoned pending-upgrade with no lock record")
}

// jobActive reports whether j has started and not ended.
func jobActive(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return false
		}
	}
	return j.Status.Active > 0
}

// labelNode sets label key on the fake node to value, or removes it when
// value is empty.
func labelNode(t *testing.T, x *it, key, value string) {
	t.Helper()
	var v any = value
	if value == "" {
		v = nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{key: v}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := x.env.Client.CoreV1().Nodes().Patch(ctx, kwokNode, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("labelling node %s %s=%q: %v", kwokNode, key, value, err)
	}
}
