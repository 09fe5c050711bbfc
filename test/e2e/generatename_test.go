package e2e

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestGenerateNameIsGuarded (issue 15 item 2): `install --generate-name`
// and `install --name-template` are locked like any other install: the
// name is chosen first, the way helm would, then locked. The generated
// release's record carries the install's lock; a template naming a release
// another client holds is refused with the locked exit code, before helm
// could answer that the name is in use.
func TestGenerateNameIsGuarded(t *testing.T) {
	env := testenv.Get(t)
	ha := env.Bin(t)
	chart := env.Chart("app")
	ns := env.Namespace(t)

	res := mustRun(t, env, ha, "install", chart, "--generate-name", "-n", ns)
	m := regexp.MustCompile(`(?m)^NAME: (app-[0-9]+)$`).FindStringSubmatch(res.Stdout)
	if m == nil {
		t.Fatalf("no generated name in the output:\n%s", res.Stdout)
	}
	hist := env.History(t, ns, m[1])
	if len(hist) != 1 {
		t.Fatalf("release %s has %d records; want 1", m[1], len(hist))
	}
	rec, err := lock.DecodeRecord(hist[0].Secret.Annotations[lock.AnnotationRecord])
	if err != nil || rec.Operation != lock.OpInstall || rec.ReleasedAt.IsZero() {
		t.Errorf("the generated release's record carries lock %+v (%v); want the install's, released", rec, err)
	}

	// A holder upgrading "held" (held open by pods that never schedule).
	const held = "held"
	mustRun(t, env, ha, "install", held, chart, "-n", ns)
	holder := env.Start(t, ha, args([]string{"upgrade", held, chart, "-n", ns, "--wait", "--timeout", "5m"}, unschedulable)...)
	env.WaitForStatus(t, ns, held, 2, "pending-upgrade", 60*time.Second)
	w := waitForWriter(t, env, ns, held, 2, 10*time.Second)
	res = env.Run(t, ha, "install", chart, "--name-template", held, "-n", ns)
	if res.ExitCode != exitcode.Locked || !strings.Contains(res.Stderr, w.Session) {
		t.Errorf("install --name-template %s while its lock is held: exit %d; want %d (locked), naming the holder %s\nstderr:\n%s", held, res.ExitCode, exitcode.Locked, w.Session, res.Stderr)
	}
	holder.Kill(t)
}
