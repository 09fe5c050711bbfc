package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// dataChart is a chart whose upgrade adds objects that hold data or state
// a delete destroys: a PersistentVolumeClaim, a LoadBalancer Service (its
// address), plus plain ConfigMaps. Revision 1 renders only the Deployment;
// abandoned=true renders every object below and next=true the ones the
// retried upgrade renders again.
var dataChart = map[string]string{
	"Chart.yaml": `apiVersion: v2
name: datasafe
description: issue 11 item 1 (test/e2e/datasafe_test.go)
version: 0.1.0
`,
	"values.yaml": `nodeSelector: {}
abandoned: false
next: false
`,
	"templates/deployment.yaml": `apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}
spec:
  replicas: 1
  selector:
    matchLabels:
      app: {{ .Release.Name }}
  template:
    metadata:
      labels:
        app: {{ .Release.Name }}
    spec:
      {{- with .Values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
      - name: app
        image: registry.example/app:1.0
`,
	// Rendered by the abandoned upgrade and by the retried one.
	"templates/again.yaml": `{{- if or .Values.abandoned .Values.next }}
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {{ .Release.Name }}-data
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
---
apiVersion: v1
kind: Service
metadata:
  name: {{ .Release.Name }}-lb
spec:
  type: LoadBalancer
  selector:
    app: {{ .Release.Name }}
  ports:
  - port: 80
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-again
data:
  a: "1"
  {{- if .Values.abandoned }}
  b: only-abandoned
  {{- end }}
{{- end }}
`,
	// Rendered by the abandoned upgrade only.
	"templates/dropped.yaml": `{{- if .Values.abandoned }}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-dropped
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-dropped-keep
  annotations:
    helm.sh/resource-policy: keep
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {{ .Release.Name }}-scratch
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
{{- end }}
`,
}

// TestRecoveryKeepsData is issue 11 item 1 (invariant S7): an upgrade that
// adds a PersistentVolumeClaim, a LoadBalancer Service and ConfigMaps is
// SIGKILLed during --wait; the retried upgrade of the same chart recovers
// the release and succeeds, and
//   - the objects it renders again are the very objects the abandoned
//     upgrade created (same UIDs: the claim, the Service with its cluster
//     IP, the ConfigMap), adopted by helm, never deleted and created again;
//   - what only the abandoned revision rendered is removed once the new
//     revision is written, as helm removes what an upgrade drops: a plain
//     ConfigMap goes, one annotated helm.sh/resource-policy: keep stays, and
//     a PersistentVolumeClaim stays unless --recover-delete-data;
//   - the fields only the abandoned revision set are gone (a nodeSelector on
//     an object both revisions render, a key of a ConfigMap rendered again).
//
// Before the fix, recovery deleted the objects only the abandoned revision
// rendered before helm ran, and helm created the claim, the Service and the
// ConfigMap again (new UIDs, an empty volume, a new address).
func TestRecoveryKeepsData(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	chart := testenv.WriteChart(t, dataChart)
	for _, c := range []struct {
		name        string
		extra       []string
		scratchGoes bool
	}{
		{"default", nil, false},
		{"recover-delete-data", []string{"--recover-delete-data"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dataSafeScenario(t, env, ha, chart, c.extra, c.scratchGoes)
		})
	}
}

func dataSafeScenario(t *testing.T, env *testenv.Env, ha, chart string, extra []string, scratchGoes bool) {
	ctx := context.Background()
	ns := env.Namespace(t)
	const rel = "ds"
	core := env.Client.CoreV1()
	mustRun(t, env, ha, "install", rel, chart, "-n", ns, "--wait", "--timeout", "2m")

	p := env.Start(t, ha, "upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m",
		"--lease-duration", killLease.String(), "--set", "abandoned=true", "--set", "nodeSelector.never=matches")
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 2*time.Minute)
	holder := waitForWriter(t, env, ns, rel, 2, 30*time.Second)
	// Everything the abandoned revision renders is applied before helm
	// waits; record what was created.
	uids := map[string]types.UID{}
	var clusterIP string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var missing []string
		get := func(key string, f func() (metav1.Object, error)) {
			o, err := f()
			if err != nil {
				missing = append(missing, key+": "+err.Error())
				return
			}
			uids[key] = o.GetUID()
		}
		get("pvc/ds-data", func() (metav1.Object, error) {
			return core.PersistentVolumeClaims(ns).Get(ctx, rel+"-data", metav1.GetOptions{})
		})
		get("pvc/ds-scratch", func() (metav1.Object, error) {
			return core.PersistentVolumeClaims(ns).Get(ctx, rel+"-scratch", metav1.GetOptions{})
		})
		get("svc/ds-lb", func() (metav1.Object, error) {
			s, err := core.Services(ns).Get(ctx, rel+"-lb", metav1.GetOptions{})
			if err == nil {
				clusterIP = s.Spec.ClusterIP
			}
			return s, err
		})
		for _, cm := range []string{"again", "dropped", "dropped-keep"} {
			get("cm/ds-"+cm, func() (metav1.Object, error) { return core.ConfigMaps(ns).Get(ctx, rel+"-"+cm, metav1.GetOptions{}) })
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the abandoned upgrade did not apply its objects: %v", missing)
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.Kill(t)

	// The same chart again, as a CI job retries it. No --wait: the claim
	// stays Pending without a provisioner.
	res := env.Run(t, ha, args([]string{"upgrade", rel, chart, "-n", ns, "--lock-timeout", "60s", "--set", "next=true"}, extra)...)
	if res.ExitCode != 0 {
		t.Fatalf("the retried upgrade: exit %d\nstderr:\n%s\nhistory: %v", res.ExitCode, res.Stderr, env.Summary(t, ns, rel))
	}
	t.Logf("stderr of the retried upgrade:\n%s", res.Stderr)
	if !strings.Contains(res.Stderr, "recovered") || !strings.Contains(res.Stderr, holder.Session) {
		t.Errorf("the retried upgrade does not report recovering session %s:\n%s", holder.Session, res.Stderr)
	}
	revs := wantHistory(t, env, ns, rel, "1:superseded 2:failed 3:deployed")
	abandoned(t, revs[1], "pending-upgrade", holder.Session)

	// Rendered again: the same objects, adopted.
	same := func(key string, o metav1.Object, err error) {
		t.Helper()
		switch {
		case err != nil:
			t.Errorf("%s after the retried upgrade: %v", key, err)
		case o.GetUID() != uids[key] || o.GetDeletionTimestamp() != nil:
			t.Errorf("%s was deleted and created again (UID %s, was %s; deletionTimestamp %v): S7 says recovery never deletes what the next operation renders", key, o.GetUID(), uids[key], o.GetDeletionTimestamp())
		case o.GetAnnotations()["meta.helm.sh/release-name"] != rel:
			t.Errorf("%s is not owned by the release: %v", key, o.GetAnnotations())
		}
	}
	pvc, err := core.PersistentVolumeClaims(ns).Get(ctx, rel+"-data", metav1.GetOptions{})
	same("pvc/ds-data", pvc, err)
	svc, err := core.Services(ns).Get(ctx, rel+"-lb", metav1.GetOptions{})
	same("svc/ds-lb", svc, err)
	if err == nil && svc.Spec.ClusterIP != clusterIP {
		t.Errorf("the LoadBalancer's cluster IP changed from %s to %s", clusterIP, svc.Spec.ClusterIP)
	}
	cm, err := core.ConfigMaps(ns).Get(ctx, rel+"-again", metav1.GetOptions{})
	same("cm/ds-again", cm, err)
	if err == nil && (len(cm.Data) != 1 || cm.Data["a"] != "1") {
		t.Errorf("ConfigMap %s-again holds %v; want only a=1 (the field only the abandoned revision set is removed)", rel, cm.Data)
	}

	// Only the abandoned revision rendered these.
	if _, err := core.ConfigMaps(ns).Get(ctx, rel+"-dropped", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ConfigMap %s-dropped (only the abandoned revision rendered it) survives: %v", rel, err)
	}
	cm, err = core.ConfigMaps(ns).Get(ctx, rel+"-dropped-keep", metav1.GetOptions{})
	same("cm/ds-dropped-keep", cm, err)
	scratch, err := core.PersistentVolumeClaims(ns).Get(ctx, rel+"-scratch", metav1.GetOptions{})
	if scratchGoes {
		// (the pvc-protection finalizer may hold it a moment)
		if err == nil && scratch.DeletionTimestamp == nil {
			t.Errorf("with --recover-delete-data, claim %s-scratch (only the abandoned revision rendered it) survives", rel)
		}
	} else {
		same("pvc/ds-scratch", scratch, err)
		if !strings.Contains(res.Stderr, rel+"-scratch") {
			t.Errorf("stderr does not report the claim %s-scratch it kept:\n%s", rel, res.Stderr)
		}
	}

	// The field only the abandoned revision set is gone.
	d, err := env.Client.AppsV1().Deployments(ns).Get(ctx, rel, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Spec.Template.Spec.NodeSelector) != 0 {
		t.Errorf("the Deployment keeps the abandoned revision's nodeSelector %v", d.Spec.Template.Spec.NodeSelector)
	}
	waitLockFree(t, env, ns, rel, 10*time.Second)
}
