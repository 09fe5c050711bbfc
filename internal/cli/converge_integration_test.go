package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/inspect"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// What the abandoned upgrade of these tests changes in the "app" chart's
// objects of release REL: a field (a nodeSelector no node matches on the
// Deployment REL, which also holds the upgrade open in --wait), a changed
// value (data.message of ConfigMap REL-config) and an object only it renders
// (ConfigMap REL-extra).
var abandonedValues = []string{"--set", "nodeSelector.never=matches", "--set", "extraConfigMap=true", "--set", "message=abandoned"}

// installMethod is how the release was installed: by helm-autorecover
// (helm 4: server-side apply, kept by its upgrades) or by stock helm 3
// (client-side apply, which helm 4's upgrades keep too). Converge undoes the
// abandoned revision with its own apply method, so each is its own path.
type installMethod struct {
	name  string
	helm3 bool
}

var (
	serverSide = installMethod{"server-side", false}
	clientSide = installMethod{"client-side", true}
)

// abandon installs rel with m, then starts a guarded upgrade to revision 2
// with abandonedValues and lease leaseDuration, and SIGKILLs it once it holds
// the lock with revision 2 recorded and everything it changes is applied
// (it then waits for pods that never schedule). It returns the dead holder.
func (x *it) abandon(rel string, m installMethod, leaseDuration string) holder {
	x.t.Helper()
	ctx := context.Background()
	chart := x.env.Chart("app")
	if m.helm3 {
		res := x.env.Run(x.t, x.env.Helm3, "install", rel, chart, "-n", x.ns, "--wait", "--timeout", "60s")
		if res.ExitCode != 0 {
			x.t.Fatalf("helm3 install: exit %d\nstderr:\n%s", res.ExitCode, res.Stderr)
		}
	} else {
		x.install(false, rel)
	}
	x.env.WaitForStatus(x.t, x.ns, rel, 1, "deployed", 30*time.Second)
	if cm, err := x.env.Client.CoreV1().ConfigMaps(x.ns).Get(ctx, rel+"-extra", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		x.t.Fatalf("revision 1 already has %s-extra (err %v): %v", rel, err, cm)
	}

	p := x.env.Start(x.t, x.ha, append([]string{
		"upgrade", rel, chart, "-n", x.ns, "--wait", "--timeout", "5m",
		"--lease-duration", leaseDuration,
	}, abandonedValues...)...)
	x.env.WaitForStatus(x.t, x.ns, rel, 2, "pending-upgrade", 2*time.Minute)
	var h holder
	x.waitFor(time.Minute, "the upgrade to record revision 2 in its lock and apply its changes", func() (bool, string) {
		l, rec := x.lease(rel)
		if l == nil || rec == nil || holderID(l) != rec.Session || rec.Revision != 2 {
			return false, fmt.Sprintf("lock holder %q, record %+v", holderID(l), rec)
		}
		h = holder{proc: p, session: rec.Session}
		d, err := x.env.Client.AppsV1().Deployments(x.ns).Get(ctx, rel, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if d.Spec.Template.Spec.NodeSelector["never"] != "matches" {
			return false, fmt.Sprintf("Deployment nodeSelector %v", d.Spec.Template.Spec.NodeSelector)
		}
		extra, err := x.env.Client.CoreV1().ConfigMaps(x.ns).Get(ctx, rel+"-extra", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if extra.Annotations[recovery.AnnotationReleaseName] != rel {
			return false, "the extra ConfigMap is not owned yet"
		}
		cm, err := x.env.Client.CoreV1().ConfigMaps(x.ns).Get(ctx, rel+"-config", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return cm.Data["message"] == "abandoned", fmt.Sprintf("config %v", cm.Data)
	})
	p.Kill(x.t)
	x.t.Logf("killed the upgrade of %s (session %s) with revision 2 pending-upgrade and applied", rel, h.session)
	return h
}

// waitFor polls cond every 100 ms until it holds, failing the test after
// timeout with the last reason cond gave.
func (x *it) waitFor(timeout time.Duration, what string, cond func() (bool, string)) {
	x.t.Helper()
	deadline := time.Now().Add(timeout)
	var why string
	for time.Now().Before(deadline) {
		var ok bool
		if ok, why = cond(); ok {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	x.t.Fatalf("timed out after %s waiting for %s: %s", timeout, what, why)
}

// wantConverged checks that rel is as revision 1 left it: revision 2 reads
// failed with a description that says it was abandoned and contains each
// of want, no new revision was written, the Deployment has no nodeSelector
// (the field the abandoned revision added), REL-config holds revision 1's
// message, REL-extra (only the abandoned revision rendered it) is left in
// place and recorded on revision 2, and the lock is free.
func (x *it) wantConverged(rel string, want ...string) {
	x.t.Helper()
	ctx := context.Background()
	if got := strings.Join(x.env.Summary(x.t, x.ns, rel), " "); got != "1:deployed 2:failed" {
		x.t.Errorf("history %s; want 1:deployed 2:failed", got)
	}
	s := x.latest(rel)
	if s.Revision != 2 || string(s.Status) != "failed" {
		x.t.Errorf("latest revision %d reads %s; want 2 failed", s.Revision, s.Status)
	}
	wantContains(x.t, "the description of revision 2", s.Description, append([]string{"Abandoned pending-upgrade"}, want...)...)

	d, err := x.env.Client.AppsV1().Deployments(x.ns).Get(ctx, rel, metav1.GetOptions{})
	if err != nil {
		x.t.Fatalf("the Deployment %s: %v", rel, err)
	}
	if ns := d.Spec.Template.Spec.NodeSelector; len(ns) != 0 {
		x.t.Errorf("the Deployment keeps the abandoned revision's nodeSelector %v", ns)
	}
	if d.Annotations[recovery.AnnotationReleaseName] != rel || d.Labels[recovery.LabelManagedBy] != recovery.ManagedByHelm {
		x.t.Errorf("the Deployment lost its ownership: annotations %v labels %v", d.Annotations, d.Labels)
	}
	if cm, err := x.env.Client.CoreV1().ConfigMaps(x.ns).Get(ctx, rel+"-config", metav1.GetOptions{}); err != nil || cm.Data["message"] != "hello" {
		x.t.Errorf("%s-config holds %v (err %v); want revision 1's message=hello", rel, cm.Data, err)
	}
	// With no new revision known, the object only the abandoned revision
	// rendered stays, recorded on it for the next upgrade or install.
	if _, err := x.env.Client.CoreV1().ConfigMaps(x.ns).Get(ctx, rel+"-extra", metav1.GetOptions{}); err != nil {
		x.t.Errorf("%s-extra, which only the abandoned revision rendered, was deleted before a new revision was known: %v", rel, err)
	}
	if !strings.Contains(s.Left, rel+"-extra") {
		x.t.Errorf("revision 2 records %q as left in place; want %s-extra", s.Left, rel)
	}
	if rows := x.lockRows(rel); len(rows) != 1 || rows[0].State != inspect.StateNone {
		x.t.Errorf("the lock is not free after the recovery: %+v", rows)
	}
}

// TestIntegrationRecoverConverges: `recover` undoes what the abandoned
// revision applied before it marks it failed, as the guarded upgrade does:
// an upgrade that adds a nodeSelector and an object is SIGKILLed while it
// waits; once its lock expired, `recover` leaves the revision failed, the
// object in place (recorded for the next upgrade) and the field gone from
// the live Deployment. A long
// --recover-legacy-after shows the expired lock, not the revision's age,
// makes it recoverable.
func TestIntegrationRecoverConverges(t *testing.T) {
	for _, m := range []installMethod{serverSide, clientSide} {
		t.Run(m.name, func(t *testing.T) {
			x := newIT(t)
			const rel = "conv-recover"
			h := x.abandon(rel, m, deadLease)
			x.waitState(rel, inspect.StateExpired, time.Minute)

			// The dry run lists every object the real run then changes or
			// leaves, in the same form (issue 35 item 2).
			dry := x.run(0, "recover", rel, "--recover-legacy-after", "1h", "--dry-run")
			res := x.run(0, "recover", rel, "--recover-legacy-after", "1h")
			t.Logf("recover --dry-run:\n%s\nrecover:\nstdout:\n%s\nstderr:\n%s", dry.Stdout, res.Stdout, res.Stderr)
			wantContains(t, "recover's report", res.Stdout, "recovered.", h.session)
			wouldDo, did := objectLines(dry.Stdout), objectLines(res.Stdout)
			wantContains(t, "recover's report", strings.Join(did, "\n"),
				"Deployment "+x.ns+"/"+rel+": reverted to revision 1",
				"ConfigMap "+x.ns+"/"+rel+"-config: reverted to revision 1",
				"ConfigMap "+x.ns+"/"+rel+"-extra: left in place")
			if len(wouldDo) != len(did) {
				t.Errorf("the dry run lists %d objects, the real run %d:\n%s\n---\n%s", len(wouldDo), len(did), strings.Join(wouldDo, "\n"), strings.Join(did, "\n"))
			}
			for i := range min(len(wouldDo), len(did)) {
				obj, what, _ := strings.Cut(did[i], ": ")
				if wouldDo[i] != obj+": would be "+what {
					t.Errorf("dry run says %q where the real run says %q", wouldDo[i], did[i])
				}
			}
			x.wantConverged(rel, h.session)
		})
	}
}

// TestIntegrationUnlockConverges: `unlock --session` of a dead holder runs
// the same recovery: the revision it left pending reads failed, the object
// only that revision rendered is gone and the field it added is gone from
// the live Deployment. Once with the holder's lock expired, once while it is
// still live (--force --yes; unlock then waits until the lock would have
// expired before it converges).
func TestIntegrationUnlockConverges(t *testing.T) {
	cases := []struct {
		name   string
		method installMethod
		lease  string
		state  inspect.State
		flags  []string
		want   []string
	}{
		{
			"expired", serverSide, deadLease, inspect.StateExpired, nil,
			[]string{"its lock was released by", "helm-autorecover unlock"},
		},
		// A lease long enough that the dead holder's lock is certainly
		// still live when unlock runs (it is renewed every 10 s), and short
		// enough to wait out: a lock released before its LOCKED TILL is
		// recovered only once that has passed, since its holder may still
		// be writing until then.
		{
			"live-forced", clientSide, "30s", inspect.StateLive,
			[]string{"--force", "--yes"},
			[]string{"its live lock", "was force-released by", "helm-autorecover unlock --force"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := newIT(t)
			const rel = "conv-unlock"
			h := x.abandon(rel, c.method, c.lease)
			x.waitState(rel, c.state, time.Minute)

			res := x.run(0, append([]string{"unlock", rel, "--session", h.session}, c.flags...)...)
			t.Logf("unlock (%s):\nstdout:\n%s\nstderr:\n%s", res.Elapsed.Round(time.Millisecond), res.Stdout, res.Stderr)
			wantContains(t, "unlock's output", res.Stdout, h.session, "Marked revision 2 (pending-upgrade) failed")
			x.wantConverged(rel, append([]string{h.session}, c.want...)...)
		})
	}
}

// objectLines are the lines of a recover report's object list.
func objectLines(report string) []string {
	_, list, ok := strings.Cut(report, "Objects of the abandoned revision:\n")
	if !ok {
		return nil
	}
	var out []string
	for _, l := range strings.Split(list, "\n") {
		if !strings.HasPrefix(l, "  - ") {
			break
		}
		out = append(out, strings.TrimPrefix(l, "  - "))
	}
	return out
}
