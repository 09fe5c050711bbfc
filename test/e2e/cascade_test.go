package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// cascadeChart's abandoned upgrade (abandoned=true) adds what owns data
// through the garbage collector: a StatefulSet whose claims go with it
// (persistentVolumeClaimRetentionPolicy.whenDeleted: Delete), a cluster
// resource of a database operator (kind PGCluster of group .Values.group),
// which the test, acting as the operator, makes the owner of a claim; and
// a plain ConfigMap. The StatefulSet never schedules, so --wait hangs.
var cascadeChart = map[string]string{
	"Chart.yaml": `apiVersion: v2
name: cascade
description: issue 31 item 1 (test/e2e/cascade_test.go)
version: 0.1.0
`,
	"values.yaml": `abandoned: false
group: example.com
`,
	"templates/base.yaml": `apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-base
`,
	"templates/abandoned.yaml": `{{- if .Values.abandoned }}
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {{ .Release.Name }}-db
spec:
  serviceName: {{ .Release.Name }}-db
  replicas: 1
  persistentVolumeClaimRetentionPolicy:
    whenDeleted: Delete
    whenScaled: Retain
  selector:
    matchLabels: {app: {{ .Release.Name }}-db}
  template:
    metadata:
      labels: {app: {{ .Release.Name }}-db}
    spec:
      nodeSelector: {never: matches}
      containers:
      - name: db
        image: registry.example/db:1.0
  volumeClaimTemplates:
  - metadata:
      name: data
    spec:
      accessModes: [ReadWriteOnce]
      resources:
        requests:
          storage: 1Gi
---
apiVersion: {{ .Values.group }}/v1
kind: PGCluster
metadata:
  name: {{ .Release.Name }}-pg
spec:
  instances: 1
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-plain
{{- end }}
`,
}

// TestRecoveryKeepsDataByCascade is issue 31 item 1 (S7) with the real
// binary, the real garbage collector and StatefulSet controller: an
// upgrade that adds a StatefulSet whose claims go with it and a custom
// resource that owns a claim is SIGKILLed during --wait once the claims
// exist. Whoever recovers it (the recover command, the controller, or the
// retried upgrade itself), nothing is deleted before a new revision is
// known; the retried upgrade, which no longer renders them, keeps both
// owners (and so their claims, same UIDs), and removes the plain ConfigMap
// only the abandoned revision rendered. Before the fix, recover and the
// controller deleted the StatefulSet and the custom resource at once and
// the garbage collector took the claims with them.
func TestRecoveryKeepsDataByCascade(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	chart := testenv.WriteChart(t, cascadeChart)
	for _, by := range []string{"recover", "controller", "upgrade"} {
		t.Run(by, func(t *testing.T) { cascadeScenario(t, env, ha, chart, by) })
	}
}

func cascadeScenario(t *testing.T, env *testenv.Env, ha, chart, by string) {
	ctx := context.Background()
	ns := env.Namespace(t)
	group := ns + ".example.com"
	env.InstallCRD(t, group, "pgclusters", "PGCluster", apiextv1.NamespaceScoped, nil)
	const rel = "cas"
	core := env.Client.CoreV1()
	mustRun(t, env, ha, "install", rel, chart, "-n", ns, "--set", "group="+group)

	p := env.Start(t, ha, "upgrade", rel, chart, "-n", ns, "--wait", "--timeout", "5m",
		"--lease-duration", killLease.String(), "--set", "abandoned=true", "--set", "group="+group)
	env.WaitForStatus(t, ns, rel, 2, "pending-upgrade", 2*time.Minute)
	waitForWriter(t, env, ns, rel, 2, 30*time.Second)

	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	pgs := dyn.Resource(schema.GroupVersionResource{Group: group, Version: "v1", Resource: "pgclusters"}).Namespace(ns)
	claims := map[string]types.UID{}
	owners := map[string]types.UID{}
	deadline := time.Now().Add(2 * time.Minute)
	for len(claims) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the abandoned upgrade's owners and claims did not appear: %v %v", owners, claims)
		}
		time.Sleep(100 * time.Millisecond)
		// The operator: the cluster resource owns its claim.
		if pg, err := pgs.Get(ctx, rel+"-pg", metav1.GetOptions{}); err == nil && claims[rel+"-pg-data"] == "" {
			owners["pg"] = pg.GetUID()
			c, err := core.PersistentVolumeClaims(ns).Create(ctx,
				testenv.Claim(rel+"-pg-data", metav1.OwnerReference{APIVersion: group + "/v1", Kind: "PGCluster", Name: pg.GetName(), UID: pg.GetUID()}),
				metav1.CreateOptions{FieldManager: "pg-operator"})
			if err != nil {
				t.Fatal(err)
			}
			claims[c.Name] = c.UID
		}
		// The StatefulSet controller: the claim of pod 0, owned by the
		// StatefulSet (whenDeleted: Delete).
		if sts, err := env.Client.AppsV1().StatefulSets(ns).Get(ctx, rel+"-db", metav1.GetOptions{}); err == nil {
			owners["sts"] = sts.UID
			if c, err := core.PersistentVolumeClaims(ns).Get(ctx, "data-"+rel+"-db-0", metav1.GetOptions{}); err == nil {
				for _, o := range c.OwnerReferences {
					if o.UID == sts.UID {
						claims[c.Name] = c.UID
					}
				}
			}
		}
	}
	plain, err := core.ConfigMaps(ns).Get(ctx, rel+"-plain", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Kill(t)

	present := func(when string) {
		t.Helper()
		if s, err := env.Client.AppsV1().StatefulSets(ns).Get(ctx, rel+"-db", metav1.GetOptions{}); err != nil || s.UID != owners["sts"] || s.DeletionTimestamp != nil {
			t.Errorf("%s: the StatefulSet was deleted (%v)", when, err)
		}
		if pg, err := pgs.Get(ctx, rel+"-pg", metav1.GetOptions{}); err != nil || pg.GetUID() != owners["pg"] || pg.GetDeletionTimestamp() != nil {
			t.Errorf("%s: the PGCluster was deleted (%v)", when, err)
		}
		for name, uid := range claims {
			c, err := core.PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || c.UID != uid || c.DeletionTimestamp != nil {
				t.Errorf("%s: claim %s was deleted (%v)", when, name, err)
			}
		}
	}

	switch by {
	case "recover":
		res := env.Run(t, ha, "recover", rel, "-n", ns, "--lock-timeout", "60s")
		if res.ExitCode != 0 {
			t.Fatalf("recover: exit %d\n%s", res.ExitCode, res.Stderr)
		}
		t.Logf("recover:\n%s%s", res.Stdout, res.Stderr)
	case "controller":
		startController(t, env, "", "--namespaces", ns, "--leader-elect=false")
		waitRecovered(t, env, ns, rel, 2, 2*time.Minute)
	}
	if by != "upgrade" {
		// Recovered with no new revision known: nothing was deleted, and
		// what waits is recorded on the failed revision.
		revs := wantHistory(t, env, ns, rel, "1:deployed 2:failed")
		if !strings.Contains(revs[1].Left, rel+"-plain") || !strings.Contains(revs[1].Left, rel+"-db") {
			t.Errorf("revision 2 records %q; want the objects only it rendered", revs[1].Left)
		}
		if c, err := core.ConfigMaps(ns).Get(ctx, rel+"-plain", metav1.GetOptions{}); err != nil || c.UID != plain.UID {
			t.Errorf("ConfigMap %s-plain was deleted before a new revision was known (%v)", rel, err)
		}
		present("after " + by)
	}

	// The retried upgrade no longer renders them.
	res := env.Run(t, ha, "upgrade", rel, chart, "-n", ns, "--lock-timeout", "60s", "--set", "group="+group)
	if res.ExitCode != 0 {
		t.Fatalf("the retried upgrade: exit %d\nstderr:\n%s\nhistory: %v", res.ExitCode, res.Stderr, env.Summary(t, ns, rel))
	}
	t.Logf("stderr of the retried upgrade:\n%s", res.Stderr)
	wantHistory(t, env, ns, rel, "1:superseded 2:failed 3:deployed")
	if _, err := core.ConfigMaps(ns).Get(ctx, rel+"-plain", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ConfigMap %s-plain (only the abandoned revision rendered it) survives: %v", rel, err)
	}
	for _, want := range []string{"StatefulSet " + ns + "/" + rel + "-db", "PGCluster " + ns + "/" + rel + "-pg", "--recover-delete-data"} {
		if !strings.Contains(res.Stderr, want) {
			t.Errorf("the retried upgrade does not report %q as kept:\n%s", want, res.Stderr)
		}
	}
	present("after the retried upgrade")
	waitLockFree(t, env, ns, rel, 10*time.Second)
}
