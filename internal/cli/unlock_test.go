package cli

import (
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/inspect"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// editLease applies mut to the Lease of rel in objs.
// editLease edits rel's Lease after dropping the lock from rel's records,
// so that the Lease is the only place its lock lives (as a client that took
// only the Lease leaves it) and the edit is what the command judges.
func editLease(objs []runtime.Object, rel string, mut func(*coordinationv1.Lease)) []runtime.Object {
	for _, o := range objs {
		if l, ok := o.(*coordinationv1.Lease); ok && l.Name == lock.LeaseName(rel) {
			mut(l)
		}
		if s, ok := o.(*corev1.Secret); ok && s.Labels[helmx.LabelName] == rel {
			delete(s.Annotations, lock.AnnotationRecord)
		}
	}
	return objs
}

// TestUnlockRefusals: every refusal names the release and namespace, says
// what to do, has its documented exit code, and writes nothing.
func TestUnlockRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		objs func(t *testing.T) []runtime.Object
		tty  bool
		in   string
		args []string
		code int
		want string
	}{
		{
			name: "wrong session", args: []string{"api", "--session", sessWeb}, code: exitcode.WrongSession,
			want: `release "api" in namespace "prod": session ` + sessWeb + ` does not hold its lock; it is held by session ` + sessAPI + ` (alice@ci-7 pid 4242, operation upgrade of revision 3, LOCKED TILL 2026-12-02T13:01:15Z). Check with: helm-autorecover locks api -n prod`,
		},
		{
			name: "live without --force", args: []string{"web", "--session", sessWeb}, code: exitcode.Locked,
			want: `release "web" in namespace "prod": the lock of session ` + sessWeb + ` is live: its holder (alice@ci-7 pid 4242, operation upgrade of revision 8, job https://github.com/acme/web/actions/runs/42) renewed it at 2026-12-02T13:09:55Z, LOCKED TILL 2026-12-02T13:10:10Z (10s left); it may still be running. Wait for it to finish or expire; if you know it is dead (process killed, CI job cancelled), run again with --force`,
		},
		{
			name: "--force, no terminal, no --yes", args: []string{"web", "--session", sessWeb, "--force"}, code: exitcode.Declined,
			want: `release "web" in namespace "prod": --force on a live lock needs confirmation, and stdin is not a terminal; nothing was written. Pass --yes to confirm in scripts`,
		},
		{
			name: "--force, answered no", args: []string{"web", "--session", sessWeb, "--force"}, tty: true, in: "no\n", code: exitcode.Declined,
			want: `release "web" in namespace "prod": not confirmed; nothing was written`,
		},
		{
			name: "--force, answered y", args: []string{"web", "--session", sessWeb, "--force"}, tty: true, in: "y\n", code: exitcode.Declined,
			want: `release "web" in namespace "prod": not confirmed (the answer must be yes); nothing was written`,
		},
		{
			name: "--force, no answer", args: []string{"web", "--session", sessWeb, "--force"}, tty: true, code: exitcode.Declined,
			want: `release "web" in namespace "prod": not confirmed; nothing was written`,
		},
		{
			name: "unknown release", args: []string{"nope", "--session", sessWeb}, code: exitcode.NotFound,
			want: `release "nope" not found in namespace "prod": it has no stored revision and no lock. Check the name and the namespace (-n), or list releases with: helm-autorecover list -A`,
		},
		{
			name: "no lock", args: []string{"legacy", "--session", sessWeb}, code: exitcode.NotFound,
			want: `release "legacy" in namespace "prod" has no lock (no Lease helm-autorecover.v1.legacy): nothing to unlock. Its revision 2 is pending-rollback with no lock record covering it (stock helm may have written it, and may still be running): helm-autorecover recover legacy -n prod recovers it once it has been pending for --recover-legacy-after (see when with --dry-run; lower the flag only if you know no helm process is at work on it)`,
		},
		{
			// Issue 35 item 6: a released lock of ours, then stock helm
			// left a revision pending; unlock pointed nowhere.
			name: "nobody holds it, stock helm's revision pending", args: []string{"db", "--session", sessWeb}, code: exitcode.NotFound,
			objs: func(t *testing.T) []runtime.Object {
				return append(fixture(t), revision(t, "db", "prod", 2, common.StatusPendingUpgrade, at(-time.Minute)))
			},
			want: `release "db" in namespace "prod": nobody holds its lock; nothing to unlock. Its revision 2 is pending-upgrade with no lock record covering it (stock helm may have written it, and may still be running): helm-autorecover recover db -n prod recovers it once it has been pending for --recover-legacy-after (see when with --dry-run; lower the flag only if you know no helm process is at work on it)`,
		},
		{
			name: "already released", args: []string{"db", "--session", sessDB}, code: exitcode.NotFound,
			want: `release "db" in namespace "prod": the lock of session ` + sessDB + ` was already released at 2026-12-02T12:11:00Z by its holder; nothing to unlock`,
		},
		{
			name: "nobody holds it", args: []string{"db", "--session", sessWeb}, code: exitcode.NotFound,
			want: `release "db" in namespace "prod": nobody holds its lock; nothing to unlock (see helm-autorecover locks db -n prod)`,
		},
		{
			name: "no history", args: []string{"ghost", "--session", "s-1"}, code: exitcode.NotFound,
			objs: func(t *testing.T) []runtime.Object {
				return []runtime.Object{lease(t, record("ghost", "prod", "s-1", lock.OpInstall, 1, at(-time.Hour), at(-time.Hour)))}
			},
			want: `release "ghost" in namespace "prod" has no stored revision (its Lease helm-autorecover.v1.ghost exists, holder "s-1"): nothing to recover. If it is gone for good, delete it: kubectl delete lease -n prod helm-autorecover.v1.ghost`,
		},
		{
			name: "corrupt record", args: []string{"api", "--session", sessAPI}, code: exitcode.BadLock,
			objs: func(t *testing.T) []runtime.Object {
				return editLease(fixture(t), "api", func(l *coordinationv1.Lease) { l.Annotations[lock.AnnotationRecord] = "{not json" })
			},
			want: `release "api" in namespace "prod": Lease helm-autorecover.v1.api: its lock record (annotation helm-autorecover.io/lock) cannot be read: decode lock record: invalid character 'n' looking for beginning of object key string; nothing was written. Inspect it with: kubectl get lease -n prod helm-autorecover.v1.api -o yaml. If no helm-autorecover process is working on the release, delete it (kubectl delete lease -n prod helm-autorecover.v1.api) and run: helm-autorecover recover api -n prod --recover-legacy-after=1s`,
		},
		{
			name: "newer schema", args: []string{"api", "--session", sessAPI}, code: exitcode.BadLock,
			objs: func(t *testing.T) []runtime.Object {
				return editLease(fixture(t), "api", func(l *coordinationv1.Lease) {
					l.Annotations[lock.AnnotationRecord] = strings.Replace(l.Annotations[lock.AnnotationRecord], `"schema":1`, `"schema":7`, 1)
				})
			},
			want: `release "api" in namespace "prod": Lease helm-autorecover.v1.api: its lock record (annotation helm-autorecover.io/lock) cannot be read: decode lock record: schema 7 is newer than 1, upgrade helm-autorecover: unsupported lock record schema; nothing was written.`,
		},
		{
			name: "holder edited by hand", args: []string{"api", "--session", "me"}, code: exitcode.BadLock,
			objs: func(t *testing.T) []runtime.Object {
				return editLease(fixture(t), "api", func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptrTo("me") })
			},
			want: `release "api" in namespace "prod": Lease helm-autorecover.v1.api: its holderIdentity "me" does not match the session "` + sessAPI + `" of its lock record: it was edited by hand; nothing was written.`,
		},
		{
			name: "record of another release", args: []string{"api", "--session", sessAPI}, code: exitcode.BadLock,
			objs: func(t *testing.T) []runtime.Object {
				return editLease(fixture(t), "api", func(l *coordinationv1.Lease) {
					l.Annotations[lock.AnnotationRecord] = strings.Replace(l.Annotations[lock.AnnotationRecord], `"release":"api"`, `"release":"web"`, 1)
				})
			},
			want: `release "api" in namespace "prod": Lease helm-autorecover.v1.api: its lock record names release "web", not "api": it was copied or edited by hand; nothing was written.`,
		},
		{
			name: "held with no record", args: []string{"api", "--session", sessAPI}, code: exitcode.BadLock,
			objs: func(t *testing.T) []runtime.Object {
				return editLease(fixture(t), "api", func(l *coordinationv1.Lease) { delete(l.Annotations, lock.AnnotationRecord) })
			},
			want: `release "api" in namespace "prod": Lease helm-autorecover.v1.api: it is held by session ` + sessAPI + ` but carries no lock record (annotation helm-autorecover.io/lock): it was created or edited by hand; nothing was written.`,
		},
		{name: "no --session", args: []string{"api"}, code: exitcode.Usage, want: `release "api" in namespace "prod": --session is required; find the holder's session with: helm-autorecover locks api -n prod`},
		{name: "no release", args: []string{"--session", sessAPI}, code: exitcode.Usage, want: `unlock: needs exactly one argument, the release name; got 0 (see unlock --help)`},
		{name: "bad name", args: []string{"Bad_Name", "--session", sessAPI}, code: exitcode.Usage, want: `release "Bad_Name" in namespace "prod": release name "Bad_Name" is not a DNS-1123 subdomain`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := fixture(t)
			if tc.objs != nil {
				objs = tc.objs(t)
			}
			e := newFakeEnv(t, objs...)
			e.tty = tc.tty
			e.in.Reset(tc.in)
			code, err := e.run(t, newUnlockCmd(e.c), tc.args...)
			if code != tc.code || err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("exit %d, error:\n  %v\nwant exit %d, error starting:\n  %s", code, err, tc.code, tc.want)
			}
			if w := e.writes(); len(w) > 0 {
				t.Errorf("a refused unlock wrote %v", w)
			}
		})
	}
}

// TestUnlockExpired releases a dead holder's lock, marks its revision
// failed naming who unlocked it, and records an Unlocked Event.
func TestUnlockExpired(t *testing.T) {
	e := newFakeEnv(t, fixture(t)...)
	code, err := e.run(t, newUnlockCmd(e.c), "api", "--session", sessAPI)
	if code != 0 {
		t.Fatalf("exit %d: %v\nstderr: %s", code, err, e.errOut.String())
	}
	golden(t, "unlock-expired.txt", e.out.Bytes())
	// The holder's lock released (the record's beat, then its gate, then
	// the Lease), then taken (the beat claimed, the gate, the Lease), the
	// revision marked failed under it, both released.
	if got, want := strings.Join(e.writes(), ", "), "create secrets, update secrets, update leases, update secrets, update secrets, update leases, update secrets, update leases, update secrets, create events"; got != want {
		t.Errorf("writes: %s; want %s", got, want)
	}
	checkUnlocked(t, e, "api", 3, "Abandoned pending-upgrade by alice@ci-7 (session "+sessAPI+", operation upgrade); its lock was released by bob@laptop with helm-autorecover unlock at 2026-12-02T13:10:01Z", "Unlocked")
}

// TestUnlockForced releases a live lock after a "yes" on the terminal, or
// with --yes.
func TestUnlockForced(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		tty  bool
		in   string
	}{
		{"answered yes", []string{"web", "--session", sessWeb, "--force"}, true, "yes\n"},
		{"--yes", []string{"web", "--session", sessWeb, "--force", "--yes"}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEnv(t, fixture(t)...)
			e.tty = tc.tty
			e.in.Reset(tc.in)
			// Recovery waits until the holder's LOCKED TILL has passed.
			e.autoStep.Store(true)
			code, err := e.run(t, newUnlockCmd(e.c), tc.args...)
			if code != 0 {
				t.Fatalf("exit %d: %v", code, err)
			}
			golden(t, "unlock-forced.txt", e.out.Bytes())
			if tc.tty {
				prompt, _, _ := strings.Cut(e.errOut.String(), "helm-autorecover: ")
				golden(t, "unlock-forced-prompt.txt", []byte(prompt))
			}
			wantContains(t, "unlock --force stderr", e.errOut.String(), "the holder may still be writing until 2026-12-02T13:10:10Z", "waiting for it")
			desc := checkUnlocked(t, e, "web", 8, "Abandoned pending-upgrade by alice@ci-7 (session "+sessWeb+", operation upgrade); its live lock (LOCKED TILL 2026-12-02T13:10:10Z) was force-released by bob@laptop with helm-autorecover unlock --force at ", "ForceUnlocked")
			// Marked only once the holder's lock had run out.
			at, err := time.Parse(time.RFC3339, desc[strings.LastIndex(desc, " ")+1:])
			if err != nil || !at.After(time.Date(2026, 12, 2, 13, 10, 10, 0, time.UTC)) {
				t.Errorf("revision 8 marked at %v (%v); want after LOCKED TILL 13:10:10", at, err)
			}
		})
	}
}

// checkUnlocked checks the unlocked release and returns the description of
// revision rev, which starts with desc.
func checkUnlocked(t *testing.T, e *fakeEnv, rel string, rev int, desc, reason string) string {
	t.Helper()
	ctx := t.Context()
	s, err := e.client.CoreV1().Secrets("prod").Get(ctx, helmx.ReleaseSecretName(rel, rev), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := helmx.Summarize(s)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Status != common.StatusFailed || !strings.HasPrefix(sum.Description, desc) {
		t.Errorf("revision %d: %s, %q\nwant failed, %q", rev, sum.Status, sum.Description, desc)
	}
	l, err := e.client.CoordinationV1().Leases("prod").Get(ctx, lock.LeaseName(rel), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := lock.DecodeRecord(l.Annotations[lock.AnnotationRecord])
	if err != nil {
		t.Fatal(err)
	}
	// The dead holder's lock was released by bob, who then recovered under
	// a lock of his own (operation recover) and released it.
	if *l.Spec.HolderIdentity != "" || rec.Who != "bob@laptop" || rec.Operation != lock.OpRecover || rec.ReleasedAt.IsZero() {
		t.Errorf("lease holder %q, last record %s (%s) released at %v; want bob@laptop's recover session, released", *l.Spec.HolderIdentity, rec.Who, rec.Operation, rec.ReleasedAt)
	}
	evs, err := e.client.EventsV1().Events("prod").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) != 1 || evs.Items[0].Reason != reason || evs.Items[0].Regarding.Name != helmx.ReleaseSecretName(rel, rev) {
		t.Errorf("events: %+v; want one %s regarding %s", evs.Items, reason, helmx.ReleaseSecretName(rel, rev))
	}
	return sum.Description
}

// TestIntegrationUnlockLive: a live holder is protected against a wrong
// session, a missing --force and a missing confirmation; --force --yes
// releases it, the holder stops (exit 4), its revision reads failed with
// who unlocked it, an Event tells the story, and helm works again.
func TestIntegrationUnlockLive(t *testing.T) {
	t.Parallel()
	x := newIT(t)
	x.install(false, "rel")
	h := x.hold("rel", 2, liveLease)

	res := x.run(exitcode.WrongSession, "unlock", "rel", "--session", "0000-wrong")
	wantContains(t, "wrong session", res.Stderr, `release "rel" in namespace "`+x.ns+`"`, "it is held by session "+h.session)
	res = x.run(3, "unlock", "rel", "--session", h.session)
	wantContains(t, "live lock", res.Stderr, "is live", "--force")
	res = x.run(exitcode.Declined, "unlock", "rel", "--session", h.session, "--force")
	wantContains(t, "--force without a terminal", res.Stderr, "Pass --yes")
	if l, _ := x.lease("rel"); holderID(l) != h.session {
		t.Fatalf("a refused unlock changed the holder to %q", holderID(l))
	}
	if s := x.latest("rel"); s.Revision != 2 || s.Status != "pending-upgrade" {
		t.Fatalf("a refused unlock changed revision 2: %d %s", s.Revision, s.Status)
	}

	res = x.run(0, "unlock", "rel", "--session", h.session, "--force", "--yes")
	wantContains(t, "unlock --force --yes", res.Stdout, "Released the lock", h.session, "Marked revision 2 (pending-upgrade) failed")
	if code := h.proc.Wait(t, 30*time.Second); code != 4 {
		t.Errorf("the holder whose lock was broken exited %d; want 4 (lost its lock)\nstderr:\n%s", code, h.proc.Stderr.String())
	}
	s := x.latest("rel")
	if s.Revision != 2 || s.Status != "failed" || !strings.Contains(s.Description, "force-released by") || !strings.Contains(s.Description, h.session) {
		t.Errorf("revision 2 after unlock: %s %q", s.Status, s.Description)
	}
	// unlock recovered under a lock of its own (operation recover), and
	// released it.
	l, rec := x.lease("rel")
	if holderID(l) != "" || rec == nil || rec.Operation != lock.OpRecover || rec.Session == h.session || rec.ReleasedAt.IsZero() {
		t.Errorf("lease after unlock: holder %q, record %+v", holderID(l), rec)
	}
	wantContains(t, "ForceUnlocked event", x.event("ForceUnlocked", helmx.ReleaseSecretName("rel", 2)), h.session, "force-released")

	res = x.run(exitcode.NotFound, "unlock", "rel", "--session", h.session)
	wantContains(t, "second unlock", res.Stderr, "nobody holds its lock; nothing to unlock")

	x.run(0, "upgrade", "rel", x.env.Chart("app"), "--set", "message=v3")
	if got := strings.Join(x.env.Summary(t, x.ns, "rel"), " "); got != "1:superseded 2:failed 3:deployed" {
		t.Errorf("history after unlock and upgrade: %s", got)
	}
}

// TestIntegrationUnlockExpired releases a dead holder's lock without
// --force.
func TestIntegrationUnlockExpired(t *testing.T) {
	t.Parallel()
	x := newIT(t)
	d := x.dead("rel")
	res := x.run(0, "unlock", "rel", "--session", d.session)
	wantContains(t, "unlock", res.Stdout, "Released the lock", "Marked revision 2 (pending-upgrade) failed")
	s := x.latest("rel")
	if s.Status != "failed" || !strings.Contains(s.Description, "its lock was released by") || !strings.Contains(s.Description, "with helm-autorecover unlock at") {
		t.Errorf("revision 2 after unlock: %s %q", s.Status, s.Description)
	}
	wantContains(t, "Unlocked event", x.event("Unlocked", helmx.ReleaseSecretName("rel", 2)), d.session)
	if r := x.lockRows("rel"); r[0].State != inspect.StateNone {
		t.Errorf("state after unlock: %s", r[0].State)
	}
}
