package e2e

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

// TestUnreadableRecordIsSkipped: a Secret labelled as a revision of the
// release whose payload is not a release (written by another tool, or
// corrupted) is skipped by stock helm; helm-autorecover skips it too, and
// says which, instead of refusing every operation on the release. When the
// unreadable record is the newest revision, where the lock lives and a live
// holder's lock may sit, it refuses with a message naming it.
func TestUnreadableRecordIsSkipped(t *testing.T) {
	env := testenv.Get(t)
	bin := env.Bin(t)
	ns := env.Namespace(t)
	chart := env.Chart("app")
	const rel = "corrupt"
	mustRun(t, env, bin, "install", rel, chart, "-n", ns)

	put := func(rev string) string {
		t.Helper()
		name := "sh.helm.release.v1." + rel + ".v" + rev
		_, err := env.Client.CoreV1().Secrets(ns).Create(context.Background(), &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
				helmx.LabelOwner: helmx.OwnerHelm, helmx.LabelName: rel, helmx.LabelVersion: rev,
			}},
			Type: helmx.ReleaseSecretType,
			Data: map[string][]byte{helmx.ReleaseDataKey: []byte("not a release")},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return name
	}

	old := put("0")
	res := mustRun(t, env, bin, "upgrade", rel, chart, "-n", ns, "--set", "message=v2")
	if !strings.Contains(res.Stderr, old) {
		t.Errorf("no warning naming the skipped record %s:\n%s", old, res.Stderr)
	}
	mustRun(t, env, env.Helm4, "upgrade", rel, chart, "-n", ns, "--set", "message=v3")
	mustRun(t, env, bin, "upgrade", rel, chart, "-n", ns, "--set", "message=v4")
	// The test helper lists the unreadable record as revision 0 with no
	// status: it stays as it was.
	if got := strings.Join(env.Summary(t, ns, rel), " "); got != "0: 1:superseded 2:superseded 3:superseded 4:deployed" {
		t.Errorf("history = %s", got)
	}

	newest := put("99")
	res = env.Run(t, bin, "upgrade", rel, chart, "-n", ns, "--set", "message=v5")
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, newest) || !strings.Contains(res.Stderr, "newest record is unreadable") {
		t.Errorf("upgrade with an unreadable newest record: exit %d\n%s\nwant a refusal naming %s", res.ExitCode, res.Stderr, newest)
	}
}
