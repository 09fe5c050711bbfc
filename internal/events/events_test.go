package events

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
)

func TestBuild(t *testing.T) {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sh.helm.release.v1.web.v3", Namespace: "prod", UID: "u-1", ResourceVersion: "42"}}
	at := time.Date(2026, 12, 2, 13, 9, 58, 123456000, time.FixedZone("CET", 3600))
	ev := Build(Event{
		Regarding: helmx.SecretRecord(s).Ref(), Type: corev1.EventTypeWarning, Reason: ReasonForceUnlocked, Action: "Unlock",
		Note: "released", At: at, Instance: "bob@laptop",
	})
	if want := "sh.helm.release.v1.web.v3." + "18ed6e919ff22600"; ev.Name != want {
		t.Errorf("name = %q; want %q", ev.Name, want)
	}
	if ev.Namespace != "prod" || ev.Regarding.Kind != "Secret" || ev.Regarding.APIVersion != "v1" || ev.Regarding.UID != "u-1" || ev.Regarding.Name != s.Name {
		t.Errorf("regarding = %+v in namespace %q; want the Secret", ev.Regarding, ev.Namespace)
	}
	if !ev.EventTime.Time.Equal(at) || ev.EventTime.Location() != time.UTC {
		t.Errorf("eventTime = %v; want %v in UTC", ev.EventTime, at)
	}
	if ev.ReportingController != ReportingController || ev.ReportingInstance != "bob@laptop" || ev.Reason != "ForceUnlocked" || ev.Type != "Warning" || ev.Action != "Unlock" {
		t.Errorf("event = %+v", ev)
	}
}

func TestBuildTruncates(t *testing.T) {
	note := strings.Repeat("é", 600) // 1200 bytes
	ev := Build(Event{Note: note, Instance: strings.Repeat("x", 200)})
	if len(ev.Note) > noteLimit || !utf8.ValidString(ev.Note) || !strings.HasSuffix(ev.Note, "...") {
		t.Errorf("note of %d bytes, valid UTF-8 %v, ends %q; want at most %d valid bytes ending in ...", len(ev.Note), utf8.ValidString(ev.Note), ev.Note[len(ev.Note)-5:], noteLimit)
	}
	if len(ev.ReportingInstance) > 128 {
		t.Errorf("reportingInstance has %d bytes; want at most 128", len(ev.ReportingInstance))
	}
	if got := Build(Event{}).ReportingInstance; got != "unknown" {
		t.Errorf("empty instance = %q; want unknown", got)
	}
}
