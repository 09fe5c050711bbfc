package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// TestRecoverDryRunGolden prints the verdict for each kind of release,
// writes nothing, and exits as a real run would.
func TestRecoverDryRunGolden(t *testing.T) {
	var all bytes.Buffer
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"api"}, 0},
		{[]string{"web"}, exitcode.Locked},
		{[]string{"legacy"}, exitcode.Pending},
		{[]string{"legacy", "--recover-legacy-after", "1m"}, 0},
		{[]string{"legacy", "--recover-legacy-after", "0"}, exitcode.Pending},
		{[]string{"api", "--recover-strategy", "rollback"}, 0},
		{[]string{"db"}, 0},
	} {
		e := newFakeEnv(t, fixture(t)...)
		args := append([]string{"--dry-run"}, tc.args...)
		code, err := e.run(t, newRecoverCmd(e.c), args...)
		if code != tc.code {
			t.Errorf("recover %s: exit %d (%v); want %d", strings.Join(args, " "), code, err, tc.code)
		}
		if w := e.writes(); len(w) > 0 {
			t.Errorf("recover %s wrote %v", strings.Join(args, " "), w)
		}
		all.WriteString("$ recover " + strings.Join(args, " ") + "\n")
		all.Write(e.out.Bytes())
		if err != nil {
			all.WriteString("Error: " + err.Error() + "\n")
		}
	}
	golden(t, "recover-dry-run.txt", all.Bytes())
}

// TestRecoverExpired takes the lock (the release record's: its beat
// claimed, then its gate; then the Lease), marks the abandoned revision failed, records an Event and
// releases both locks, the Lease first.
func TestRecoverExpired(t *testing.T) {
	e := newFakeEnv(t, fixture(t)...)
	code, err := e.run(t, newRecoverCmd(e.c), "api")
	if code != 0 {
		t.Fatalf("exit %d: %v\nstderr: %s", code, err, e.errOut.String())
	}
	golden(t, "recover-expired.txt", e.out.Bytes())
	if got, want := strings.Join(e.writes(), ", "), "create secrets, update secrets, update leases, update secrets, create events, update leases, update secrets"; got != want {
		t.Errorf("writes: %s; want %s", got, want)
	}
	s, err := e.client.CoreV1().Secrets("prod").Get(t.Context(), helmx.ReleaseSecretName("api", 3), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sum, _ := helmx.Summarize(s); sum.Status != common.StatusFailed || !strings.Contains(sum.Description, "recovered by helm-autorecover session 9e8d0000-7777-4a5b-9c8d-000000000001") {
		t.Errorf("revision 3: %s, %q", sum.Status, sum.Description)
	}
	l, err := e.client.CoordinationV1().Leases("prod").Get(t.Context(), lock.LeaseName("api"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *l.Spec.HolderIdentity != "" {
		t.Errorf("lock still held by %q after recover", *l.Spec.HolderIdentity)
	}
}

// TestRecoverWritesNothingUnlessRecoverable: a live lock, a young legacy
// revision and a release with nothing pending are reported without any
// write, not even the Lease.
func TestRecoverWritesNothingUnlessRecoverable(t *testing.T) {
	for _, tc := range []struct {
		rel  string
		code int
	}{{"web", exitcode.Locked}, {"legacy", exitcode.Pending}, {"db", 0}} {
		e := newFakeEnv(t, fixture(t)...)
		code, err := e.run(t, newRecoverCmd(e.c), tc.rel)
		if code != tc.code {
			t.Errorf("recover %s: exit %d (%v); want %d", tc.rel, code, err, tc.code)
		}
		if w := e.writes(); len(w) > 0 {
			t.Errorf("recover %s wrote %v", tc.rel, w)
		}
	}
}

func TestRecoverRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		objs func(t *testing.T) []runtime.Object
		args []string
		code int
		want string
	}{
		{name: "unknown", args: []string{"nope"}, code: exitcode.NotFound, want: `release "nope" not found in namespace "prod"`},
		{
			name: "no history", args: []string{"ghost"}, code: exitcode.NotFound,
			objs: func(t *testing.T) []runtime.Object {
				return []runtime.Object{lease(t, record("ghost", "prod", "s-1", lock.OpInstall, 1, at(-time.Hour), at(-time.Hour)))}
			},
			want: `release "ghost" in namespace "prod" has no stored revision (its Lease helm-autorecover.v1.ghost exists, holder "s-1"): nothing to recover`,
		},
		{
			name: "corrupt record", args: []string{"api"}, code: exitcode.BadLock,
			objs: func(t *testing.T) []runtime.Object {
				return editLease(fixture(t), "api", func(l *coordinationv1.Lease) { l.Annotations[lock.AnnotationRecord] = "garbage" })
			},
			want: `release "api" in namespace "prod": Lease helm-autorecover.v1.api: its lock record (annotation helm-autorecover.io/lock) cannot be read`,
		},
		{
			name: "corrupt record, dry run", args: []string{"api", "--dry-run"}, code: exitcode.BadLock,
			objs: func(t *testing.T) []runtime.Object {
				return editLease(fixture(t), "api", func(l *coordinationv1.Lease) { l.Annotations[lock.AnnotationRecord] = "garbage" })
			},
			want: `release "api" in namespace "prod": Lease helm-autorecover.v1.api: its lock record (annotation helm-autorecover.io/lock) cannot be read`,
		},
		{name: "bad strategy", args: []string{"api", "--recover-strategy", "delete"}, code: exitcode.Usage, want: `--recover-strategy="delete": must be fail or rollback`},
		{name: "bad flag", args: []string{"api", "--nope"}, code: exitcode.Usage, want: `unknown flag: --nope`},
		{name: "no release", args: nil, code: exitcode.Usage, want: `recover: needs exactly one argument, the release name; got 0 (see recover --help)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := fixture(t)
			if tc.objs != nil {
				objs = tc.objs(t)
			}
			e := newFakeEnv(t, objs...)
			cmd := newRecoverCmd(e.c)
			usageErrors(cmd)
			code, err := e.run(t, cmd, tc.args...)
			if code != tc.code || err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("exit %d, error:\n  %v\nwant exit %d, error starting:\n  %s", code, err, tc.code, tc.want)
			}
			if w := e.writes(); len(w) > 0 {
				t.Errorf("a refused recover wrote %v", w)
			}
		})
	}
}

// TestIntegrationRecoverLegacy: a release stock helm left pending is not
// recovered while young (exit 5, nothing written, not even a Lease); with a
// lower --recover-legacy-after it is, and stock helm works again.
func TestIntegrationRecoverLegacy(t *testing.T) {
	t.Parallel()
	x := newIT(t)
	x.stuckStock("rel")
	before := x.versions("rel")
	res := x.run(5, "recover", "rel", "--dry-run")
	wantContains(t, "recover --dry-run", res.Stdout, "not recoverable now (recoverable in", "no lock record", "Dry run: nothing was written.")
	x.run(5, "recover", "rel")
	if after := x.versions("rel"); after != before {
		t.Fatalf("a blocked recover wrote: before %s, after %s", before, after)
	}
	// The revision is about a second old: recoverable with a 1 s
	// threshold once its age, counted in whole server seconds, passes 2 s.
	deadline := time.Now().Add(20 * time.Second)
	for {
		res = x.env.Run(t, x.ha, "recover", "rel", "--recover-legacy-after", "1s", "-n", x.ns)
		if res.ExitCode == 0 || time.Now().After(deadline) {
			break
		}
		if res.ExitCode != 5 || !strings.Contains(res.Stdout, "recoverable in") {
			t.Fatalf("recover --recover-legacy-after 1s: exit %d\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if res.ExitCode != 0 {
		t.Fatalf("recover --recover-legacy-after 1s: exit %d\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	wantContains(t, "recover", res.Stdout, "recovered.", "Wrote:", "revision 2 pending-upgrade -> failed", "Event Recovered")
	s := x.latest("rel")
	if s.Status != "failed" || !strings.Contains(s.Description, "Abandoned pending-upgrade with no lock record (stock helm)") {
		t.Errorf("revision 2: %s %q", s.Status, s.Description)
	}
	if l, _ := x.lease("rel"); l == nil || holderID(l) != "" {
		t.Errorf("lock after recover: %v; want a released Lease", l)
	}
	x.event("Recovered", helmx.ReleaseSecretName("rel", 2))
	x.helm4(0, "upgrade", "rel", x.env.Chart("app"), "--set", "message=v3")
	if got := strings.Join(x.env.Summary(t, x.ns, "rel"), " "); got != "1:superseded 2:failed 3:deployed" {
		t.Errorf("history: %s", got)
	}
	res = x.run(0, "recover", "rel")
	wantContains(t, "recover of a healthy release", res.Stdout, "nothing to recover")
}

// TestIntegrationRecoverHolders: a dead holder's revision is recoverable
// (the dry run writes nothing) and recovered; a live holder's is not.
func TestIntegrationRecoverHolders(t *testing.T) {
	t.Parallel()
	x := newIT(t)
	d := x.dead("gone")
	x.install(false, "held")
	h := x.hold("held", 2, liveLease)

	before := x.versions("gone")
	res := x.run(0, "recover", "gone", "--dry-run")
	wantContains(t, "recover gone --dry-run", res.Stdout, "recoverable.", "whose lock expired", d.session, "Would write (dry run: nothing was written)")
	if after := x.versions("gone"); after != before {
		t.Fatalf("recover --dry-run wrote: before %s, after %s", before, after)
	}
	res = x.run(0, "recover", "gone")
	wantContains(t, "recover gone", res.Stdout, "recovered.", d.session)
	if s := x.latest("gone"); s.Status != "failed" || !strings.Contains(s.Description, "Abandoned pending-upgrade by") || !strings.Contains(s.Description, d.session) {
		t.Errorf("gone revision 2: %s %q", s.Status, s.Description)
	}
	if l, _ := x.lease("gone"); holderID(l) != "" {
		t.Errorf("recover left the lock held by %q", holderID(l))
	}

	for _, a := range [][]string{{"recover", "held"}, {"recover", "held", "--dry-run"}} {
		res := x.run(3, a...)
		wantContains(t, strings.Join(a, " "), res.Stdout, "not recoverable now", "under a live lock", h.session)
	}
	if l, _ := x.lease("held"); holderID(l) != h.session {
		t.Errorf("recover changed the live holder to %q", holderID(l))
	}
	if s := x.latest("held"); s.Status != "pending-upgrade" {
		t.Errorf("recover touched the live holder's revision: %s", s.Status)
	}
}
