package recovery

import (
	"strings"
	"testing"
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
