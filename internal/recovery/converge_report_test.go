package recovery

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestConvergeReportSummary(t *testing.T) {
	rep := ConvergeReport{
		Release: "web", Namespace: "shop", Abandoned: 2, Base: 1, Method: ServerSideApply,
		Objects: []ObjectResult{
			{Object: ObjectRef{Kind: "Deployment", Namespace: "shop", Name: "web"}, Action: ActionReverted},
			{Object: ObjectRef{Kind: "ConfigMap", Namespace: "shop", Name: "web-config"}, Action: ActionInSync, Reason: "no field differs"},
			{Object: ObjectRef{Kind: "ConfigMap", Namespace: "shop", Name: "web-extra"}, Action: ActionDeleted},
			{Object: ObjectRef{Kind: "ConfigMap", Namespace: "shop", Name: "web-keep"}, Action: ActionKept, Reason: "helm.sh/resource-policy: keep"},
			{Object: ObjectRef{Kind: "ClusterRole", Name: "web-reader"}, Action: ActionFailed, Reason: "forbidden"},
		},
	}
	want := `release "web" in namespace "shop": undid what abandoned revision 2 applied, back to deployed revision 1 (server-side apply): ` +
		`reverted Deployment shop/web; deleted ConfigMap shop/web-extra; kept ConfigMap shop/web-keep (helm.sh/resource-policy: keep); failed ClusterRole web-reader (forbidden)`
	if got := rep.Summary(); got != want {
		t.Errorf("summary\n got %s\nwant %s", got, want)
	}
	if !rep.Changed() {
		t.Error("Changed() = false")
	}
	if !rep.Notable() {
		t.Error("Notable() = false")
	}
	quiet := ConvergeReport{
		Release: "web", Namespace: "shop", Abandoned: 2, Base: 1,
		Objects: []ObjectResult{{Object: ObjectRef{Kind: "ConfigMap", Namespace: "shop", Name: "web-config"}, Action: ActionInSync}},
	}
	if got := quiet.Summary(); !strings.HasSuffix(got, "(client-side apply): nothing to undo") || quiet.Changed() || quiet.Notable() {
		t.Errorf("quiet summary %q", got)
	}
	kept := ConvergeReport{Objects: []ObjectResult{{Action: ActionKept}}}
	if kept.Changed() || !kept.Notable() {
		t.Error("a kept object: want Notable and not Changed")
	}
}

func TestConvergeReportSummaryDeferred(t *testing.T) {
	cm := func(name string) ObjectRef { return ObjectRef{Kind: "ConfigMap", Namespace: "shop", Name: name} }
	before := ConvergeReport{
		Release: "web", Namespace: "shop", Abandoned: 2, Base: 1,
		Objects:  []ObjectResult{{Object: cm("web-extra"), Action: ActionDeferred, Reason: "later"}},
		Deferred: &Deferred{Objects: nil, Refs: []ObjectRef{cm("web-extra")}},
	}
	if got := before.Summary(); !strings.Contains(got, "deferred ConfigMap shop/web-extra;") || !strings.Contains(got, "once the next upgrade or install has written its revision") || before.Changed() || !before.Notable() {
		t.Errorf("summary before the operation: %s", got)
	}
	after := ConvergeReport{
		Release: "web", Namespace: "shop", Abandoned: 2, After: 3,
		Objects: []ObjectResult{
			{Object: cm("web-extra"), Action: ActionDeleted},
			{Object: cm("web-again"), Action: ActionKept, Reason: "revision 3 renders it again"},
		},
	}
	want := `release "web" in namespace "shop": what only abandoned revision 2 rendered, settled against revision 3: deleted ConfigMap shop/web-extra; kept ConfigMap shop/web-again (revision 3 renders it again)`
	if got := after.Summary(); got != want {
		t.Errorf("summary after the operation\n got %s\nwant %s", got, want)
	}
	if got := before.Deferred.Names(); got != "ConfigMap shop/web-extra" {
		t.Errorf("Names() = %q", got)
	}
}

// TestHeldBack: a rollback after converge may go on only when helm itself
// would keep what recovery kept: an exact keep on the live object. Any
// other reason to keep, and a deferred object, holds it back.
func TestHeldBack(t *testing.T) {
	ref := func(name string) ObjectRef { return ObjectRef{Kind: "ConfigMap", Namespace: "shop", Name: name} }
	at := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	rendered := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "web-extra"}}}
	keep := keepReason(
		liveObj(map[string]string{AnnotationReleaseName: "web", AnnotationReleaseNamespace: "shop", AnnotationResourcePolicy: "keep"}, map[string]string{LabelManagedBy: ManagedByHelm}, at),
		rendered, "web", "shop", at, false)
	spaced := keepReason(
		liveObj(map[string]string{AnnotationReleaseName: "web", AnnotationReleaseNamespace: "shop", AnnotationResourcePolicy: " Keep"}, map[string]string{LabelManagedBy: ManagedByHelm}, at),
		rendered, "web", "shop", at, false)
	if keep != ReasonPolicyKeep || spaced == ReasonPolicyKeep || spaced == "" {
		t.Fatalf("keep reasons: exact %q, spaced %q", keep, spaced)
	}
	for _, c := range []struct {
		name string
		obj  ObjectResult
		held bool
	}{
		{"exact keep on the live object", ObjectResult{Object: ref("a"), Action: ActionKept, Reason: keep}, false},
		{"keep spelled loosely", ObjectResult{Object: ref("b"), Action: ActionKept, Reason: spaced}, true},
		{"a data holder", ObjectResult{Object: ref("c"), Action: ActionKept, Reason: "a PersistentVolumeClaim holds data"}, true},
		{"deferred", ObjectResult{Object: ref("d"), Action: ActionDeferred}, true},
		{"deleted", ObjectResult{Object: ref("e"), Action: ActionDeleted}, false},
		{"reverted", ObjectResult{Object: ref("f"), Action: ActionReverted}, false},
	} {
		got := ConvergeReport{Objects: []ObjectResult{c.obj}}.HeldBack()
		if (len(got) > 0) != c.held {
			t.Errorf("%s: held back %v, want %v", c.name, got, c.held)
		}
	}
}

// TestConvergeReportLines: one line per object written, left or kept, with
// its reason; in-sync objects are left out; a dry run says the same with
// "would be" (issue 35 item 2: the dry run and the report list the same
// objects in the same form).
func TestConvergeReportLines(t *testing.T) {
	ref := func(kind, name string) ObjectRef { return ObjectRef{Kind: kind, Namespace: "shop", Name: name} }
	rep := ConvergeReport{
		Release: "web", Namespace: "shop", Abandoned: 2, Base: 1,
		Objects: []ObjectResult{
			{Object: ref("Deployment", "web"), Action: ActionReverted},
			{Object: ref("ConfigMap", "web-config"), Action: ActionInSync, Reason: "no field differs"},
			{Object: ref("ConfigMap", "web-extra"), Action: ActionDeferred, Reason: "removed once the next upgrade or install has written its revision"},
			{Object: ref("StatefulSet", "db"), Action: ActionKept, Reason: "a StatefulSet whose claims go with it"},
			{Object: ref("ConfigMap", "web-gone"), Action: ActionDeleted},
			{Object: ref("Role", "web"), Action: ActionFailed, Reason: "forbidden"},
		},
	}
	want := []string{
		"Deployment shop/web: reverted to revision 1",
		"ConfigMap shop/web-extra: left in place (only revision 2 rendered it): removed once the next upgrade or install has written its revision",
		"StatefulSet shop/db: kept: a StatefulSet whose claims go with it",
		"ConfigMap shop/web-gone: deleted (only revision 2 rendered it)",
		"Role shop/web: failed: forbidden",
	}
	if got := rep.Lines(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	rep.DryRun = true
	want[4] = "Role shop/web: not previewed: forbidden" // (a dry run that could not read or dry-run it)
	for i, l := range rep.Lines() {
		obj, what, _ := strings.Cut(want[i], ": ")
		if i != 4 {
			what = "would be " + what
		}
		if l != obj+": "+what {
			t.Errorf("dry-run line %d: %q; want %q", i, l, obj+": "+what)
		}
	}
}
