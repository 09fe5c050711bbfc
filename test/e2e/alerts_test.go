package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// The chart's alerts and dashboard (issue 33 item 2): the rules pass
// promtool's checks and its rule unit tests
// (testdata/alerts/alerts_test.yaml), and every metric their queries name
// is one the controller serves on a live /metrics.

// monitoringOn renders the alerts and the dashboard.
var monitoringOn = []string{"--set", "prometheusRule.enabled=true", "--set", "grafanaDashboard.enabled=true"}

// promtool returns the path of promtool, built from hack/promtool by
// hack/promtool.sh when missing or stale (a cold build takes minutes; warm,
// a second).
func promtool(t *testing.T, env *testenv.Env) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(env.RepoRoot, "hack", "promtool.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/promtool.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// runPromtool runs promtool in dir and fails the test when it fails.
func runPromtool(t *testing.T, bin, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// renderedRules returns the spec.groups of the chart's PrometheusRule.
func renderedRules(t *testing.T, objs map[string]*unstructured.Unstructured) []any {
	t.Helper()
	pr := objs[chartKey("PrometheusRule", chartNS, chartFull)]
	if pr == nil {
		t.Fatalf("no PrometheusRule %s/%s rendered; have %v", chartNS, chartFull, chartKeys(objs))
	}
	groups, ok, err := unstructured.NestedSlice(pr.Object, "spec", "groups")
	if !ok || err != nil {
		t.Fatalf("PrometheusRule spec.groups: %v", err)
	}
	return groups
}

// ruleExprs returns the expressions of the rules in groups, by alert name.
func ruleExprs(t *testing.T, groups []any) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			m := r.(map[string]any)
			name, _ := m["alert"].(string)
			expr, _ := m["expr"].(string)
			if name == "" || expr == "" {
				t.Fatalf("a rule with no alert name or expression: %v", m)
			}
			out[name] = expr
		}
	}
	return out
}

// renderedDashboard returns the dashboard JSON the chart's ConfigMap holds.
func renderedDashboard(t *testing.T, objs map[string]*unstructured.Unstructured) map[string]any {
	t.Helper()
	cm := objs[chartKey("ConfigMap", chartNS, chartFull+"-dashboard")]
	if cm == nil {
		t.Fatalf("no dashboard ConfigMap rendered; have %v", chartKeys(objs))
	}
	raw, _, _ := unstructured.NestedString(cm.Object, "data", "helm-autorecover.json")
	var d map[string]any
	if err := json.Unmarshal([]byte(raw), &d); err != nil {
		t.Fatalf("the dashboard ConfigMap holds no JSON: %v", err)
	}
	return d
}

// dashboardQueries returns every PromQL query of a dashboard: the panels'
// targets' expr, and the metric selector of each label_values() variable.
func dashboardQueries(d map[string]any) []string {
	var out []string
	labelValues := regexp.MustCompile(`^\s*label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$`)
	var walk func(v any, key string)
	walk = func(v any, key string) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				walk(c, k)
			}
		case []any:
			for _, c := range v {
				walk(c, key)
			}
		case string:
			switch key {
			case "expr":
				out = append(out, v)
			case "query", "definition":
				if m := labelValues.FindStringSubmatch(v); m != nil {
					out = append(out, m[1])
				}
			}
		}
	}
	walk(d, "")
	sort.Strings(out)
	return slices.Compact(out)
}

// grafanaVars replaces the dashboard's Grafana variables with values that
// make a plain PromQL expression.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__range", "1h", "$__interval", "1m", "$job", ".*", "$namespace", ".*")

// TestChartAlertRules: with prometheusRule.enabled the chart renders a
// PrometheusRule whose groups pass `promtool check rules` and promtool's
// unit tests of every alert (testdata/alerts/alerts_test.yaml: each fires
// when it should and stays quiet when it should not), with the default
// thresholds; the dashboard's queries are valid PromQL (checked by promtool
// as recording rules); both are off by default; the alert and dashboard
// values reach the objects.
func TestChartAlertRules(t *testing.T) {
	env := testenv.Get(t)
	bin := promtool(t, env)

	if objs := chartObjects(chartRender(t, env)); objs[chartKey("PrometheusRule", chartNS, chartFull)] != nil || objs[chartKey("ConfigMap", chartNS, chartFull+"-dashboard")] != nil {
		t.Errorf("the default values render the alerts or the dashboard; both must be off by default")
	}

	objs := chartObjects(chartRender(t, env, monitoringOn...))
	dir := t.TempDir()
	groups := renderedRules(t, objs)
	raw, err := yaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join(env.RepoRoot, "test", "e2e", "testdata", "alerts", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o600); err != nil {
		t.Fatal(err)
	}
	out := runPromtool(t, bin, dir, "check", "rules", "rules.yaml")
	alerts := ruleExprs(t, groups)
	want := []string{"HelmAutorecoverControllerDown", "HelmAutorecoverNoLeader", "HelmAutorecoverRecoveryDelayHigh", "HelmAutorecoverRecoveryFailing", "HelmAutorecoverReleasesPending", "HelmAutorecoverRollbackFailed"}
	if got := chartKeys(alerts); !slices.Equal(got, want) {
		t.Errorf("alerts %v; want %v", got, want)
	}
	t.Logf("promtool check rules:\n%s", out)
	// Every alert has unit tests where it fires and where it stays quiet.
	var suite struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(tests, &suite); err != nil {
		t.Fatalf("testdata/alerts/alerts_test.yaml: %v", err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range suite.Tests {
		for _, a := range tc.AlertRuleTest {
			fires[a.Alertname] = fires[a.Alertname] || len(a.ExpAlerts) > 0
			quiet[a.Alertname] = quiet[a.Alertname] || len(a.ExpAlerts) == 0
		}
	}
	for _, name := range want {
		if !fires[name] || !quiet[name] {
			t.Errorf("testdata/alerts/alerts_test.yaml: %s needs a case where it fires (has one: %t) and one where it stays quiet (%t)", name, fires[name], quiet[name])
		}
	}
	t.Logf("promtool test rules:\n%s", runPromtool(t, bin, dir, "test", "rules", "alerts_test.yaml"))

	// The dashboard's queries parse: promtool checks them as recording rules.
	queries := dashboardQueries(renderedDashboard(t, objs))
	if len(queries) < 15 {
		t.Fatalf("only %d queries found in the dashboard: %v", len(queries), queries)
	}
	var rules []map[string]string
	for i, q := range queries {
		rules = append(rules, map[string]string{"record": fmt.Sprintf("dashboard:query_%02d", i), "expr": grafanaVars.Replace(q)})
	}
	raw, err = yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "dashboard-queries.yaml"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, bin, dir, "check", "rules", "dashboard-queries.yaml")

	// Values reach the objects: labels of the rule object and of every
	// alert, severities, the selector, no leader alert without leader
	// election, the sidecar's label and folder.
	objs = chartObjects(chartRender(t, env, append(slices.Clone(monitoringOn),
		"--set", "prometheusRule.labels.release=kube-prometheus-stack",
		"--set", "prometheusRule.alertLabels.team=platform",
		"--set", "prometheusRule.alerts.controllerDown.severity=critical",
		"--set", `prometheusRule.selector=job="har"`,
		"--set", "prometheusRule.alerts.recoveryDelayHigh.enabled=false",
		"--set", "leaderElection.enabled=false", "--set", "replicas=1",
		"--set", "grafanaDashboard.label=dashboards", "--set", "grafanaDashboard.labelValue=yes",
		"--set", "grafanaDashboard.folder=Platform", "--set", "grafanaDashboard.namespace=grafana")...))
	pr := objs[chartKey("PrometheusRule", chartNS, chartFull)]
	if pr == nil || pr.GetLabels()["release"] != "kube-prometheus-stack" {
		t.Fatalf("PrometheusRule missing or without prometheusRule.labels")
	}
	groups = renderedRules(t, objs)
	alerts = ruleExprs(t, groups)
	if _, ok := alerts["HelmAutorecoverNoLeader"]; ok {
		t.Errorf("HelmAutorecoverNoLeader rendered with leaderElection.enabled=false (no replica serves leader_election_master_status)")
	}
	if _, ok := alerts["HelmAutorecoverRecoveryDelayHigh"]; ok {
		t.Errorf("HelmAutorecoverRecoveryDelayHigh rendered though disabled")
	}
	for name, expr := range alerts {
		if strings.Contains(expr, "hac-helm-autorecover-metrics") || !strings.Contains(expr, `job="har"`) {
			t.Errorf("%s does not use prometheusRule.selector: %s", name, expr)
		}
	}
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			m := r.(map[string]any)
			labels, _, _ := unstructured.NestedStringMap(m, "labels")
			sev := "warning"
			if m["alert"] == "HelmAutorecoverControllerDown" {
				sev = "critical"
			}
			if labels["team"] != "platform" || labels["severity"] != sev {
				t.Errorf("%s labels %v; want team=platform, severity=%s", m["alert"], labels, sev)
			}
		}
	}
	// The schema refuses misspelt and malformed alert and dashboard values.
	for _, bad := range []struct{ set, says string }{
		{"prometheusRule.alerts.releasePending.for=1h", "releasePending"},
		{"prometheusRule.alerts.controllerDown.for=5 minutes", "/prometheusRule/alerts/controllerDown/for"},
		{"prometheusRule.alerts.recoveryDelayHigh.quantile=2", "/prometheusRule/alerts/recoveryDelayHigh/quantile"},
		{"prometheusRule.alerts.noLeader.severity=", "/prometheusRule/alerts/noLeader/severity"},
		{"grafanaDashboard.lable=x", "lable"},
	} {
		res := env.Run(t, env.Helm4, "template", chartRel, chartDir(env.RepoRoot), "-n", chartNS, "--set", bad.set)
		if res.ExitCode == 0 || !strings.Contains(res.Stderr, bad.says) {
			t.Errorf("helm template --set %s: exit %d; want a refusal naming %s\n%s", bad.set, res.ExitCode, bad.says, res.Stderr)
		}
	}

	cm := objs[chartKey("ConfigMap", "grafana", chartFull+"-dashboard")]
	if cm == nil {
		t.Fatalf("no dashboard ConfigMap in grafanaDashboard.namespace; have %v", chartKeys(objs))
	}
	if cm.GetLabels()["dashboards"] != "yes" || cm.GetAnnotations()["grafana_folder"] != "Platform" {
		t.Errorf("dashboard ConfigMap labels %v annotations %v; want dashboards=yes, grafana_folder=Platform", cm.GetLabels(), cm.GetAnnotations())
	}
}

// TestChartMonitoringMetricsServed: every metric the chart's alerts and
// dashboard name is served on the /metrics of the real controller (or is
// Prometheus' own `up`), and every label their selectors match on is one
// that metric carries. The controller serves a labelled series only once
// it has something to count, so the test makes it count: a controller
// without the right to write recovers nothing and counts its errors; then
// a leader-elected one recovers the release.
func TestChartMonitoringMetricsServed(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)

	objs := chartObjects(chartRender(t, env, monitoringOn...))
	var queries []string
	for _, e := range ruleExprs(t, renderedRules(t, objs)) {
		queries = append(queries, e)
	}
	for _, q := range dashboardQueries(renderedDashboard(t, objs)) {
		queries = append(queries, grafanaVars.Replace(q))
	}

	kc := stuckForReadOnly(t, env, ns)

	served := map[string]map[string]bool{} // metric name -> its label names
	readonly := startController(t, env, kc, "--namespaces", ns, "--leader-elect=false")
	waitMetric(t, readonly, "helm_autorecover_errors_total", `kind="forbidden"`)
	scrapeInto(t, readonly.metrics, served)
	readonly.Kill(t)

	leader := startController(t, env, "", "--namespaces", ns, "--leader-elect", "--leader-election-namespace", ns, "--leader-election-id", "har-"+ns)
	waitRecovered(t, env, ns, "stuck", 2, 90*time.Second)
	waitMetric(t, leader, "helm_autorecover_recoveries_total", `reason="expired-lock"`)
	scrapeInto(t, leader.metrics, served)

	// Labels Prometheus gives every series of a target (a ServiceMonitor's
	// job, namespace, pod, ...), not the controller.
	target := map[string]bool{"job": true, "namespace": true, "instance": true, "pod": true, "service": true, "endpoint": true, "container": true}
	checked := map[string]bool{}
	for _, q := range queries {
		for _, sel := range promqlSelectors(q) {
			if sel.metric == "up" {
				continue // Prometheus' own series of each target
			}
			labels, ok := served[sel.metric]
			if !ok {
				t.Errorf("%s is not served by the controller's /metrics (in %q)", sel.metric, q)
				continue
			}
			checked[sel.metric] = true
			for _, l := range sel.labels {
				if !target[l] && !labels[l] {
					t.Errorf("%s has no label %q on the controller's /metrics (in %q)", sel.metric, l, q)
				}
			}
		}
	}
	if len(checked) < 12 {
		t.Errorf("only %d metric names checked (%v): the query parser is broken", len(checked), chartKeys(checked))
	}
	t.Logf("%d metric names of the alerts and the dashboard served: %v", len(checked), chartKeys(checked))
}

// waitMetric waits until the controller serves a series of name whose
// labels contain match with a value of at least 1.
func waitMetric(t *testing.T, c *controllerProc, name, match string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for c.metric(t, name, match) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the controller served no %s{%s} within 90s; stderr:\n%s", name, match, c.Stderr.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// scrapeInto adds the sample names of a /metrics page, with their label
// names, to served.
func scrapeInto(t *testing.T, url string, served map[string]map[string]bool) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatalf("scraping %s: %v", url, err)
	}
	defer func() { _ = res.Body.Close() }()
	sample := regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s`)
	label := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := sample.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		if served[m[1]] == nil {
			served[m[1]] = map[string]bool{}
		}
		for _, l := range label.FindAllStringSubmatch(m[2], -1) {
			served[m[1]][l[1]] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading %s: %v", url, err)
	}
}

// selector is a metric named in a PromQL expression and the label names
// its matchers test.
type selector struct {
	metric string
	labels []string
}

// promqlKeywords are PromQL's words that are not metric names where an
// identifier not followed by "(" may stand: aggregation operators (before
// "by"/"without"), modifiers and set operators.
var promqlKeywords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"offset": true, "bool": true, "and": true, "or": true, "unless": true, "atan2": true, "inf": true, "nan": true,
}

// listKeywords are followed by a parenthesised list of label names.
var listKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// promqlSelectors returns the metric selectors of a PromQL expression
// (Grafana's variables already replaced): each metric name, and the label
// names of its matchers. A name followed by "(" is a function; label lists
// after by, without, on, ignoring, group_left and group_right, strings,
// ranges and numbers are skipped. promtool checks the same expressions
// parse (TestChartAlertRules), so this reads valid PromQL only.
func promqlSelectors(expr string) []selector {
	var out []selector
	isStart := func(c byte) bool { return c == '_' || c == ':' || (c|0x20 >= 'a' && c|0x20 <= 'z') }
	isPart := func(c byte) bool { return isStart(c) || (c >= '0' && c <= '9') }
	skipSpace := func(i int) int {
		for i < len(expr) && (expr[i] == ' ' || expr[i] == '\t' || expr[i] == '\n') {
			i++
		}
		return i
	}
	skipString := func(i int) int { // expr[i] is a quote
		q := expr[i]
		for i++; i < len(expr) && expr[i] != q; i++ {
			if expr[i] == '\\' && q != '`' {
				i++
			}
		}
		return i + 1
	}
	// matchers reads {a="x", b=~"y"} at i, returning the label names and
	// the index after "}".
	matchers := func(i int) ([]string, int) {
		var names []string
		for i++; i < len(expr) && expr[i] != '}'; {
			switch c := expr[i]; {
			case c == '"' || c == '\'' || c == '`':
				i = skipString(i)
			case isStart(c):
				j := i
				for j < len(expr) && isPart(expr[j]) {
					j++
				}
				names = append(names, expr[i:j])
				i = j
			default:
				i++
			}
		}
		return names, i + 1
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i = skipString(i)
		case c == '[':
			if end := strings.IndexByte(expr[i:], ']'); end > 0 {
				i += end
			}
			i++
		case c == '{': // a selector with no name: {__name__="..."} is not used here
			_, i = matchers(i)
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isPart(expr[i]) || expr[i] == '.') {
				i++
			}
		case isStart(c):
			j := i
			for j < len(expr) && isPart(expr[j]) {
				j++
			}
			word := expr[i:j]
			next := skipSpace(j)
			switch {
			case listKeywords[word]:
				if next < len(expr) && expr[next] == '(' {
					if end := strings.IndexByte(expr[next:], ')'); end > 0 {
						next += end
					}
					next++
				}
				i = next
			case next < len(expr) && expr[next] == '(' || promqlKeywords[word]:
				i = j // a function or an operator
			default:
				sel := selector{metric: word}
				i = j
				if next < len(expr) && expr[next] == '{' {
					sel.labels, i = matchers(next)
				}
				out = append(out, sel)
			}
		default:
			i++
		}
	}
	return out
}

// TestPromQLSelectors: the reader of the alerts' and dashboard's queries
// finds every metric and the labels it is matched on, and nothing else.
func TestPromQLSelectors(t *testing.T) {
	cases := []struct{ expr, want string }{
		{`up`, `up`},
		{`absent(up{job="a", namespace="b"} == 1)`, `up{job,namespace}`},
		{`sum by (namespace, job, lock_state) (helm_autorecover_pending_releases{job="x", lock_state=~"expired|none"}) > 0`, `helm_autorecover_pending_releases{job,lock_state}`},
		{`histogram_quantile(0.9, sum by (le) (rate(m_bucket{a="}"}[5m]))) > 60`, `m_bucket{a}`},
		{`sum(increase(a_total[1h])) > 0 or sum(b unless c offset 1h) > 0`, `a_total b c`},
		{`max without (pod) (x) * on (instance) group_left (node) y`, `x y`},
		{"topk(3, sum by (code) (rate(z{m=`q`}[$__x])))", `z{m}`},
		{`count(foo) and bool 1e3 > bar{l!="v"}`, `foo bar{l}`},
		{`label_replace(w, "dst", "$1", "src", "(.*)")`, `w`},
	}
	for _, c := range cases {
		var got []string
		for _, s := range promqlSelectors(c.expr) {
			if len(s.labels) > 0 {
				got = append(got, s.metric+"{"+strings.Join(s.labels, ",")+"}")
			} else {
				got = append(got, s.metric)
			}
		}
		if g := strings.Join(got, " "); g != c.want {
			t.Errorf("promqlSelectors(%q) = %q; want %q", c.expr, g, c.want)
		}
	}
}
