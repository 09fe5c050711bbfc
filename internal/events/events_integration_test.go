package events

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestIntegrationAutoRecovered records the Event the guard records after an
// automatic recovery, on a real API server, and reads it back through the
// core/v1 API that `kubectl get events` uses.
func TestIntegrationAutoRecovered(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	if res := env.Run(t, env.Helm4, "install", "rel", env.Chart("app"), "-n", ns); res.ExitCode != 0 {
		t.Fatalf("install: %s", res.Stderr)
	}
	hist := env.History(t, ns, "rel")
	target, err := helmx.Summarize(&hist[0].Secret)
	if err != nil {
		t.Fatal(err)
	}
	reason := `release "rel" in namespace "` + ns + `": revision 1 is pending-install, ...; it is abandoned and will be marked failed`
	at := time.Now().UTC()
	if err := AutoRecovered(t.Context(), env.Client, helmx.SecretRecords(env.Client), target, reason, "sess-1", at); err != nil {
		t.Fatal(err)
	}
	evs, err := env.Client.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var found []corev1.Event
	for _, e := range evs.Items {
		if e.Reason == ReasonAutoRecovered {
			found = append(found, e)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d %s events; want 1", len(found), ReasonAutoRecovered)
	}
	e := found[0]
	if e.Reason != ReasonAutoRecovered || e.Type != "Warning" || e.InvolvedObject.Kind != "Secret" ||
		e.InvolvedObject.Name != target.RecordName || e.InvolvedObject.UID != hist[0].Secret.UID ||
		!strings.Contains(e.Message, "sess-1") || !strings.Contains(e.Message, reason) || e.ReportingController != ReportingController {
		t.Errorf("event: %+v", e)
	}
	if d := e.EventTime.Sub(at); d < -time.Millisecond || d > time.Millisecond {
		t.Errorf("eventTime %v; want %v", e.EventTime, at)
	}
}
