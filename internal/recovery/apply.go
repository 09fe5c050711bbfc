package recovery

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"helm.sh/helm/v4/pkg/release/common"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

var (
	// ErrNotPending means the revision was resolved (or deleted) by someone
	// else between the decision and the write. Read the history and decide again.
	ErrNotPending = errors.New("the revision is no longer pending")
	// ErrConflict means the revision's Secret changed after it was read, so
	// the write was refused. Read the history and decide again; never retry
	// the same write.
	ErrConflict = errors.New("the revision changed since it was read")
)

// FieldManager is the name recovery writes under, so managedFields show who
// touched a revision.
const FieldManager = "helm-autorecover"

// The descriptions written into an abandoned revision's info.description,
// which helm history shows. Verbs fill in: the pending status; the previous
// holder (who, session, operation) and when its lock expired (its LOCKED
// TILL, not reached, when the holder is known to have stopped before it:
// no description names an expiry later than the recovery), or when the
// revision became pending and its age; then the recovering session and time.
const (
	DescriptionAbandonedByHolder = "Abandoned %s by %s; lock expired at %s; recovered by helm-autorecover session %s at %s"
	DescriptionAbandonedStopped  = "Abandoned %s by %s, which stopped renewing its lock (LOCKED TILL %s, not reached); recovered by helm-autorecover session %s at %s"
	DescriptionAbandonedLegacy   = "Abandoned %s with no lock record (stock helm); pending since %s, age %s; recovered by helm-autorecover session %s at %s"
)

// Recoverer identifies the session that recovers a revision.
type Recoverer struct {
	Session string
	// At is the server time of the recovery.
	At time.Time
}

// DescribeAbandoned is the description to write into an abandoned revision.
func DescribeAbandoned(a Abandonment, by Recoverer) string {
	if a.Lock != nil {
		// Never an expiry later than the recovery (see lockEnd).
		if beforeLockedTill(*a.Lock, by.At) {
			return fmt.Sprintf(DescriptionAbandonedStopped,
				a.Release.Status, holder(*a.Lock), stamp(a.Lock.LockedTill), by.Session, stamp(by.At))
		}
		return fmt.Sprintf(DescriptionAbandonedByHolder,
			a.Release.Status, holder(*a.Lock), stamp(a.Lock.LockedTill), by.Session, stamp(by.At))
	}
	return fmt.Sprintf(DescriptionAbandonedLegacy,
		a.Release.Status, stamp(a.PendingSince), age(a.Age), by.Session, stamp(by.At))
}

// testHookBeforeUpdate, when set by a test, runs between the read and the
// conditional write, to let a competing writer in.
var testHookBeforeUpdate func()

// MarkFailed marks the pending revision target failed with description. It
// reads the revision's record (a Secret, or a ConfigMap with helm's configmap
// driver, as records says) from namespace ns and refuses to write when the
// revision is no longer pending (ErrNotPending) or its resourceVersion is no
// longer target.ResourceVersion (ErrConflict). The write edits only
// info.status, info.description and the status and modifiedAt labels (the
// latter set from serverNow, when known); every other field, label and
// annotation is kept. It is conditional on the resourceVersion read, and a
// conflict comes back as ErrConflict: the caller decides again rather than
// retrying.
func MarkFailed(ctx context.Context, records helmx.Records, ns string, target helmx.Summary, description string, serverNow time.Time) (helmx.Record, error) {
	return MarkFailedHeld(ctx, records, ns, target, "", description, serverNow)
}

// MarkFailedHeld is MarkFailed for a caller that holds the release's lock
// as session holder and marks the newest revision, whose record carries
// that lock (the gate): it refuses to write (lock.ErrLost) unless the
// record read at the write still carries it. A caller that lost its lock
// between its check and its read (a pause, a system sleep) finds the
// taker's lock there, and must not write under it (the simulation, seed
// 24550). An empty holder checks nothing more than MarkFailed. A store
// that fences its writes itself (helmx.Records.WriteFenced: the sql
// driver's trigger) is written as holder (helmx.WithWriter) and refuses the
// write when holder no longer holds the lock; its record names the session
// that wrote it last, not the lock, and is not checked.
func MarkFailedHeld(ctx context.Context, records helmx.Records, ns string, target helmx.Summary, holder, description string, serverNow time.Time) (helmx.Record, error) {
	return MarkFailedLeaving(ctx, records, ns, target, holder, description, serverNow, nil)
}

type beforeWriteKey struct{}

// WithBeforeWrite returns ctx for the Mark* functions: check, the writer's
// lock (Valid), is asked right before each write leaves, after the read it
// is conditional on, and an error it returns stops the write (the
// simulation, seed 82141: a holder that slept between its check and its
// write marked a revision failed after its lock expired).
func WithBeforeWrite(ctx context.Context, check func() error) context.Context {
	return context.WithValue(ctx, beforeWriteKey{}, check)
}

// MarkFailedLeaving is MarkFailedHeld that also records, in the same write,
// the objects only the abandoned revision rendered that recovery left in
// place (left; nil records none): the next guarded upgrade or install
// removes those its own revision does not render (LoadLeft), so that they
// neither leak when this process dies nor go before a revision that may
// render them again is known.
func MarkFailedLeaving(ctx context.Context, records helmx.Records, ns string, target helmx.Summary, holder, description string, serverNow time.Time, left *Deferred) (helmx.Record, error) {
	subject := fmt.Sprintf("revision %d of release %q in namespace %q", target.Revision, target.Name, ns)
	kind := records.Kind()

	cur, err := records.Get(ctx, ns, target.RecordName)
	if apierrors.IsNotFound(err) {
		return helmx.Record{}, fmt.Errorf("marking %s failed: its %s %q is gone, so someone else resolved it; read the history again: %w",
			subject, kind, target.RecordName, ErrNotPending)
	}
	if err != nil {
		return helmx.Record{}, fmt.Errorf("marking %s failed: reading %s %q: %w", subject, kind, target.RecordName, err)
	}
	now, err := helmx.SummarizeRecord(cur)
	if err != nil {
		return helmx.Record{}, fmt.Errorf("marking %s failed: %w", subject, err)
	}
	if target.Revision != 0 && now.Revision != target.Revision {
		return helmx.Record{}, fmt.Errorf("marking %s failed: %s %q holds revision %d; read the history again: %w",
			subject, kind, target.RecordName, now.Revision, ErrConflict)
	}
	if !IsPending(now.Status) {
		return helmx.Record{}, fmt.Errorf("marking %s failed: it is %s now, so someone else resolved it; read the history again: %w",
			subject, now.Status, ErrNotPending)
	}
	rv := cur.Meta.ResourceVersion
	if rv == "" {
		return helmx.Record{}, fmt.Errorf("marking %s failed: the server returned no resourceVersion, and a blind write could overwrite a concurrent writer: %w",
			subject, ErrConflict)
	}
	// A record whose release content is what was read, but whose
	// resourceVersion moved, was only touched by lock writes (renewals, a
	// waiter queueing): the decision still holds, and the write below is
	// conditional on the version just read. Unless the lock on it changed
	// hands: another client's take of the lock is a lock write too, and a
	// caller that lost its lock between its check and this read (a pause,
	// a system sleep) must not write under the taker's lock (the
	// simulation, seed 24550).
	if target.ResourceVersion != "" && rv != target.ResourceVersion && (target.ContentHash == "" || now.ContentHash != target.ContentHash) {
		return helmx.Record{}, fmt.Errorf("marking %s failed: it changed since it was read (resourceVersion %s, now %s); read the history and decide again: %w",
			subject, target.ResourceVersion, rv, ErrConflict)
	}
	if now.LockSession != target.LockSession {
		return helmx.Record{}, fmt.Errorf("marking %s failed: the lock on its record moved from session %q to %q since it was read; read the history and decide again: %w",
			subject, target.LockSession, now.LockSession, ErrConflict)
	}
	if holder != "" && !records.WriteFenced() && now.LockSession != holder {
		return helmx.Record{}, fmt.Errorf("marking %s failed: its record carries the lock of session %q, not this one's (%s): another client took the lock, and nothing was written: %w",
			subject, now.LockSession, holder, lock.ErrLost)
	}

	doc, err := helmx.DecodeReleaseJSON(cur.Payload)
	if err != nil {
		return helmx.Record{}, fmt.Errorf("marking %s failed: %w", subject, err)
	}
	doc, err = helmx.SetInfoFields(doc, map[string]any{
		"status":      common.StatusFailed,
		"description": description,
	})
	if err != nil {
		return helmx.Record{}, fmt.Errorf("marking %s failed: %w", subject, err)
	}
	if !left.Empty() {
		if doc, err = recordLeft(doc, left); err != nil {
			return helmx.Record{}, fmt.Errorf("marking %s failed: %w", subject, err)
		}
	}
	payload, err := helmx.EncodeReleaseJSON(doc)
	if err != nil {
		return helmx.Record{}, fmt.Errorf("marking %s failed: %w", subject, err)
	}

	// The record keeps the resourceVersion read: the update is a compare-and-swap.
	upd := cur
	upd.Meta = *cur.Meta.DeepCopy()
	upd.Payload = payload
	if upd.Meta.Labels == nil {
		upd.Meta.Labels = map[string]string{}
	}
	upd.Meta.Labels[helmx.LabelStatus] = string(common.StatusFailed)
	if !serverNow.IsZero() {
		upd.Meta.Labels[helmx.LabelModifiedAt] = strconv.FormatInt(serverNow.Unix(), 10)
	}

	if testHookBeforeUpdate != nil {
		testHookBeforeUpdate()
	}
	if check, ok := ctx.Value(beforeWriteKey{}).(func() error); ok {
		// The read above may have taken long (a pause, a system sleep):
		// the writer's lock is asked again right before the write leaves.
		if err := check(); err != nil {
			return helmx.Record{}, fmt.Errorf("marking %s failed: stopped before writing it: %w", subject, err)
		}
	}
	out, err := records.Update(helmx.WithWriter(ctx, holder), upd, FieldManager)
	if apierrors.IsConflict(err) {
		return helmx.Record{}, fmt.Errorf("marking %s failed: someone wrote it after it was read at resourceVersion %s; read the history and decide again: %w: %w",
			subject, rv, ErrConflict, err)
	}
	if err != nil {
		return helmx.Record{}, fmt.Errorf("marking %s failed: writing %s %q: %w", subject, kind, target.RecordName, err)
	}
	return out, nil
}
