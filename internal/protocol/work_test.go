package protocol

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// withHooks is rec with the hooks helm records in a release: a Job and a
// ConfigMap in the release's namespace, and a Pod whose manifest names
// namespace "other".
func withHooks(t *testing.T, rec *corev1.Secret) *corev1.Secret {
	t.Helper()
	doc, err := helmx.DecodeReleaseJSON(rec.Data[helmx.ReleaseDataKey])
	if err != nil {
		t.Fatal(err)
	}
	doc = []byte(strings.TrimSuffix(string(doc), "}") + `,"hooks":[` +
		`{"name":"web-migrate","kind":"Job","path":"app/templates/migrate.yaml","manifest":"apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: web-migrate\n  annotations:\n    helm.sh/hook: pre-upgrade\n","events":["pre-upgrade"],"last_run":{"phase":"Running"}},` +
		`{"name":"web-check","kind":"Pod","path":"app/templates/check.yaml","manifest":"apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-check\n  namespace: other\n","events":["post-upgrade"],"last_run":{"phase":""}},` +
		`{"name":"web-cfg","kind":"ConfigMap","path":"app/templates/cfg.yaml","manifest":"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-cfg\n","events":["pre-upgrade"],"last_run":{"phase":"Succeeded"}}]}`)
	payload, err := helmx.EncodeReleaseJSON(doc)
	if err != nil {
		t.Fatal(err)
	}
	rec.Data[helmx.ReleaseDataKey] = payload
	return rec
}

func hookJob(created time.Time, done batchv1.JobConditionType) *batchv1.Job {
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "web-migrate", Namespace: "shop", CreationTimestamp: metav1.NewTime(created)}}
	if done != "" {
		j.Status.Conditions = []batchv1.JobCondition{{Type: done, Status: corev1.ConditionTrue}}
	}
	return j
}

func hookPod(created time.Time, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-check", Namespace: "other", CreationTimestamp: metav1.NewTime(created)}, Status: corev1.PodStatus{Phase: phase}}
}

// hookReads counts the requests made for hooks: reads of Jobs and Pods,
// and reads of a single release record (the history is a list).
func hookReads(c *fake.Clientset) int {
	n := 0
	for _, a := range c.Actions() {
		switch r := a.GetResource().Resource; {
		case r == "jobs" || r == "pods", r == "secrets" && a.GetVerb() == "get":
			n++
		}
	}
	return n
}

// TestRecoverLooksForHelmAtWork: before a legacy pending revision old
// enough to recover is recovered, the hook Jobs and Pods its record names
// are read, and one created since the revision that has not finished holds
// it back, named, with a retry (issue 31). What cannot be read holds it
// back too.
func TestRecoverLooksForHelmAtWork(t *testing.T) {
	ctx := context.Background()
	created := t0.Add(-time.Hour) // server time is t0+1m: old enough
	policy := recovery.Policy{Autorecover: true, LegacyAfter: 15 * time.Minute}
	cases := []struct {
		name      string
		objs      []runtime.Object
		forbidden bool
		verdict   recovery.Verdict
		reasonHas string
	}{
		{
			name: "a hook Job still runs", objs: []runtime.Object{hookJob(created.Add(50*time.Minute+time.Second), "")},
			verdict: recovery.Blocked, reasonHas: "its hook Job shop/web-migrate, created at 2026-12-03T11:50:01Z, is still running",
		},
		{
			name: "the Job completed, a hook Pod in another namespace runs", objs: []runtime.Object{hookJob(created.Add(time.Second), batchv1.JobComplete), hookPod(created.Add(50*time.Minute), corev1.PodRunning)},
			verdict: recovery.Blocked, reasonHas: "its hook Pod other/web-check",
		},
		{
			name: "every hook finished", objs: []runtime.Object{hookJob(created.Add(time.Second), batchv1.JobFailed), hookPod(created.Add(time.Minute), corev1.PodSucceeded)},
			verdict: recovery.Recover,
		},
		{
			name: "a running Job older than the revision is an earlier operation's", objs: []runtime.Object{hookJob(created.Add(-time.Minute), "")},
			verdict: recovery.Recover,
		},
		{name: "no hook object exists", verdict: recovery.Recover},
		{
			name: "a hook that cannot be read", objs: []runtime.Object{hookJob(created.Add(time.Second), batchv1.JobComplete)}, forbidden: true,
			verdict: recovery.Blocked, reasonHas: "cannot be told: reading its hook Job shop/web-migrate",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Our take put our lock on the newest record; stock helm wrote it.
			r2 := withHooks(t, revision(t, 2, common.StatusPendingUpgrade, created))
			r2.Annotations = map[string]string{lock.AnnotationRecord: `{"schema":1,"session":"rec-session","release":"web","namespace":"shop"}`}
			objs := append([]runtime.Object{revision(t, 1, common.StatusFailed, created.Add(-time.Hour)), r2}, c.objs...)
			conn, client := fakeConn(t, objs...)
			if c.forbidden {
				client.PrependReactor("get", "jobs", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewForbidden(batchv1.Resource("jobs"), "web-migrate", errors.New("no get on jobs"))
				})
			}
			out, err := conn.Recover(ctx, Procedure{Release: "web", Namespace: "shop", Lock: recovery.LockInfo{State: recovery.LockNone}, Policy: policy, Next: lock.OpRecover, Writer: &writer{}})
			if err != nil {
				t.Fatal(err)
			}
			d := out.Decision
			if d.Verdict != c.verdict || !strings.Contains(d.Reason, c.reasonHas) {
				t.Fatalf("%s: %s; want %s, a reason with %q", d.Verdict, d.Reason, c.verdict, c.reasonHas)
			}
			if c.verdict == recovery.Blocked && (d.RetryAfter != recovery.HookRecheck || len(out.Marked) != 0 || secretWrites(client) != 0) {
				t.Errorf("held back: retry after %s, %d marked, %d writes; want a retry, nothing written", d.RetryAfter, len(out.Marked), secretWrites(client))
			}
			if c.verdict == recovery.Recover && len(out.Marked) != 1 {
				t.Errorf("recovered %d revisions, want revision 2", len(out.Marked))
			}
		})
	}
}

// TestRecoverLooksForHelmAtWorkOnlyWhenAboutToRecover: hooks are read for
// a legacy revision about to be recovered, never otherwise: a young legacy
// revision, a revision of an expired holder, a settled release cost no
// request for them.
func TestRecoverLooksForHelmAtWorkOnlyWhenAboutToRecover(t *testing.T) {
	ctx := context.Background()
	running := hookJob(t0.Add(-time.Hour), "")
	r2 := func(created time.Time, status common.Status, lockAnn string) *corev1.Secret {
		s := withHooks(t, revision(t, 2, status, created))
		if lockAnn != "" {
			s.Annotations = map[string]string{lock.AnnotationRecord: lockAnn}
		}
		return s
	}
	taken := `{"schema":1,"session":"rec-session","release":"web","namespace":"shop","abandoned":{"schema":1,"session":"dead","release":"web","namespace":"shop","revision":2}}`
	cases := []struct {
		name  string
		rec   *corev1.Secret
		lock  recovery.LockInfo
		reads int
	}{
		{"young legacy revision", r2(t0.Add(-time.Minute), common.StatusPendingUpgrade, ""), recovery.LockInfo{}, 0},
		{"revision of an expired holder", r2(t0, common.StatusPendingUpgrade, taken), dead, 0},
		{"settled release", r2(t0.Add(-time.Hour), common.StatusDeployed, ""), recovery.LockInfo{}, 0},
		{"old legacy revision", r2(t0.Add(-time.Hour), common.StatusPendingUpgrade, ""), recovery.LockInfo{}, 3}, // its record, the Job, the Pod
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn, client := fakeConn(t, revision(t, 1, common.StatusSuperseded, t0.Add(-2*time.Hour)), c.rec, running)
			if _, err := conn.Recover(ctx, Procedure{Release: "web", Namespace: "shop", Lock: c.lock, Policy: recovery.Policy{Autorecover: true, LegacyAfter: 15 * time.Minute}, Next: lock.OpRecover}); err != nil {
				t.Fatal(err)
			}
			if n := hookReads(client); n != c.reads {
				t.Errorf("%d reads for hooks; want %d", n, c.reads)
			}
		})
	}
}

// TestRecoverLooksForGeneratedHooks: a hook named by generateName is found
// among the namespace's Jobs by the prefix the server named it from.
func TestRecoverLooksForGeneratedHooks(t *testing.T) {
	ctx := context.Background()
	created := t0.Add(-time.Hour)
	r2 := revision(t, 2, common.StatusPendingUpgrade, created)
	doc, err := helmx.DecodeReleaseJSON(r2.Data[helmx.ReleaseDataKey])
	if err != nil {
		t.Fatal(err)
	}
	doc = []byte(strings.TrimSuffix(string(doc), "}") + `,"hooks":[{"kind":"Job","manifest":"apiVersion: batch/v1\nkind: Job\nmetadata:\n  generateName: web-seed-\n","events":["post-upgrade"]}]}`)
	if r2.Data[helmx.ReleaseDataKey], err = helmx.EncodeReleaseJSON(doc); err != nil {
		t.Fatal(err)
	}
	job := func(name string, done batchv1.JobConditionType) *batchv1.Job {
		j := hookJob(created.Add(50*time.Minute), done)
		j.Name = name
		return j
	}
	for _, c := range []struct {
		name string
		jobs []runtime.Object
		want recovery.Verdict
	}{
		{"a generated Job runs", []runtime.Object{job("web-seed-x7k2p", ""), job("other", batchv1.JobComplete)}, recovery.Blocked},
		{"the generated Jobs finished; another Job runs", []runtime.Object{job("web-seed-x7k2p", batchv1.JobComplete), job("web-other", "")}, recovery.Recover},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, _ := fakeConn(t, append([]runtime.Object{revision(t, 1, common.StatusFailed, created.Add(-time.Hour)), r2.DeepCopy()}, c.jobs...)...)
			out, err := conn.Recover(ctx, Procedure{Release: "web", Namespace: "shop", Policy: recovery.Policy{Autorecover: true, LegacyAfter: 15 * time.Minute}, Next: lock.OpRecover})
			if err != nil {
				t.Fatal(err)
			}
			if d := out.Decision; d.Verdict != c.want || (c.want == recovery.Blocked && !strings.Contains(d.Reason, "hook Job shop/web-seed-x7k2p")) {
				t.Errorf("%s: %s; want %s", d.Verdict, d.Reason, c.want)
			}
		})
	}
}
