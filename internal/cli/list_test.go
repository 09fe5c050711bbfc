package cli

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"

	"k8s.io/apimachinery/pkg/util/rand"
)

// TestIntegrationListIsStockHelm: without --locks, our list prints exactly
// what the upstream helm v4 binary prints on the same cluster, byte for
// byte, in every format and with every flag tried; nothing is normalised.
func TestIntegrationListIsStockHelm(t *testing.T) {
	t.Parallel()
	x := newIT(t)
	id := rand.String(5)
	alpha, beta, gamma := "alpha-"+id, "beta-"+id, "gamma-"+id
	x.install(true, alpha)
	x.install(false, beta)
	x.stuckStock(gamma)

	for _, a := range [][]string{
		{"list"},
		{"ls"},
		{"list", "-o", "json"},
		{"list", "-o", "yaml"},
		{"list", "--no-headers"},
		{"list", "-q"},
		{"list", "-q", "-o", "json"},
		{"list", "--pending"},
		{"list", "--deployed", "--failed"},
		{"list", "-d", "-r", "--time-format", "2006-01-02T15:04:05Z07:00"},
		{"list", "--max", "1", "--offset", "1"},
		{"list", "--color", "always"},
		{"list", "-A", "--filter", "^(alpha|beta|gamma)-" + id + "$"},
		{"list", "--filter", "["},
		{"list", "extra-arg"},
	} {
		helm := x.env.Run(t, x.env.Helm4, append(a, "-n", x.ns)...)
		ours := x.env.Run(t, x.ha, append(a, "-n", x.ns)...)
		wantCode, wantErr := helm.ExitCode, helm.Stderr
		if a[len(a)-1] == "extra-arg" {
			// A command line that cannot be used exits 2 on every
			// command (docs/exit-codes.md); stock helm exits 1. The
			// output is helm's, byte for byte, but for the program's
			// name in it: usage lines name the program as invoked.
			wantCode = exitcode.Usage
			wantErr = strings.ReplaceAll(wantErr, "helm list", "helm-autorecover list")
		}
		if ours.ExitCode != wantCode || ours.Stdout != helm.Stdout || ours.Stderr != wantErr {
			t.Errorf("%s: differs from helm v4\nhelm (exit %d):\n%s%s\nours (exit %d):\n%s%s", strings.Join(a, " "),
				helm.ExitCode, helm.Stdout, helm.Stderr, ours.ExitCode, ours.Stdout, ours.Stderr)
		}
	}

	// --locks keeps helm's columns byte for byte and appends the lock's.
	helm := x.helm4(0, "list")
	ours := x.run(0, "list", "--locks")
	hl, ol := strings.Split(strings.TrimSuffix(helm.Stdout, "\n"), "\n"), strings.Split(strings.TrimSuffix(ours.Stdout, "\n"), "\n")
	if len(hl) != len(ol) || len(hl) != 4 {
		t.Fatalf("list has %d lines, list --locks %d; want 4\nhelm:\n%s\nours:\n%s", len(hl), len(ol), helm.Stdout, ours.Stdout)
	}
	for i := range hl {
		if !strings.HasPrefix(ol[i], hl[i]+"\t") {
			t.Errorf("line %d of list --locks does not extend helm's:\nhelm: %q\nours: %q", i, hl[i], ol[i])
		}
	}
	wantContains(t, "list --locks header", ol[0], "LOCKED TILL", "SESSION ID", "HOLDER")

	var helmJSON, ourJSON []map[string]any
	if err := json.Unmarshal([]byte(x.helm4(0, "list", "-o", "json").Stdout), &helmJSON); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(x.run(0, "list", "--locks", "-o", "json").Stdout), &ourJSON); err != nil {
		t.Fatal(err)
	}
	states := map[string]any{}
	for _, e := range ourJSON {
		states[e["name"].(string)] = e["lock_state"]
		for _, k := range []string{"lock_state", "locked_till", "session_id", "holder"} {
			if _, ok := e[k]; !ok {
				t.Errorf("list --locks -o json: %s has no %s", e["name"], k)
			}
			delete(e, k)
		}
	}
	if !reflect.DeepEqual(helmJSON, ourJSON) {
		t.Errorf("list --locks -o json without the lock fields differs from helm's list -o json\nhelm: %v\nours: %v", helmJSON, ourJSON)
	}
	if want := map[string]any{alpha: "none", beta: "none", gamma: "legacy-pending"}; !reflect.DeepEqual(states, want) {
		t.Errorf("lock_state = %v; want %v", states, want)
	}
}

// TestIntegrationListLocksHolders shows a live and an expired holder in
// list --locks.
func TestIntegrationListLocksHolders(t *testing.T) {
	t.Parallel()
	x := newIT(t)
	x.install(false, "held")
	h := x.hold("held", 2, liveLease)
	d := x.dead("gone")

	out := x.run(0, "list", "--locks").Stdout
	lines := strings.Split(out, "\n")
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "held "):
			wantContains(t, "the live holder's line", l, h.session, "(pid "+strconv.Itoa(h.proc.Cmd.Process.Pid)+")")
			if strings.Contains(l, "(expired)") {
				t.Errorf("live holder shown expired: %q", l)
			}
		case strings.HasPrefix(l, "gone "):
			wantContains(t, "the dead holder's line", l, d.session, "(expired)")
		}
	}
	var elems []map[string]string
	if err := json.Unmarshal([]byte(x.run(0, "list", "--locks", "-o", "json").Stdout), &elems); err != nil {
		t.Fatal(err)
	}
	for _, e := range elems {
		if e["name"] == "held" {
			till, err := time.Parse(time.RFC3339Nano, e["locked_till"])
			if err != nil || e["session_id"] != h.session || e["lock_state"] != "live" || !strings.Contains(e["holder"], "(pid ") {
				t.Errorf("held: %v (locked_till %v)", e, err)
			}
			if d := time.Until(till); d < -time.Minute || d > time.Minute {
				t.Errorf("held: locked_till %s is not within a minute of now", till)
			}
		}
	}
}
