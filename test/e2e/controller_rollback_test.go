package e2e

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestControllerRollsBackEachUnderItsLock: with --recover-strategy=rollback
// the controller rolls back two releases left stuck at once, each with
// helm's own rollback on clients of its own, judged by the fence of that
// release's lock (issue 31, item 5): every rollback's revision carries the
// controller's lock, and its objects land in the release's namespace (the
// controller runs with no namespace of its own).
func TestControllerRollsBackEachUnderItsLock(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	ns := env.Namespace(t)
	chart := env.Chart("app")
	startController(t, env, "", "--namespaces", ns, "--leader-elect=false", "--recover-strategy", "rollback", "--workers", "4")

	rels := []string{"first", "second"}
	var holders []*testenv.Proc
	for _, rel := range rels {
		mustRun(t, env, bin, "install", rel, chart, "-n", ns, "--wait", "--timeout", "60s")
		holders = append(holders, env.Start(t, bin, args([]string{
			"upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m",
			"--lease-duration", "3s", "--set", "message=abandoned",
		}, unschedulable)...))
	}
	for i, rel := range rels {
		env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 60*time.Second)
		waitForWriterIn(t, env, recordLock, ns, rel, 2, 10*time.Second)
		holders[i].Kill(t)
	}
	for _, rel := range rels {
		waitRecovered(t, env, ns, rel, 2, 60*time.Second)
		deadline := time.Now().Add(60 * time.Second)
		for strings.Join(env.Summary(t, ns, rel), " ") != "1:superseded 2:failed 3:deployed" {
			if time.Now().After(deadline) {
				t.Fatalf("%s not rolled back within 60s: %s", rel, strings.Join(env.Summary(t, ns, rel), " "))
			}
			time.Sleep(100 * time.Millisecond)
		}
		revs := env.History(t, ns, rel)
		rec, err := lock.DecodeRecord(revs[2].Secret.Annotations[lock.AnnotationRecord])
		if err != nil || rec == nil || rec.Revision != 3 || !strings.HasPrefix(rec.Who, "controller@") {
			t.Errorf("%s's revision 3, written by the controller's rollback, carries lock record %+v (%v); want the controller's, for revision 3", rel, rec, err)
		}
		cm, err := env.Client.CoreV1().ConfigMaps(ns).Get(t.Context(), rel+"-config", metav1.GetOptions{})
		if err != nil || cm.Data["message"] != "hello" {
			t.Errorf("%s-config after the rollback: %v, %v; want revision 1's message in %s", rel, cm.Data, err, ns)
		}
		d, err := env.Client.AppsV1().Deployments(ns).Get(t.Context(), rel, metav1.GetOptions{})
		if err != nil || len(d.Spec.Template.Spec.NodeSelector) != 0 {
			t.Errorf("Deployment %s after the rollback: %v (nodeSelector %v); want revision 1's", rel, err, d.Spec.Template.Spec.NodeSelector)
		}
	}
}
