package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/guard"
	"github.com/helm-autorecover/helm-autorecover/internal/inspect"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/releasestore"
)

// preemptBeat is the beat object of release web in the fixture, whose
// queue (in the compact form the beat stores, key "p" the request to stop, "ph" the holder it asks)
// holds one waiter that asked the holder to stop, its entry expiring at
// expires.
func preemptBeat(expires time.Time) *corev1.Secret {
	const lease = 15 * time.Second
	queue := fmt.Sprintf(`[{"s":"a1b20000-8888-4a5b-9c8d-000000000008","w":"carol@ci-9","o":"upgrade","e":%d,"x":%d,"l":%d,"p":true,"ph":"0f3c6a2e-1111-4a5b-9c8d-000000000001"}]`,
		expires.Add(-lease-time.Second).UnixMilli(), expires.UnixMilli(), lease.Milliseconds())
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
		Name: lock.LeaseName("web"), Namespace: "prod",
		Labels:      map[string]string{lock.LabelManagedBy: lock.ManagedBy, lock.LabelRelease: "web", "name": "web"}, // beatLabels
		Annotations: map[string]string{releasestore.AnnotationWaiters: queue},
	}}
}

// TestLocksShowPreemptRequest: a waiter that asked the holder to stop
// (--preempt) is shown by locks, named as the holder is (who, session, the
// operation it waits to run, since when), in the table's HOLDER cell and
// as preempt_requested_by in JSON; once its entry has expired in server
// time it asks nothing, and nothing is shown.
func TestLocksShowPreemptRequest(t *testing.T) {
	for _, tc := range []struct {
		name    string
		expires time.Time
		want    *inspect.PreemptRequest
	}{
		{"live request", at(14 * time.Second), &inspect.PreemptRequest{Session: "a1b20000-8888-4a5b-9c8d-000000000008", Who: "carol@ci-9", Operation: "upgrade", RequestedAt: at(-2 * time.Second)}},
		{"expired request", at(-10 * time.Second), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEnv(t, append(fixture(t), preemptBeat(tc.expires))...)
			if code, err := e.run(t, newLocksCmd(e.c), "web", "-o", "json"); code != 0 {
				t.Fatalf("exit %d: %v", code, err)
			}
			var rows []inspect.Row
			if err := json.Unmarshal(e.out.Bytes(), &rows); err != nil || len(rows) != 1 {
				t.Fatalf("locks -o json: %v\n%s", err, e.out.String())
			}
			got := rows[0].PreemptRequestedBy
			switch {
			case got == nil && tc.want == nil:
			case got == nil || tc.want == nil || *got != *tc.want:
				t.Fatalf("preempt_requested_by = %+v; want %+v\n%s", got, tc.want, e.out.String())
			}
			if code, err := e.run(t, newLocksCmd(e.c), "web"); code != 0 {
				t.Fatalf("exit %d: %v", code, err)
			}
			const asked = "alice@ci-7 (pid 4242); asked to stop by carol@ci-9 (session a1b20000-8888-4a5b-9c8d-000000000008, waiting to upgrade) since 2026-12-02T13:09:58Z"
			if shown := strings.Contains(e.out.String(), asked); shown != (tc.want != nil) {
				t.Errorf("table shows the request: %v; want %v\n%s", shown, tc.want != nil, e.out.String())
			}
			if w := e.writes(); len(w) > 0 {
				t.Errorf("locks wrote %v; it must only read", w)
			}
		})
	}
}

// TestPreemptFlagOnlyOnGuardedCommands: --preempt (and its variable) is a
// flag of install, upgrade, rollback and uninstall alone; recover, unlock
// and the controller never preempt, and refuse it as any unknown flag.
func TestPreemptFlagOnlyOnGuardedCommands(t *testing.T) {
	t.Setenv(guard.EnvPreempt, "")
	for _, tc := range []struct {
		args []string
		has  bool
	}{
		{[]string{"install", "--help"}, true},
		{[]string{"upgrade", "--help"}, true},
		{[]string{"rollback", "--help"}, true},
		{[]string{"uninstall", "--help"}, true},
		{[]string{"recover", "--help"}, false},
		{[]string{"unlock", "--help"}, false},
		{[]string{"controller", "--help"}, false},
		{[]string{"locks", "--help"}, false},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := Run(&out, &errOut, tc.args); code != exitcode.OK {
				t.Fatalf("exit %d; stderr:\n%s", code, errOut.String())
			}
			help := out.String()
			if got := strings.Contains(help, "--preempt") && strings.Contains(help, guard.EnvPreempt); got != tc.has {
				t.Errorf("help lists --preempt [%s]: %v; want %v\n%s", guard.EnvPreempt, got, tc.has, help)
			}
		})
	}
	for _, args := range [][]string{
		{"recover", "r", "--preempt"},
		{"unlock", "r", "--session", "s", "--preempt"},
		{"controller", "--preempt"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := Run(&out, &errOut, args); code != exitcode.Usage || !strings.Contains(errOut.String(), "unknown flag: --preempt") {
				t.Errorf("exit %d, want %d and unknown flag: --preempt; stderr:\n%s", code, exitcode.Usage, errOut.String())
			}
		})
	}
}
