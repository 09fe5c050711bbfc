package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
	"github.com/helm-autorecover/helm-autorecover/internal/version"
)

// The chart under test, its release name and namespace in rendered output.
const (
	chartRel = "hac"
	chartNS  = "ops"
	// chartFull is the chart's full name for release hac; chartRBAC the
	// name of its cluster-scoped and out-of-namespace RBAC objects.
	chartFull = "hac-helm-autorecover"
	chartRBAC = "hac-helm-autorecover-ops"
)

func chartDir(root string) string { return filepath.Join(root, "charts", "helm-autorecover") }

// TestChartVersionMatchesProject: Chart.yaml is apiVersion v2 and its
// version and appVersion are the project version of internal/version, word
// for word (TestOneVersionEverywhere checks it against the other three).
func TestChartVersionMatchesProject(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chartDir(testenv.RepoRoot()), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		APIVersion string `json:"apiVersion"`
		Name       string `json:"name"`
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yamlutil.Unmarshal(raw, &c); err != nil {
		t.Fatalf("Chart.yaml: %v", err)
	}
	if c.APIVersion != "v2" || c.Name != "helm-autorecover" {
		t.Errorf("Chart.yaml apiVersion %q name %q; want v2, helm-autorecover", c.APIVersion, c.Name)
	}
	if c.Version != version.Version {
		t.Errorf("Chart.yaml version %q; want %q (internal/version.Version)", c.Version, version.Version)
	}
	if c.AppVersion != version.Version {
		t.Errorf("Chart.yaml appVersion %q; want %q (internal/version.Version)", c.AppVersion, version.Version)
	}
}

// TestChartValuesDocumented: every value of values.yaml has a comment (its
// own or one of an enclosing value's), and every commented value is
// described in docs/controller.md by its dotted path.
func TestChartValuesDocumented(t *testing.T) {
	root := testenv.RepoRoot()
	raw, err := os.ReadFile(filepath.Join(chartDir(root), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := os.ReadFile(filepath.Join(root, "docs", "controller.md"))
	if err != nil {
		t.Fatal(err)
	}
	keyLine := regexp.MustCompile(`^( *)(- )?([A-Za-z][A-Za-z0-9]*):(.*)$`)
	type key struct {
		indent     int
		path       string
		documented bool
	}
	var stack []key
	lines := strings.Split(string(raw), "\n")
	nextContent := func(i int) string {
		for _, l := range lines[i+1:] {
			if s := strings.TrimSpace(l); s != "" && !strings.HasPrefix(s, "#") {
				return l
			}
		}
		return ""
	}
	checked := 0
	for i, line := range lines {
		m := keyLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		indent := len(m[1]) + len(m[2])
		for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
			stack = stack[:len(stack)-1]
		}
		inherited, inList := false, m[2] != ""
		path := m[3]
		for _, k := range stack {
			inherited = inherited || k.documented
		}
		if len(stack) > 0 {
			path = stack[len(stack)-1].path + "." + m[3]
		}
		own := i > 0 && strings.HasPrefix(strings.TrimSpace(lines[i-1]), "#")
		// A key with no value on its line whose next line is a deeper key
		// is a group: its own keys carry the comments.
		next := keyLine.FindStringSubmatch(nextContent(i))
		group := strings.TrimSpace(m[4]) == "" && next != nil && next[2] == "" && len(next[1]) > indent
		stack = append(stack, key{indent: indent, path: path, documented: own || inherited})
		if inList || inherited {
			continue
		}
		checked++
		if !group && !own {
			t.Errorf("values.yaml:%d: value %s has no comment", i+1, path)
		}
		if own && !strings.Contains(string(docs), "`"+path+"`") {
			t.Errorf("docs/controller.md does not describe value `%s`", path)
		}
	}
	if checked < 30 {
		t.Fatalf("checked only %d values of values.yaml; the parser is broken", checked)
	}
}

// TestChartLint: stock helm v4 (and v3) lint the chart cleanly, with
// --strict, with the default values and with the optional parts on.
func TestChartLint(t *testing.T) {
	env := testenv.Get(t)
	dir := chartDir(env.RepoRoot)
	for _, helm := range []string{env.Helm4, env.Helm3} {
		for _, set := range [][]string{
			nil,
			{"--set", "namespaces={team-a,team-b}", "--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true", "--set", "grafanaDashboard.enabled=true", "--set", "grafanaDashboard.folder=Helm"},
			{"--set", "helmDriver=configmap", "--set", "lockBackend=release", "--set", "recoverStrategy=rollback", "--set", "recoverDeleteData=true"},
		} {
			res := mustRun(t, env, helm, append([]string{"lint", "--strict", dir}, set...)...)
			if !strings.Contains(res.Stdout, "0 chart(s) failed") || strings.Contains(res.Stdout, "[WARNING]") || strings.Contains(res.Stdout, "[ERROR]") {
				t.Errorf("%s lint %v:\n%s", filepath.Base(helm), set, res.Stdout)
			}
		}
	}
}

// chartRender runs `helm template` on the chart (release hac in namespace
// ops) and returns the rendered objects.
func chartRender(t *testing.T, env *testenv.Env, set ...string) []unstructured.Unstructured {
	t.Helper()
	a := append([]string{"template", chartRel, chartDir(env.RepoRoot), "-n", chartNS}, set...)
	res := mustRun(t, env, env.Helm4, a...)
	return chartDecode(t, res.Stdout)
}

func chartDecode(t *testing.T, out string) []unstructured.Unstructured {
	t.Helper()
	dec := yamlutil.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	var objs []unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("decoding rendered chart: %v\n%s", err, out)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, unstructured.Unstructured{Object: m})
	}
	return objs
}

// chartObjects indexes rendered objects by "Kind namespace/name" (or "Kind
// name" when cluster-scoped).
func chartObjects(objs []unstructured.Unstructured) map[string]*unstructured.Unstructured {
	out := map[string]*unstructured.Unstructured{}
	for i := range objs {
		out[chartKey(objs[i].GetKind(), objs[i].GetNamespace(), objs[i].GetName())] = &objs[i]
	}
	return out
}

func chartKey(kind, ns, name string) string {
	if ns == "" {
		return kind + " " + name
	}
	return kind + " " + ns + "/" + name
}

func chartTyped[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	var v T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, &v, true); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return &v
}

// chartAccess is "verb[,verb...] resource[.group]", e.g. "create leases.coordination.k8s.io".
type chartAccess string

func (a chartAccess) split() (verbs []string, resource, group string) {
	v, rg, _ := strings.Cut(string(a), " ")
	resource, group, _ = strings.Cut(rg, ".")
	return strings.Split(v, ","), resource, group
}

// chartRulesAllow reports whether rules grant verb on resource in group (on every
// object of it, not only named ones).
func chartRulesAllow(rules []rbacv1.PolicyRule, verb, resource, group string) bool {
	for _, r := range rules {
		if len(r.ResourceNames) == 0 && slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}

// chartRoleWant is what one rendered Role or ClusterRole must and must not grant.
type chartRoleWant struct{ allow, deny []chartAccess }

// Rights every watched place needs, whatever the values (the secret driver).
var (
	chartRecordRights = []chartAccess{
		"get,list,watch,create,update,delete secrets",
		"create events.events.k8s.io",
		// a legacy revision's hooks, read before it is recovered
		"get,list pods",
		"get,list jobs.batch",
	}
	chartLeaseRights    = chartAccess("get,list,watch,create,update,delete leases.coordination.k8s.io")
	chartRecoveryRights = []chartAccess{
		"get,list,patch,update,delete deployments.apps",
		"get,list,patch,update,delete statefulsets.apps",
		"get,list,patch,update,delete daemonsets.apps",
		"get,list,patch,update,delete replicasets.apps",
		"get,list,patch,update,delete services",
		"get,list,patch,update,delete configmaps",
		"get,list,patch,update,delete serviceaccounts",
		"get,list,patch,update persistentvolumeclaims",
		"get,list,patch,update,delete jobs.batch",
		"get,list,patch,update,delete cronjobs.batch",
		"get,list,patch,update,delete ingresses.networking.k8s.io",
		"get,list,patch,update,delete roles.rbac.authorization.k8s.io",
		"get,list,patch,update,delete rolebindings.rbac.authorization.k8s.io",
		"get,list,patch,update,delete poddisruptionbudgets.policy",
		"get,list,patch,update,delete horizontalpodautoscalers.autoscaling",
	}
	// Never granted by default: deleting data, creating what a recovery
	// with strategy fail never creates, anything on pods but reading them
	// (hooks), or on nodes.
	chartRecoveryDenied = []chartAccess{
		"delete persistentvolumeclaims",
		"create deployments.apps",
		"create services",
		"delete namespaces",
		"delete customresourcedefinitions.apiextensions.k8s.io",
		"watch,delete pods",
		"escalate,bind roles.rbac.authorization.k8s.io",
	}
	chartClusterRights = []chartAccess{
		"get,list,watch namespaces",
		"create selfsubjectaccessreviews.authorization.k8s.io",
	}
	chartLeaderRights = []chartAccess{chartLeaseRights, "create events.events.k8s.io"}
)

func chartCat(parts ...[]chartAccess) []chartAccess {
	var out []chartAccess
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// chartArgs is the controller's command line for the given flags, with
// the defaults of values.yaml for those not given.
func chartArgs(over map[string]string, extra ...string) []string {
	order := []string{
		"namespaces", "helm-driver", "selector", "recover-legacy-after", "recover-strategy", "recover-delete-data",
		"lock-backend", "leader-elect", "leader-election-namespace", "leader-election-id", "metrics-bind-address", "health-probe-bind-address",
	}
	flags := map[string]string{
		"helm-driver": "secret", "recover-legacy-after": "1h", "recover-strategy": "fail", "recover-delete-data": "false",
		"lock-backend": "auto", "leader-elect": "true", "leader-election-namespace": chartNS,
		"leader-election-id": "helm-autorecover-controller", "metrics-bind-address": ":8080", "health-probe-bind-address": ":8081",
	}
	for k, v := range over {
		flags[k] = v
	}
	out := []string{"controller"}
	for _, k := range order {
		if v, ok := flags[k]; ok && v != "-" {
			out = append(out, "--"+k+"="+v)
		}
	}
	return append(out, extra...)
}

// TestChartTemplate renders the chart with stock helm v4 under several sets
// of values and checks the objects, the RBAC each Role and ClusterRole
// grants (and must not), the bindings, and the Deployment's arguments.
func TestChartTemplate(t *testing.T) {
	env := testenv.Get(t)
	cases := []struct {
		name string
		set  []string
		// args is the container's command line.
		args []string
		// roles are every Role and ClusterRole rendered, by chartKey.
		roles map[string]chartRoleWant
		// kinds counts the objects of each kind rendered.
		kinds map[string]int
		// check looks at anything else.
		check func(t *testing.T, objs map[string]*unstructured.Unstructured)
	}{
		{
			name: "defaults",
			args: chartArgs(nil),
			roles: map[string]chartRoleWant{
				chartKey("ClusterRole", "", chartRBAC): {
					allow: chartCat(chartRecordRights, []chartAccess{chartLeaseRights}, chartRecoveryRights, chartClusterRights),
					deny:  chartCat(chartRecoveryDenied, []chartAccess{"watch,create configmaps"}),
				},
				chartKey("Role", chartNS, chartFull+"-leader-election"): {allow: chartLeaderRights, deny: []chartAccess{"get secrets"}},
			},
			kinds: map[string]int{"Deployment": 1, "ServiceAccount": 1, "Service": 1, "ClusterRole": 1, "ClusterRoleBinding": 1, "Role": 1, "RoleBinding": 1},
			check: func(t *testing.T, objs map[string]*unstructured.Unstructured) {
				d := chartTyped[appsv1.Deployment](t, objs[chartKey("Deployment", chartNS, chartFull)])
				if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
					t.Errorf("replicas = %v; want 2", d.Spec.Replicas)
				}
				if got, want := d.Spec.Template.Spec.Containers[0].Image, "ghcr.io/helm-autorecover/helm-autorecover:"+version.Version; got != want {
					t.Errorf("image = %q; want %q (the appVersion)", got, want)
				}
			},
		},
		{
			name: "namespaces listed, ServiceMonitor",
			set: []string{
				"--set", "namespaces={team-a,team-b}", "--set", "serviceMonitor.enabled=true",
				"--set", "serviceMonitor.interval=15s", "--set", "serviceMonitor.labels.release=prom",
			},
			args: chartArgs(map[string]string{"namespaces": "team-a,team-b"}),
			roles: map[string]chartRoleWant{
				chartKey("Role", "team-a", chartRBAC): {
					allow: chartCat(chartRecordRights, []chartAccess{chartLeaseRights}, chartRecoveryRights),
					deny:  chartRecoveryDenied,
				},
				chartKey("Role", "team-b", chartRBAC): {
					allow: chartCat(chartRecordRights, []chartAccess{chartLeaseRights}, chartRecoveryRights),
					deny:  chartRecoveryDenied,
				},
				// Namespaces are cluster-scoped: only their reading is cluster-wide.
				chartKey("ClusterRole", "", chartRBAC+"-namespaces"): {
					allow: chartClusterRights,
					deny:  chartCat(chartRecordRights, []chartAccess{chartLeaseRights}, chartRecoveryRights[:1]),
				},
				chartKey("Role", chartNS, chartFull+"-leader-election"): {allow: chartLeaderRights, deny: []chartAccess{"get secrets"}},
			},
			kinds: map[string]int{"Deployment": 1, "ServiceAccount": 1, "Service": 1, "ServiceMonitor": 1, "ClusterRole": 1, "ClusterRoleBinding": 1, "Role": 3, "RoleBinding": 3},
			check: func(t *testing.T, objs map[string]*unstructured.Unstructured) {
				sm := objs[chartKey("ServiceMonitor", chartNS, chartFull)]
				svc := chartTyped[corev1.Service](t, objs[chartKey("Service", chartNS, chartFull+"-metrics")])
				if sm == nil {
					t.Fatal("no ServiceMonitor")
				}
				if sm.GetAPIVersion() != "monitoring.coreos.com/v1" || sm.GetLabels()["release"] != "prom" {
					t.Errorf("ServiceMonitor apiVersion %s labels %v; want monitoring.coreos.com/v1 and release=prom", sm.GetAPIVersion(), sm.GetLabels())
				}
				eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
				if len(eps) != 1 {
					t.Fatalf("ServiceMonitor endpoints = %v", eps)
				}
				ep := eps[0].(map[string]any)
				if ep["port"] != "metrics" || ep["path"] != "/metrics" || ep["interval"] != "15s" {
					t.Errorf("ServiceMonitor endpoint = %v; want port metrics, path /metrics, interval 15s", ep)
				}
				sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
				for k, v := range sel {
					if svc.Labels[k] != v {
						t.Errorf("ServiceMonitor selects %s=%s; the metrics Service has %v", k, v, svc.Labels)
					}
				}
				ns, _, _ := unstructured.NestedStringSlice(sm.Object, "spec", "namespaceSelector", "matchNames")
				if !reflect.DeepEqual(ns, []string{chartNS}) {
					t.Errorf("ServiceMonitor namespaceSelector = %v; want [%s]", ns, chartNS)
				}
			},
		},
		{
			name: "configmap driver, release backend, rollback, delete data",
			set: []string{
				"--set", "helmDriver=configmap", "--set", "lockBackend=release", "--set", "recoverStrategy=rollback",
				"--set", "recoverDeleteData=true", "--set", "recoverLegacyAfter=0", "--set-string", "selector=team in (a\\,b)",
			},
			args: chartArgs(map[string]string{
				"helm-driver": "configmap", "lock-backend": "release", "recover-strategy": "rollback",
				"recover-delete-data": "true", "recover-legacy-after": "0", "selector": "team in (a,b)",
			}),
			roles: map[string]chartRoleWant{
				chartKey("ClusterRole", "", chartRBAC): {
					allow: []chartAccess{
						"get,list,watch,create,update,delete configmaps", "create events.events.k8s.io",
						"get,list,watch namespaces",
						// rollback re-creates; delete data removes claims
						"create,patch,delete deployments.apps", "create services", "delete,create persistentvolumeclaims",
					},
					// No Lease, no access review with the release backend; no
					// watch on Secrets (the records are ConfigMaps).
					deny: []chartAccess{"get leases.coordination.k8s.io", "create selfsubjectaccessreviews.authorization.k8s.io", "watch secrets", "delete namespaces"},
				},
				chartKey("Role", chartNS, chartFull+"-leader-election"): {allow: chartLeaderRights},
			},
			kinds: map[string]int{"Deployment": 1, "ServiceAccount": 1, "Service": 1, "ClusterRole": 1, "ClusterRoleBinding": 1, "Role": 1, "RoleBinding": 1},
		},
		{
			name: "one replica without leader election, other ports, extra args",
			set: []string{
				"--set", "replicas=1", "--set", "leaderElection.enabled=false", "--set", "metrics.port=9090",
				"--set", "health.port=9091", "--set", "extraArgs={--debug}", "--set", "image.tag=v9.9.9",
			},
			args: chartArgs(map[string]string{
				"leader-elect": "false", "leader-election-namespace": "-", "leader-election-id": "-",
				"metrics-bind-address": ":9090", "health-probe-bind-address": ":9091",
			}, "--debug"),
			roles: map[string]chartRoleWant{
				chartKey("ClusterRole", "", chartRBAC): {allow: chartCat(chartRecordRights, []chartAccess{chartLeaseRights}, chartRecoveryRights, chartClusterRights)},
			},
			kinds: map[string]int{"Deployment": 1, "ServiceAccount": 1, "Service": 1, "ClusterRole": 1, "ClusterRoleBinding": 1},
			check: func(t *testing.T, objs map[string]*unstructured.Unstructured) {
				d := chartTyped[appsv1.Deployment](t, objs[chartKey("Deployment", chartNS, chartFull)])
				if got := d.Spec.Template.Spec.Containers[0].Image; !strings.HasSuffix(got, ":v9.9.9") {
					t.Errorf("image = %q; want tag v9.9.9", got)
				}
			},
		},
		{
			name: "leader election elsewhere, existing ServiceAccount",
			set: []string{
				"--set", "leaderElection.namespace=coord", "--set", "leaderElection.id=hac-leader",
				"--set", "serviceAccount.create=false", "--set", "serviceAccount.name=robot",
			},
			args: chartArgs(map[string]string{"leader-election-namespace": "coord", "leader-election-id": "hac-leader"}),
			roles: map[string]chartRoleWant{
				chartKey("ClusterRole", "", chartRBAC):                  {allow: chartCat(chartRecordRights, []chartAccess{chartLeaseRights}, chartRecoveryRights, chartClusterRights)},
				chartKey("Role", "coord", chartRBAC+"-leader-election"): {allow: chartLeaderRights},
			},
			kinds: map[string]int{"Deployment": 1, "Service": 1, "ClusterRole": 1, "ClusterRoleBinding": 1, "Role": 1, "RoleBinding": 1},
		},
		{
			name:  "no RBAC",
			set:   []string{"--set", "rbac.create=false"},
			args:  chartArgs(nil),
			roles: map[string]chartRoleWant{},
			kinds: map[string]int{"Deployment": 1, "ServiceAccount": 1, "Service": 1},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			list := chartRender(t, env, tc.set...)
			objs := chartObjects(list)
			kinds := map[string]int{}
			for _, o := range list {
				kinds[o.GetKind()]++
				if namespaced := o.GetKind() != "ClusterRole" && o.GetKind() != "ClusterRoleBinding"; namespaced != (o.GetNamespace() != "") {
					t.Errorf("%s %s: namespace %q", o.GetKind(), o.GetName(), o.GetNamespace())
				}
			}
			if !reflect.DeepEqual(kinds, tc.kinds) {
				t.Errorf("rendered kinds = %v; want %v", kinds, tc.kinds)
			}
			sa := chartFull
			if slices.Contains(tc.set, "serviceAccount.name=robot") {
				sa = "robot"
			}
			d := chartCheckDeployment(t, objs, sa, tc.args)
			chartCheckService(t, objs, d)
			chartCheckRBAC(t, objs, tc.roles, sa)
			if tc.check != nil {
				tc.check(t, objs)
			}
		})
	}

	// Values the schema or the templates refuse, each with a message that
	// names the value.
	for _, bad := range []struct{ set, says string }{
		{"helmDriver=sql", "helmDriver"},
		{"recoverStrategy=undo", "recoverStrategy"},
		{"lockBackend=etcd", "lockBackend"},
		{"recoverLegacyAfter=soon", "recoverLegacyAfter"},
		{"recoverLegacyAfter=15", "recoverLegacyAfter"},
		{"namespaces={Team_A}", "namespaces"},
		{"leaderElection.enabled=false", "leaderElection.enabled"},
		{"health.port=8080", "health.port"},
	} {
		res := env.Run(t, env.Helm4, "template", chartRel, chartDir(env.RepoRoot), "-n", chartNS, "--set", bad.set)
		if res.ExitCode == 0 || !strings.Contains(res.Stderr, bad.says) {
			t.Errorf("helm template --set %s: exit %d; want a refusal naming %s\n%s", bad.set, res.ExitCode, bad.says, res.Stderr)
		}
	}
}

// chartCheckDeployment checks the controller's Deployment: arguments, the
// downward-API POD_NAMESPACE, probes and ports, hardening, resources, and
// its ServiceAccount. It returns the Deployment.
func chartCheckDeployment(t *testing.T, objs map[string]*unstructured.Unstructured, sa string, args []string) *appsv1.Deployment {
	t.Helper()
	u := objs[chartKey("Deployment", chartNS, chartFull)]
	if u == nil {
		t.Fatalf("no Deployment %s/%s among %v", chartNS, chartFull, chartKeys(objs))
	}
	d := chartTyped[appsv1.Deployment](t, u)
	chartCheckPodSpec(t, d, sa, args)
	return d
}

// chartCheckPodSpec checks the pod template of the controller's Deployment,
// rendered or as stored by the API server.
func chartCheckPodSpec(t *testing.T, d *appsv1.Deployment, sa string, args []string) {
	t.Helper()
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers; want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	if !reflect.DeepEqual(c.Args, args) {
		t.Errorf("args =\n  %q\nwant\n  %q", c.Args, args)
	}
	if spec.ServiceAccountName != sa {
		t.Errorf("serviceAccountName = %q; want %q", spec.ServiceAccountName, sa)
	}
	var podNS *corev1.EnvVar
	driver := "<unset>"
	for i := range c.Env {
		switch c.Env[i].Name {
		case "POD_NAMESPACE":
			podNS = &c.Env[i]
		case "HELM_DRIVER":
			driver = c.Env[i].Value
		}
	}
	if podNS == nil || podNS.ValueFrom == nil || podNS.ValueFrom.FieldRef == nil || podNS.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("POD_NAMESPACE is not taken from metadata.namespace by the downward API: %+v", podNS)
	}
	if !slices.Contains(args, "--helm-driver="+driver) {
		t.Errorf("HELM_DRIVER=%s; want the driver of the args %q", driver, args)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	wantPort := func(flag string) int32 {
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--"+flag+"=:"); ok {
				n, _ := strconv.Atoi(v)
				return int32(n)
			}
		}
		return 0
	}
	if ports["metrics"] != wantPort("metrics-bind-address") || ports["health"] != wantPort("health-probe-bind-address") || ports["health"] == 0 {
		t.Errorf("container ports = %v; want metrics and health as in the args %q", ports, args)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "health" {
			t.Errorf("%s probe = %+v; want GET %s on the health port", p.name, p.probe, p.path)
		}
	}
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Error("no container securityContext")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem,
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation,
		sc.Capabilities == nil || !reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}):
		t.Errorf("container securityContext %+v; want a read-only root, no privilege escalation, every capability dropped", sc)
	}
	if psc := spec.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("pod securityContext %+v; want a non-root user", psc)
	}
	lim, req := c.Resources.Limits, c.Resources.Requests
	goal := resource.MustParse("100Mi")
	if lim.Memory().IsZero() || req.Memory().IsZero() || lim.Cpu().IsZero() || req.Cpu().IsZero() {
		t.Errorf("resources %+v; want requests and limits of cpu and memory", c.Resources)
	} else if lim.Memory().Cmp(goal) < 0 || req.Memory().Cmp(*lim.Memory()) > 0 || lim.Memory().Cmp(resource.MustParse("256Mi")) > 0 {
		t.Errorf("memory request %s limit %s; want request <= limit, limit between the 100Mi goal and 256Mi", req.Memory(), lim.Memory())
	}
}

// chartCheckService checks that the metrics Service selects the
// Deployment's pods on their metrics port.
func chartCheckService(t *testing.T, objs map[string]*unstructured.Unstructured, d *appsv1.Deployment) {
	t.Helper()
	u := objs[chartKey("Service", chartNS, chartFull+"-metrics")]
	if u == nil {
		t.Fatalf("no metrics Service among %v", chartKeys(objs))
	}
	svc := chartTyped[corev1.Service](t, u)
	if !reflect.DeepEqual(svc.Spec.Selector, d.Spec.Selector.MatchLabels) {
		t.Errorf("Service selector %v; the Deployment's pods are %v", svc.Spec.Selector, d.Spec.Selector.MatchLabels)
	}
	for k, v := range d.Spec.Selector.MatchLabels {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("pod template labels %v lack the selector's %s=%s", d.Spec.Template.Labels, k, v)
		}
	}
	var metrics int32
	for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
		if p.Name == "metrics" {
			metrics = p.ContainerPort
		}
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].Port != metrics || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("Service ports %+v; want one, metrics, port %d to the pods' metrics port", svc.Spec.Ports, metrics)
	}
}

// chartCheckRBAC checks that the rendered Roles and ClusterRoles are
// exactly those of want, grant what want allows and nothing it denies, and
// that each is bound, alone, to the controller's ServiceAccount.
func chartCheckRBAC(t *testing.T, objs map[string]*unstructured.Unstructured, want map[string]chartRoleWant, sa string) {
	t.Helper()
	var got []string
	bound := map[string]bool{}
	for key, u := range objs {
		switch u.GetKind() {
		case "Role", "ClusterRole":
			got = append(got, key)
		case "RoleBinding", "ClusterRoleBinding":
			b := chartTyped[rbacv1.RoleBinding](t, u) // same fields as a ClusterRoleBinding
			ns := u.GetNamespace()
			if b.RoleRef.Kind == "ClusterRole" {
				ns = ""
			}
			ref := chartKey(b.RoleRef.Kind, ns, b.RoleRef.Name)
			if objs[ref] == nil {
				t.Errorf("%s refers to %s, which is not rendered", key, ref)
			}
			if b.RoleRef.APIGroup != rbacv1.GroupName || b.Name != b.RoleRef.Name {
				t.Errorf("%s: roleRef %+v", key, b.RoleRef)
			}
			wantSubjects := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: chartNS}}
			if !reflect.DeepEqual(b.Subjects, wantSubjects) {
				t.Errorf("%s subjects = %+v; want %+v", key, b.Subjects, wantSubjects)
			}
			bound[ref] = true
		}
	}
	sort.Strings(got)
	if wantKeys := chartKeys(want); !slices.Equal(got, wantKeys) {
		t.Errorf("rendered roles = %q; want %q", got, wantKeys)
	}
	for key, w := range want {
		u := objs[key]
		if u == nil {
			continue
		}
		if !bound[key] {
			t.Errorf("%s is bound by no binding", key)
		}
		role := chartTyped[rbacv1.ClusterRole](t, u) // a Role has the same rules field
		for _, a := range w.allow {
			verbs, res, group := a.split()
			for _, v := range verbs {
				if !chartRulesAllow(role.Rules, v, res, group) {
					t.Errorf("%s does not grant %s on %s (group %q)", key, v, res, group)
				}
			}
		}
		for _, a := range w.deny {
			verbs, res, group := a.split()
			for _, v := range verbs {
				if chartRulesAllow(role.Rules, v, res, group) {
					t.Errorf("%s grants %s on %s (group %q); it must not", key, v, res, group)
				}
			}
		}
	}
}

func chartKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestChartInstall installs the chart with helm-autorecover itself on the
// local cluster (no --wait: the fake node runs no controller), cluster-wide
// and for listed namespaces, and checks the objects it created and, with
// SubjectAccessReviews, what the controller's ServiceAccount may and may not
// do. Uninstalling removes the cluster-scoped objects too.
func TestChartInstall(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	dir := chartDir(env.RepoRoot)

	t.Run("cluster-wide", func(t *testing.T) {
		ns := env.Namespace(t)
		other := env.Namespace(t)
		const rel = "ctl"
		full, rbacName := rel+"-helm-autorecover", rel+"-helm-autorecover-"+ns
		chartCleanupClusterRBAC(t, env, rbacName)
		mustRun(t, env, bin, "install", rel, dir, "-n", ns, "--timeout", "2m")
		if got := strings.Join(env.Summary(t, ns, rel), " "); got != "1:deployed" {
			t.Fatalf("history after install = %s; want 1:deployed", got)
		}
		chartCheckInstalled(t, env, ns, full, chartArgs(map[string]string{"leader-election-namespace": ns}))
		chartMustExist(t, env, "ClusterRole", "", rbacName)
		chartMustExist(t, env, "ClusterRoleBinding", "", rbacName)
		chartMustExist(t, env, "Role", ns, full+"-leader-election")
		chartMustExist(t, env, "RoleBinding", ns, full+"-leader-election")
		sa := "system:serviceaccount:" + ns + ":" + full
		for _, where := range []string{ns, other, "default"} {
			chartCheckAccess(t, env, sa, ns, where, chartCat(chartRecordRights, []chartAccess{chartLeaseRights}, chartRecoveryRights), chartRecoveryDenied)
		}
		chartCheckAccess(t, env, sa, ns, "", chartClusterRights, []chartAccess{"delete namespaces", "create clusterroles.rbac.authorization.k8s.io"})

		mustRun(t, env, bin, "uninstall", rel, "-n", ns, "--timeout", "2m")
		chartMustBeGone(t, env, "ClusterRole", "", rbacName)
		chartMustBeGone(t, env, "ClusterRoleBinding", "", rbacName)
	})

	t.Run("namespaces listed", func(t *testing.T) {
		ns := env.Namespace(t)
		teamA, teamB, other := env.Namespace(t), env.Namespace(t), env.Namespace(t)
		const rel = "ctl"
		full, rbacName := rel+"-helm-autorecover", rel+"-helm-autorecover-"+ns
		chartCleanupClusterRBAC(t, env, rbacName+"-namespaces")
		mustRun(t, env, bin, "install", rel, dir, "-n", ns, "--timeout", "2m",
			"--set", "namespaces={"+teamA+","+teamB+"}", "--set", "recoverStrategy=rollback")
		chartCheckInstalled(t, env, ns, full, chartArgs(map[string]string{
			"namespaces": teamA + "," + teamB, "leader-election-namespace": ns, "recover-strategy": "rollback",
		}))
		for _, w := range []string{teamA, teamB} {
			chartMustExist(t, env, "Role", w, rbacName)
			chartMustExist(t, env, "RoleBinding", w, rbacName)
		}
		chartMustExist(t, env, "ClusterRole", "", rbacName+"-namespaces")
		chartMustBeGone(t, env, "ClusterRole", "", rbacName)
		sa := "system:serviceaccount:" + ns + ":" + full
		watched := chartCat(chartRecordRights, []chartAccess{chartLeaseRights}, chartRecoveryRights, []chartAccess{"create deployments.apps"})
		for _, w := range []string{teamA, teamB} {
			chartCheckAccess(t, env, sa, ns, w, watched, []chartAccess{"delete persistentvolumeclaims"})
		}
		// Outside the listed namespaces: nothing on releases, only the
		// leader-election Lease in its own namespace.
		chartCheckAccess(t, env, sa, ns, other, nil, chartCat([]chartAccess{"get secrets", "get leases.coordination.k8s.io", "create events.events.k8s.io"}, chartRecoveryRights[:1]))
		chartCheckAccess(t, env, sa, ns, ns, chartLeaderRights, []chartAccess{"get secrets", "patch deployments.apps"})
		chartCheckAccess(t, env, sa, ns, "", chartClusterRights, []chartAccess{"delete namespaces"})

		mustRun(t, env, bin, "uninstall", rel, "-n", ns, "--timeout", "2m")
		chartMustBeGone(t, env, "ClusterRole", "", rbacName+"-namespaces")
		chartMustBeGone(t, env, "ClusterRoleBinding", "", rbacName+"-namespaces")
		chartMustBeGone(t, env, "Role", teamA, rbacName)
	})
}

// chartCleanupClusterRBAC deletes the ClusterRole and ClusterRoleBinding name at
// the end of the test if the test left them (namespaces go by themselves).
func chartCleanupClusterRBAC(t *testing.T, env *testenv.Env, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = env.Client.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = env.Client.RbacV1().ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
	})
}

// chartCheckInstalled checks the Deployment, ServiceAccount and metrics
// Service the install created in ns.
func chartCheckInstalled(t *testing.T, env *testenv.Env, ns, full string, args []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := env.Client.AppsV1().Deployments(ns).Get(ctx, full, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart's Deployment: %v", err)
	}
	chartCheckPodSpec(t, d, full, args)
	if d.Labels["app.kubernetes.io/managed-by"] != "Helm" || d.Annotations["meta.helm.sh/release-namespace"] != ns {
		t.Errorf("Deployment labels %v annotations %v; want it owned by the helm release", d.Labels, d.Annotations)
	}
	if _, err := env.Client.CoreV1().ServiceAccounts(ns).Get(ctx, full, metav1.GetOptions{}); err != nil {
		t.Errorf("the chart's ServiceAccount: %v", err)
	}
	svc, err := env.Client.CoreV1().Services(ns).Get(ctx, full+"-metrics", metav1.GetOptions{})
	if err != nil {
		t.Errorf("the chart's metrics Service: %v", err)
	} else if !reflect.DeepEqual(svc.Spec.Selector, d.Spec.Selector.MatchLabels) {
		t.Errorf("metrics Service selects %v; the Deployment's pods are %v", svc.Spec.Selector, d.Spec.Selector.MatchLabels)
	}
}

// chartGetRBAC reads one RBAC object; it returns the error of the Get.
func chartGetRBAC(env *testenv.Env, kind, ns, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	switch kind {
	case "ClusterRole":
		_, err = env.Client.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
	case "ClusterRoleBinding":
		_, err = env.Client.RbacV1().ClusterRoleBindings().Get(ctx, name, metav1.GetOptions{})
	case "Role":
		_, err = env.Client.RbacV1().Roles(ns).Get(ctx, name, metav1.GetOptions{})
	case "RoleBinding":
		_, err = env.Client.RbacV1().RoleBindings(ns).Get(ctx, name, metav1.GetOptions{})
	}
	return err
}

func chartMustExist(t *testing.T, env *testenv.Env, kind, ns, name string) {
	t.Helper()
	if err := chartGetRBAC(env, kind, ns, name); err != nil {
		t.Errorf("%s: %v", chartKey(kind, ns, name), err)
	}
}

// chartMustBeGone checks that the object does not exist; uninstall deletes
// synchronously, so no wait.
func chartMustBeGone(t *testing.T, env *testenv.Env, kind, ns, name string) {
	t.Helper()
	if err := chartGetRBAC(env, kind, ns, name); !apierrors.IsNotFound(err) {
		t.Errorf("%s: want it absent, got %v", chartKey(kind, ns, name), err)
	}
}

// chartCheckAccess asks the API server (SubjectAccessReview) whether the
// ServiceAccount user (of namespace saNS) may do each allowed access and
// none of the denied ones in namespace where ("" for cluster-scoped).
func chartCheckAccess(t *testing.T, env *testenv.Env, user, saNS, where string, allow, deny []chartAccess) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ask := func(verb, res, group string) bool {
		r, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               user,
				Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + saNS, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: where, Verb: verb, Group: group, Resource: res},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SubjectAccessReview %s %s.%s in %q: %v", verb, res, group, where, err)
		}
		return r.Status.Allowed
	}
	for _, a := range allow {
		verbs, res, group := a.split()
		for _, v := range verbs {
			if !ask(v, res, group) {
				t.Errorf("%s may not %s %s (group %q) in namespace %q", user, v, res, group, where)
			}
		}
	}
	for _, a := range deny {
		verbs, res, group := a.split()
		for _, v := range verbs {
			if ask(v, res, group) {
				t.Errorf("%s may %s %s (group %q) in namespace %q; it must not", user, v, res, group, where)
			}
		}
	}
}

// TestChartControllerRunsUnderItsRBAC runs the chart's Deployment for real,
// with the rights the chart grants and no others. The local fake node runs
// no containers, so the test runs our binary as a local process with the
// container's arguments as the cluster stores them (the bind addresses moved
// to free loopback ports), its HELM_DRIVER and POD_NAMESPACE, and a token of
// the chart's ServiceAccount. It must become ready, take the leader-election
// Lease, and recover a release whose upgrade was killed in the watched
// namespace, undoing what the abandoned revision applied (a Deployment it
// changed, a ConfigMap it created) with the rights of rbac.recoveryRules,
// and record an Event. With the secret driver and the default lock
// backend; with the configmap driver and the release backend (the chart
// then grants no Lease in the watched namespace); and with the rollback
// strategy (a new revision, written by helm's own rollback, which needs
// create: the chart adds it). The controller
// watches only its test's namespace: other tests' releases are not its.
func TestChartControllerRunsUnderItsRBAC(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	for _, tc := range []struct {
		name, driver string
		set          []string
		// want is the history once recovered.
		want string
	}{
		{"secret driver", "secret", nil, "1:deployed 2:failed"},
		{"configmap driver, release backend", "configmap", []string{"--set", "helmDriver=configmap", "--set", "lockBackend=release"}, "1:deployed 2:failed"},
		{"rollback", "secret", []string{"--set", "recoverStrategy=rollback"}, "1:superseded 2:failed 3:deployed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chartControllerScenario(t, env, bin, tc.driver, tc.set, tc.want)
		})
	}
}

func chartControllerScenario(t *testing.T, env *testenv.Env, bin, driver string, set []string, want string) {
	ns := env.Namespace(t)
	watched := env.Namespace(t)
	const rel = "ctl"
	full := rel + "-helm-autorecover"
	leaderID := "ctl-" + ns
	chartCleanupClusterRBAC(t, env, full+"-"+ns+"-namespaces")
	mustRun(t, env, bin, append([]string{
		"install", rel, chartDir(env.RepoRoot), "-n", ns, "--timeout", "2m",
		"--set", "namespaces={" + watched + "}", "--set", "leaderElection.id=" + leaderID,
	}, set...)...)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d, err := env.Client.AppsV1().Deployments(ns).Get(ctx, full, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart's Deployment: %v", err)
	}
	c := d.Spec.Template.Spec.Containers[0]
	health := "127.0.0.1:" + strconv.Itoa(freePort(t))
	var a []string
	for _, arg := range c.Args {
		switch {
		case strings.HasPrefix(arg, "--metrics-bind-address="):
			arg = "--metrics-bind-address=127.0.0.1:" + strconv.Itoa(freePort(t))
		case strings.HasPrefix(arg, "--health-probe-bind-address="):
			arg = "--health-probe-bind-address=" + health
		}
		a = append(a, arg)
	}
	extra := []string{"KUBECONFIG=" + chartTokenKubeconfig(ctx, t, env, ns, d.Spec.Template.Spec.ServiceAccountName), "POD_NAMESPACE=" + ns}
	for _, e := range c.Env {
		if e.Name == "HELM_DRIVER" || e.Name == "GOMEMLIMIT" {
			extra = append(extra, e.Name+"="+e.Value)
		}
	}
	p := env.StartEnv(t, extra, bin, a...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("controller stderr:\n%s", p.Stderr.String())
		}
	})
	chartPoll(t, p, 90*time.Second, "the controller's /readyz answering 200", func() bool {
		res, err := http.Get("http://" + health + "/readyz")
		if err != nil {
			return false
		}
		_ = res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	chartPoll(t, p, 90*time.Second, "the controller holding the leader-election Lease "+ns+"/"+leaderID, func() bool {
		l, err := env.Client.CoordinationV1().Leases(ns).Get(ctx, leaderID, metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != ""
	})

	// A release in the watched namespace, its upgrade killed after it
	// applied its changes: a nodeSelector on the Deployment, a new ConfigMap.
	records, err := helmx.NewRecords(env.Client, driver)
	if err != nil {
		t.Fatal(err)
	}
	cli := []string{"HELM_DRIVER=" + driver}
	chart := env.Chart("app")
	const app = "app"
	if res := env.RunEnv(t, cli, bin, "install", app, chart, "-n", watched); res.ExitCode != 0 {
		t.Fatalf("install %s: exit %d\n%s", app, res.ExitCode, res.Stderr)
	}
	up := env.StartEnv(t, cli, bin, args([]string{
		"upgrade", app, chart, "-n", watched, "--wait", "--timeout", "5m",
		"--lease-duration", "3s", "--set", "extraConfigMap=true",
	}, unschedulable)...)
	chartPoll(t, p, 60*time.Second, "revision 2 pending", func() bool { return cmHistory(t, records, watched, app) == "1:deployed 2:pending-upgrade" })
	waitForWriterIn(t, env, configMapLock(records), watched, app, 2, 10*time.Second)
	chartPoll(t, p, 60*time.Second, "the upgrade applying its changes", func() bool {
		_, errCM := env.Client.CoreV1().ConfigMaps(watched).Get(ctx, app+"-extra", metav1.GetOptions{})
		dep, errD := env.Client.AppsV1().Deployments(watched).Get(ctx, app, metav1.GetOptions{})
		return errCM == nil && errD == nil && len(dep.Spec.Template.Spec.NodeSelector) > 0
	})
	up.Kill(t)
	killed := time.Now()
	chartPoll(t, p, 2*time.Minute, "the controller recovering revision 2 of "+watched+"/"+app, func() bool {
		return cmHistory(t, records, watched, app) == want
	})
	figure(t, "chart: controller (%s driver) under the chart's RBAC recovered a killed upgrade %s after the kill", driver, secs(time.Since(killed)))
	// With no new revision known, the ConfigMap only the abandoned
	// revision created is left in place (recorded on it for the next
	// upgrade); helm's rollback, which recovery's rules let run, deletes it.
	_, err = env.Client.CoreV1().ConfigMaps(watched).Get(ctx, app+"-extra", metav1.GetOptions{})
	switch rolledBack := strings.HasSuffix(want, "3:deployed"); {
	case rolledBack && !apierrors.IsNotFound(err):
		t.Errorf("after helm's rollback, the ConfigMap only the abandoned revision created is still there (%v)", err)
	case !rolledBack && err != nil:
		t.Errorf("the ConfigMap only the abandoned revision created was deleted before a new revision was known (%v)", err)
	}
	if dep, err := env.Client.AppsV1().Deployments(watched).Get(ctx, app, metav1.GetOptions{}); err != nil {
		t.Errorf("the release's Deployment: %v", err)
	} else if len(dep.Spec.Template.Spec.NodeSelector) != 0 {
		t.Errorf("the Deployment keeps the abandoned revision's nodeSelector %v", dep.Spec.Template.Spec.NodeSelector)
	}
	chartPoll(t, p, 30*time.Second, "a Recovered Event in "+watched, func() bool {
		evs, err := env.Client.EventsV1().Events(watched).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Reason == "Recovered" {
				return true
			}
		}
		return false
	})
	if strings.Contains(strings.ToLower(p.Stderr.String()), "forbidden") {
		t.Errorf("the controller was refused something under the chart's RBAC:\n%s", p.Stderr.String())
	}
}

// chartPoll waits until done, at most limit; it fails the test at the
// limit, or as soon as the controller p has printed an error of its command
// line (it then exits).
func chartPoll(t *testing.T, p *testenv.Proc, limit time.Duration, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !done() {
		if strings.Contains(p.Stderr.String(), "Error: ") {
			t.Fatalf("waiting for %s: the controller failed:\n%s", what, p.Stderr.String())
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, limit)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// chartTokenKubeconfig writes a kubeconfig that authenticates as the
// ServiceAccount ns/sa with a fresh token, as a pod of it would.
func chartTokenKubeconfig(ctx context.Context, t *testing.T, env *testenv.Env, ns, sa string) string {
	t.Helper()
	tr, err := env.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", ns, sa, err)
	}
	admin, err := clientcmd.LoadFromFile(env.Kubeconfig)
	if err != nil {
		t.Fatalf("admin kubeconfig: %v", err)
	}
	cluster := admin.Clusters[admin.Contexts[admin.CurrentContext].Cluster]
	cfg := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: %s\n    certificate-authority: %s\nusers:\n- name: %s\n  user:\n    token: %s\ncontexts:\n- name: local\n  context: {cluster: local, user: %s, namespace: %s}\ncurrent-context: local\n",
		cluster.Server, cluster.CertificateAuthority, sa, tr.Status.Token, sa, ns)
	path := filepath.Join(t.TempDir(), sa+".kubeconfig")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
