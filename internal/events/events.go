package events

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// Reasons of the Events this project records.
const (
	// ReasonAutoRecovered: a guarded install, upgrade, rollback or uninstall
	// found the release's latest revision abandoned and marked it failed.
	ReasonAutoRecovered = "AutoRecovered"
	// ReasonRecovered: `helm-autorecover recover` marked an abandoned
	// revision failed.
	ReasonRecovered = "Recovered"
	// ReasonUnlocked: `helm-autorecover unlock` released an expired lock.
	ReasonUnlocked = "Unlocked"
	// ReasonForceUnlocked: `helm-autorecover unlock --force` released a lock
	// whose holder was still renewing it.
	ReasonForceUnlocked = "ForceUnlocked"
)

// ReportingController names this project in every Event.
const ReportingController = "helm-autorecover"

// noteLimit is the API server's limit on an Event's note (1 KiB).
const noteLimit = 1024

// timeout bounds the writes of one Event: it must never hold up a command.
const timeout = 5 * time.Second

// Event is one thing that happened to a release.
type Event struct {
	// Regarding is the release's latest revision record, a Secret or a
	// ConfigMap (helmx.Record.Ref).
	Regarding corev1.ObjectReference
	// Type is corev1.EventTypeNormal or corev1.EventTypeWarning.
	Type   string
	Reason string
	// Action is what was done, in one word or two (Recover, Unlock).
	Action string
	// Note is the sentence a person reads; cut to the API's 1 KiB limit.
	Note string
	// At is when it happened, in API-server time.
	At time.Time
	// Instance names the reporting process, user@host.
	Instance string
}

// Build returns the events.k8s.io/v1 object for ev, without writing it. It
// is pure; Emit writes what it returns.
func Build(ev Event) *eventsv1.Event {
	at := ev.At.UTC()
	instance := ev.Instance
	if instance == "" {
		instance = "unknown"
	}
	return &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{
			// Like client-go's recorder: the object's name plus a
			// timestamp, unique enough and easy to relate.
			Name:      fmt.Sprintf("%s.%x", ev.Regarding.Name, at.UnixNano()),
			Namespace: ev.Regarding.Namespace,
			Labels:    map[string]string{"app.kubernetes.io/managed-by": ReportingController},
		},
		EventTime:           metav1.MicroTime{Time: at},
		ReportingController: ReportingController,
		ReportingInstance:   truncate(instance, 128),
		Action:              ev.Action,
		Reason:              ev.Reason,
		Regarding:           ev.Regarding,
		Note:                truncate(ev.Note, noteLimit),
		Type:                ev.Type,
	}
}

// Emit writes ev. The error names the release's record and namespace.
func Emit(ctx context.Context, client kubernetes.Interface, ev Event) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	obj := Build(ev)
	if _, err := client.EventsV1().Events(obj.Namespace).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("recording Event %s about %s %q in namespace %q: %w", ev.Reason, ev.Regarding.Kind, ev.Regarding.Name, ev.Regarding.Namespace, err)
	}
	return nil
}

// ReleaseRecord reads the record of one revision, to refer to it.
func ReleaseRecord(ctx context.Context, records helmx.Records, rev helmx.Summary) (helmx.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ns := rev.RecordNamespace
	if ns == "" {
		ns = rev.Namespace
	}
	r, err := records.Get(ctx, ns, rev.RecordName)
	if err != nil {
		return helmx.Record{}, fmt.Errorf("reading %s %q in namespace %q to record an Event: %w", records.Kind(), rev.RecordName, ns, err)
	}
	return r, nil
}

// AutoRecovered records that the guard of session recovered the release's
// latest revision target (as read for the decision) at server time at;
// reason is the recovery decision's Reason. The guard calls it after a
// successful recovery.
func AutoRecovered(ctx context.Context, client kubernetes.Interface, records helmx.Records, target helmx.Summary, reason, session string, at time.Time) error {
	r, err := ReleaseRecord(ctx, records, target)
	if err != nil {
		return err
	}
	return Emit(ctx, client, Event{
		Regarding: r.Ref(),
		Type:      corev1.EventTypeWarning,
		Reason:    ReasonAutoRecovered,
		Action:    "Recover",
		Note:      fmt.Sprintf("Recovered by helm-autorecover session %s: %s", session, reason),
		At:        at,
		Instance:  lock.DefaultWho(),
	})
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "..."
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strings.TrimRight(s[:cut], " ") + mark
}
