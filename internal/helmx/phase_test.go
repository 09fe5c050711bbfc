package helmx

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestHookOf: a hook is an object whose metadata carries helm's hook
// annotation, in the JSON helm sends or in a YAML apply patch; the other
// hook annotations (weight, delete policy) alone make no hook, nor does the
// annotation anywhere but on the object's own metadata in JSON.
func TestHookOf(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
	}{
		{"JSON hook", `{"kind":"Job","metadata":{"name":"migrate","annotations":{"helm.sh/hook":"pre-upgrade","helm.sh/hook-weight":"-5"}}}`, "pre-upgrade"},
		{"JSON hook of two events", `{"metadata":{"annotations":{"helm.sh/hook":"pre-install,pre-upgrade"}}}`, "pre-install,pre-upgrade"},
		{"JSON without annotations", `{"kind":"Deployment","metadata":{"name":"web"}}`, ""},
		{"JSON hook-weight only", `{"metadata":{"annotations":{"helm.sh/hook-weight":"1"}}}`, ""},
		{"JSON hook-delete-policy only", `{"metadata":{"annotations":{"helm.sh/hook-delete-policy":"before-hook-creation"}}}`, ""},
		{"JSON annotation on a pod template only", `{"metadata":{"name":"web"},"spec":{"template":{"metadata":{"annotations":{"helm.sh/hook":"pre-upgrade"}}}}}`, ""},
		{"JSON patch without metadata", `{"spec":{"replicas":2}}`, ""},
		{"YAML hook", "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: migrate\n  annotations:\n    helm.sh/hook: post-upgrade\n    helm.sh/hook-weight: \"0\"\n", "post-upgrade"},
		{"YAML hook, quoted", "metadata:\n  annotations:\n    \"helm.sh/hook\": 'pre-rollback'\n", "pre-rollback"},
		{"YAML hook-weight only", "metadata:\n  annotations:\n    helm.sh/hook-weight: \"5\"\n", ""},
		{"YAML without annotations", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\n", ""},
		{"empty body", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := metadataOf([]byte(tc.body)).hook(); got != tc.want {
				t.Errorf("hook = %q; want %q", got, tc.want)
			}
		})
	}
}

// okTransport answers every request 200 with an empty object.
type okTransport struct{}

func (okTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		_ = req.Body.Close()
	}
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("{}")), Request: req}, nil
}

// TestWriteFenceBusy follows helm's writes through the fence and what Busy
// says of each moment of its operation: a write of a hook's resource starts
// the hook (busy: a holder asked to stop waits); the next write of anything
// else, or of a release record, ends it, and so does the delete of the
// hook's own resource (a hook-succeeded policy); a delete of anything else
// (helm removing a hook's earlier resource before it creates it again)
// changes nothing; once helm created a revision
// pending-rollback (a rollback, or an upgrade's --rollback-on-failure) it
// is busy for the rest of the operation, whatever it writes; the next
// operation's Guard starts afresh. The channel Busy returns is closed at a
// change of phase, and only then.
func TestWriteFenceBusy(t *testing.T) {
	const (
		hookBusy     = "a pre-upgrade hook of the chart is running"
		rollbackBusy = "helm is rolling the release back, which it cannot cancel"
	)
	w := &WriteFence{}
	g := GuardedWrites{Namespace: "shop", Release: "web", Resource: "secrets", Lock: drainLock{deadline: time.Now().Add(time.Minute)}}
	stop := w.Guard(g)
	defer func() { stop() }()
	f := &fenceRT{next: okTransport{}, w: w}
	send := func(method, path, body string) {
		t.Helper()
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, err := http.NewRequestWithContext(context.Background(), method, "https://api"+path, rd)
		if err != nil {
			t.Fatal(err)
		}
		// Through the whole fence: a record write's own handling may
		// fail on this transport; its phase is noted before it is sent.
		if resp, err := f.RoundTrip(req); err == nil {
			_ = resp.Body.Close()
		}
	}
	const (
		job        = "/apis/batch/v1/namespaces/shop/jobs"
		deployment = "/apis/apps/v1/namespaces/shop/deployments/web"
		records    = "/api/v1/namespaces/shop/secrets"
		record2    = "/api/v1/namespaces/shop/secrets/sh.helm.release.v1.web.v2"
	)
	hook := `{"kind":"Job","metadata":{"name":"migrate","annotations":{"helm.sh/hook":"pre-upgrade"}}}`
	plain := `{"kind":"Deployment","metadata":{"name":"web"}}`
	pendingRollback := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"sh.helm.release.v1.web.v3","namespace":"shop","labels":{"owner":"helm","name":"web","version":"3","status":"pending-rollback"}},"data":{"release":"eA=="}}`

	for i, step := range []struct {
		name               string
		method, path, body string
		want               string
		changes            bool
	}{
		{"a chart object", http.MethodPatch, deployment, plain, "", false},
		{"a hook's resource", http.MethodPost, job, hook, hookBusy, true},
		{"another resource deleted", http.MethodDelete, job + "/cleanup", `{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Background"}`, hookBusy, false},
		{"the hook's resource deleted", http.MethodDelete, job + "/migrate", "", "", true},
		{"the next chart object", http.MethodPatch, deployment, plain, "", false},
		{"a hook, applied", http.MethodPatch, job + "/migrate", hook, hookBusy, true},
		{"the same hook created", http.MethodPost, job, hook, hookBusy, false},
		{"a release record", http.MethodPut, record2, `{}`, "", true},
		{"a revision pending-rollback", http.MethodPost, records, pendingRollback, rollbackBusy, true},
		{"a chart object of the rollback", http.MethodPatch, deployment, plain, rollbackBusy, false},
		{"a release record of the rollback", http.MethodPut, record2, `{}`, rollbackBusy, false},
		{"a hook of the rollback", http.MethodPost, job, hook, rollbackBusy, true},
	} {
		_, changed := w.Busy()
		send(step.method, step.path, step.body)
		why, _ := w.Busy()
		if why != step.want {
			t.Errorf("step %d, %s: Busy = %q; want %q", i, step.name, why, step.want)
		}
		select {
		case <-changed:
			if !step.changes {
				t.Errorf("step %d, %s: the change channel was closed; the phase did not change", i, step.name)
			}
		default:
			if step.changes {
				t.Errorf("step %d, %s: the change channel is still open after a change of phase", i, step.name)
			}
		}
	}

	// The next operation starts afresh.
	stop()
	stop = w.Guard(g)
	if why, _ := w.Busy(); why != "" {
		t.Errorf("after Guard: Busy = %q; want \"\"", why)
	}
}
