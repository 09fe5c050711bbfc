package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"helm.sh/helm/v4/pkg/release/common"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/inspect"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

func TestLocksGolden(t *testing.T) {
	for _, tc := range []struct {
		golden string
		args   []string
	}{
		{"locks.table", nil},
		{"locks-all.table", []string{"--all"}},
		{"locks.json", []string{"-o", "json"}},
		{"locks.yaml", []string{"-o", "yaml"}},
		{"locks-web.table", []string{"web"}},
		{"locks-db.json", []string{"db", "-o", "json"}},
		{"locks-legacy-after.table", []string{"--recover-legacy-after", "2m"}},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			e := newFakeEnv(t, fixture(t)...)
			code, err := e.run(t, newLocksCmd(e.c), tc.args...)
			if code != 0 {
				t.Fatalf("exit %d: %v", code, err)
			}
			golden(t, tc.golden, e.out.Bytes())
			if w := e.writes(); len(w) > 0 {
				t.Errorf("locks wrote %v; it must only read", w)
			}
		})
	}
}

func TestLocksErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown release", []string{"nope"}, exitcode.NotFound, `release "nope" not found in namespace "prod": it has no stored revision and no lock. Check the name and the namespace (-n), or list releases with: helm-autorecover list -A`},
		{"bad name", []string{"Bad_Name"}, exitcode.Usage, `release "Bad_Name" in namespace "prod": release name "Bad_Name" is not a DNS-1123 subdomain`},
		{"bad output", []string{"-o", "xml"}, exitcode.Usage, `--output="xml": must be table, json or yaml`},
		{"two releases", []string{"a", "b"}, exitcode.Usage, "locks: takes at most one argument, a release name; got 2 (see locks --help)"},
		{"name with -A", []string{"web", "-A"}, exitcode.Usage, "--all-namespaces: cannot be used with a release name; use -n to name its namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEnv(t, fixture(t)...)
			code, err := e.run(t, newLocksCmd(e.c), tc.args...)
			if code != tc.code || err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("exit %d, error %v\nwant exit %d, error starting %q", code, err, tc.code, tc.want)
			}
		})
	}
}

// TestLocksBadLease shows a Lease whose record cannot be read, or whose
// holder was edited by hand, with a warning, and exits 0: a listing must
// not fail because of one bad object.
func TestLocksBadLease(t *testing.T) {
	objs := editLease(fixture(t), "web", func(l *coordinationv1.Lease) { l.Annotations[lock.AnnotationRecord] = `{"schema":1,"session":` })
	objs = editLease(objs, "api", func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptrTo("me") })
	e := newFakeEnv(t, objs...)
	if code, err := e.run(t, newLocksCmd(e.c)); code != 0 {
		t.Fatalf("exit %d: %v", code, err)
	}
	golden(t, "locks-bad.table", e.out.Bytes())
	golden(t, "locks-bad.stderr", e.errOut.Bytes())
}

// TestLocksUnlabelledLease finds the Lease of a pending release even when
// its labels were removed by hand, instead of calling the release legacy.
func TestLocksUnlabelledLease(t *testing.T) {
	objs := fixture(t)
	for _, o := range objs {
		if l, ok := o.(*coordinationv1.Lease); ok && l.Name == lock.LeaseName("api") {
			l.Labels = nil
		}
	}
	e := newFakeEnv(t, objs...)
	if code, err := e.run(t, newLocksCmd(e.c), "-o", "json"); code != 0 {
		t.Fatalf("exit %d: %v", code, err)
	}
	if !strings.Contains(e.out.String(), `"release":"api","lock_state":"expired"`) {
		t.Errorf("api not shown expired:\n%s", e.out.String())
	}
}

func TestLocksAllNamespaces(t *testing.T) {
	objs := append(fixture(t), []runtime.Object{
		revision(t, "other", "staging", 1, common.StatusPendingInstall, at(-2*time.Hour)),
	}...)
	e := newFakeEnv(t, objs...)
	if code, err := e.run(t, newLocksCmd(e.c), "-A"); code != 0 {
		t.Fatalf("exit %d: %v", code, err)
	}
	golden(t, "locks-A.table", e.out.Bytes())
}

func ptrTo[T any](v T) *T { return &v }

// TestIntegrationLocks shows each state on the real cluster: a live
// holder, a dead one, a release stock helm left pending and an idle one.
func TestIntegrationLocks(t *testing.T) {
	t.Parallel()
	x := newIT(t)
	x.install(false, "idle")
	x.stuckStock("legacy")
	d := x.dead("gone")
	x.install(false, "held")
	h := x.hold("held", 2, liveLease)

	rows := x.lockRows()
	byName := map[string]inspect.Row{}
	for _, r := range rows {
		byName[r.Release] = r
	}
	if len(rows) != 3 {
		t.Errorf("locks shows %d releases; want held, gone and legacy (not idle): %+v", len(rows), rows)
	}
	live := byName["held"]
	if live.State != inspect.StateLive || live.Session != h.session || live.PID != h.proc.Cmd.Process.Pid || live.Operation != "upgrade" ||
		live.LockRevision != 2 || live.Who == "" || live.TimeLeftSeconds == nil || !live.LockedTill.After(live.RenewedAt) || live.AcquiredAt.IsZero() {
		t.Errorf("held: %+v", live)
	}
	if r := byName["gone"]; r.State != inspect.StateExpired || r.Session != d.session || r.ExpiredForSeconds == nil || r.PendingForSeconds == nil {
		t.Errorf("gone: %+v", r)
	}
	if r := byName["legacy"]; r.State != inspect.StateLegacyPending || r.Session != "" || r.PendingForSeconds == nil || r.RecoverableInSeconds == nil || r.Revision != 2 {
		t.Errorf("legacy: %+v", r)
	}
	// Server time: the lock was renewed within the last lease.
	if age := time.Since(live.RenewedAt); age > time.Minute || age < -time.Minute {
		t.Errorf("held: renewed %s ago by this machine's clock; the clocks are the same here", age)
	}

	if all := x.lockRows("--all"); len(all) != 4 {
		t.Errorf("locks --all shows %d releases; want 4", len(all))
	}
	table := x.run(0, "locks").Stdout
	wantContains(t, "locks table", table, "LOCKED TILL", "SESSION ID", h.session, d.session, "legacy-pending", "expired ")
	yaml := x.run(0, "locks", "held", "-o", "yaml").Stdout
	wantContains(t, "locks held -o yaml", yaml, "lock_state: live", "session_id: "+h.session)
	var everywhere []inspect.Row
	if err := json.Unmarshal([]byte(x.run(0, "locks", "-A", "-o", "json").Stdout), &everywhere); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range everywhere {
		if r.Namespace == x.ns {
			n++
		}
	}
	if n != 3 {
		t.Errorf("locks -A shows %d releases of %s; want 3", n, x.ns)
	}
	res := x.run(exitcode.NotFound, "locks", "nope")
	wantContains(t, "locks nope", res.Stderr, `release "nope" not found in namespace "`+x.ns+`"`)

	// Shell completion of release names and of the holder's session. The
	// word being completed comes last.
	complete := func(a ...string) string {
		t.Helper()
		res := x.env.Run(t, x.ha, append([]string{"__complete", "-n", x.ns}, a...)...)
		if res.ExitCode != 0 {
			t.Fatalf("__complete %v: exit %d\n%s", a, res.ExitCode, res.Stderr)
		}
		return res.Stdout
	}
	comp := complete("unlock", "")
	wantContains(t, "completion of unlock", comp, "held\t", "gone\t")
	if strings.Contains(comp, "idle") || strings.Contains(comp, "legacy") {
		t.Errorf("unlock completes releases nobody holds:\n%s", comp)
	}
	wantContains(t, "completion of --session", complete("unlock", "held", "--session", ""), h.session+"\tlive lock")
	wantContains(t, "completion of recover", complete("recover", ""), "idle\t", "legacy\t", "held\t", "gone\t")
	wantContains(t, "completion of locks -o", complete("locks", "-o", ""), "json\t", "yaml\t", "table\t")
}

// TestIntegrationBadInput: unknown releases, a release without history, a
// corrupt lock record and a Lease edited by hand are refused with the
// documented exit code, a message naming release and namespace, and
// nothing written.
func TestIntegrationBadInput(t *testing.T) {
	t.Parallel()
	x := newIT(t)
	x.install(false, "rel")
	ctx := t.Context()
	leases := x.env.Client.CoordinationV1().Leases(x.ns)

	for _, a := range [][]string{{"locks", "nope"}, {"unlock", "nope", "--session", "s"}, {"recover", "nope"}, {"recover", "nope", "--dry-run"}} {
		res := x.run(exitcode.NotFound, a...)
		wantContains(t, strings.Join(a, " "), res.Stderr, `release "nope" not found in namespace "`+x.ns+`"`, "helm-autorecover list -A")
		if l, _ := x.lease("nope"); l != nil {
			t.Errorf("%s created a Lease", strings.Join(a, " "))
		}
	}
	x.run(2, "locks", "Bad_Name")
	x.run(2, "unlock", "rel")
	x.run(2, "locks", "-o", "xml")

	// A lock whose release has no history.
	ghost := record("ghost", x.ns, "s-ghost", lock.OpInstall, 1, time.Now().Add(-time.Hour), time.Now().Add(-time.Hour))
	gl := lease(t, ghost)
	gl.ResourceVersion = ""
	if _, err := leases.Create(ctx, gl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := x.versions("ghost")
	for _, a := range [][]string{{"unlock", "ghost", "--session", "s-ghost"}, {"recover", "ghost"}} {
		res := x.run(exitcode.NotFound, a...)
		wantContains(t, strings.Join(a, " "), res.Stderr, `release "ghost" in namespace "`+x.ns+`" has no stored revision`)
	}
	if r := x.lockRows("ghost"); len(r) != 1 || r[0].State != inspect.StateExpired || r[0].Revision != 0 {
		t.Errorf("locks ghost: %+v; want one expired lock without revision", r)
	}

	// A corrupt record on a held lock, then a holder edited by hand.
	edit := func(mut func(*coordinationv1.Lease)) {
		l, _ := x.lease("rel")
		mut(l)
		if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	edit(func(l *coordinationv1.Lease) {
		l.Spec.HolderIdentity = ptrTo("s-corrupt")
		l.Annotations[lock.AnnotationRecord] = `{"schema":1,"session":"s-corrupt"`
	})
	checkRefused := func(session string) {
		t.Helper()
		before := x.versions("rel")
		for _, a := range [][]string{{"unlock", "rel", "--session", session}, {"unlock", "rel", "--session", session, "--force", "--yes"}, {"recover", "rel"}, {"recover", "rel", "--dry-run"}} {
			res := x.run(exitcode.BadLock, a...)
			wantContains(t, strings.Join(a, " "), res.Stderr, `release "rel" in namespace "`+x.ns+`": Lease helm-autorecover.v1.rel:`, "nothing was written", "kubectl get lease -n "+x.ns)
		}
		res := x.run(0, "locks", "rel")
		wantContains(t, "locks rel", res.Stderr, "Warning: release \"rel\" in namespace \""+x.ns+"\"")
		if after := x.versions("rel"); after != before {
			t.Errorf("refusals wrote: before %s, after %s", before, after)
		}
	}
	checkRefused("s-corrupt")
	edit(func(l *coordinationv1.Lease) {
		rec := record("rel", x.ns, "s-real", lock.OpUpgrade, 2, time.Now(), time.Now())
		s, _ := rec.Encode()
		l.Annotations[lock.AnnotationRecord] = s
		l.Spec.HolderIdentity = ptrTo("mallory")
	})
	checkRefused("mallory")
	if after := x.versions("ghost"); after != before {
		t.Errorf("refusals wrote the ghost lease: before %s, after %s", before, after)
	}
}

// TestIntegrationCorruptRecordLock: a lock annotation on the newest release
// record that is not JSON at all (another tool, a hand edit) stops every
// guarded command with the locked exit code and no talk of waiting; the lock
// commands refuse with the bad-lock exit code and say which record it is
// and how to clear it; and following that advice frees the release.
func TestIntegrationCorruptRecordLock(t *testing.T) {
	t.Parallel()
	x := newIT(t)
	chart := x.env.Chart("app")
	x.run(0, "install", "rec", chart, "--lock-backend", "release")
	secrets := x.env.Client.CoreV1().Secrets(x.ns)
	name := helmx.ReleaseSecretName("rec", 1)
	s, err := secrets.Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Annotations[lock.AnnotationRecord] = "{garbage"
	if _, err := secrets.Update(t.Context(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := x.versions("rec")
	for _, backend := range []string{"release", "lease"} {
		res := x.run(exitcode.Locked, "upgrade", "rec", chart, "--lock-backend", backend)
		wantContains(t, "upgrade --lock-backend="+backend, res.Stderr, "cannot be read", "does not expire by itself", `helm-autorecover locks rec -n `+x.ns)
		if strings.Contains(res.Stderr, "--lock-timeout") {
			t.Errorf("upgrade --lock-backend=%s suggests waiting for a lock that never expires:\n%s", backend, res.Stderr)
		}
	}
	ref := "secret/" + name
	advice := []string{ref, "kubectl get -n " + x.ns + " " + ref, "kubectl annotate -n " + x.ns + " " + ref + " " + lock.AnnotationRecord + "-"}
	for _, a := range [][]string{{"unlock", "rec", "--session", "x"}, {"recover", "rec"}} {
		res := x.run(exitcode.BadLock, a...)
		wantContains(t, strings.Join(a, " "), res.Stderr, append([]string{"nothing was written"}, advice...)...)
		if strings.Contains(res.Stderr, "Lease") {
			t.Errorf("%s talks of a Lease for a lock on a release record:\n%s", strings.Join(a, " "), res.Stderr)
		}
	}
	wantContains(t, "locks rec", x.run(0, "locks", "rec").Stderr, advice...)
	if after := x.versions("rec"); after != before {
		t.Errorf("refusals wrote: before %s, after %s", before, after)
	}

	// The advice works: without the annotation the release is free.
	s, err = secrets.Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(s.Annotations, lock.AnnotationRecord)
	if _, err := secrets.Update(t.Context(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	x.run(0, "upgrade", "rec", chart, "--lock-backend", "release")
}

// TestHelpSaysWhatItTouches: each command's help states what it reads and
// writes, and its exit codes.
func TestHelpSaysWhatItTouches(t *testing.T) {
	c := &lockCmds{}
	for _, tc := range []struct {
		cmd  *cobra.Command
		want []string
	}{
		{newLocksCmd(c), []string{"API server's clock", "Reads helm's release Secrets", "--lock-backend=lease also the Leases", "Writes nothing.", "Exit codes"}},
		{newUnlockCmd(c), []string{"Touches: the lock of the holder (on the release's newest stored record", "Refusals (nothing is written)", "exit 8", "exit 10"}},
		{newRecoverCmd(c), []string{"Touches: the release's lock (on its newest stored record and its beat", "--dry-run reads the same, lists the same objects in the same\nform", "Exit codes"}},
	} {
		for _, w := range tc.want {
			if !strings.Contains(tc.cmd.Long, w) {
				t.Errorf("%s --help does not say %q", tc.cmd.Name(), w)
			}
		}
	}
}

// TestLocksEmpty: nothing to show prints no bare header but a sentence on
// stderr naming where it looked; -o json prints an empty list.
func TestLocksEmpty(t *testing.T) {
	e := newFakeEnv(t, revision(t, "db", "prod", 1, common.StatusDeployed, at(-time.Hour)))
	if code, err := e.run(t, newLocksCmd(e.c)); code != 0 {
		t.Fatalf("exit %d: %v", code, err)
	}
	if e.out.Len() != 0 {
		t.Errorf("stdout of an empty locks: %q", e.out.String())
	}
	wantContains(t, "stderr", e.errOut.String(), `No locks found in namespace "prod": no release is held, expired or pending. --all lists every release.`)
	if code, err := e.run(t, newLocksCmd(e.c), "-A", "-o", "json"); code != 0 || strings.TrimSpace(e.out.String()) != "[]" {
		t.Errorf("locks -A -o json: exit %d (%v), stdout %q", code, err, e.out.String())
	}
}
