package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/helm-autorecover/helm-autorecover/internal/events"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// Reconciler judges one release (the request's name is the release's, its
// namespace the release's) and recovers it through the one recovery core
// when recovery.Decide allows it, exactly as `helm-autorecover recover`
// does: under the release's own lock, with conditional writes, a history
// description naming the controller's session, and an Event.
type Reconciler struct {
	Conn *protocol.Conn
	// Cache reads the metadata of watched objects (namespaces, records).
	Cache   client.Reader
	Options Options

	metrics *metrics
	kind    string
	// sql: helm's records are rows of its sql database (Options.HelmDriver),
	// read through Conn rather than the cache.
	sql bool
	// Clock times the backoff of failing recoveries; nil is the real clock.
	Clock clock.PassiveClock

	// backoff holds, per release (namespace/name), the failures in a row
	// and the earliest next attempt: taking and releasing a lock rewrites
	// the watched record, and the events that follow must not undo the
	// backoff of a recovery that keeps failing.
	mu      sync.Mutex
	backoff map[string]retry
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	ns, rel := req.Namespace, req.Name
	log := slog.With(slog.String("release", rel), slog.String("namespace", ns))
	key := ns + "/" + rel
	if wait := r.notYet(key); wait > 0 {
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	res, err := r.reconcile(ctx, log, key, ns, rel)
	if err != nil {
		// Reported, and retried with backoff: 1 s doubling to 5 minutes.
		wait := r.failed(key)
		log.Error("recovery failed; retrying with backoff", slog.Any("error", err), slog.Duration("again_in", wait))
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	r.succeeded(key)
	return res, nil
}

func (r *Reconciler) reconcile(ctx context.Context, log *slog.Logger, key, ns, rel string) (reconcile.Result, error) {
	switch skip, err := r.skip(ctx, ns, rel); {
	case err != nil:
		r.metrics.errors.WithLabelValues("read").Inc()
		return reconcile.Result{}, err
	case skip != "":
		r.metrics.observe(key, "", 0)
		log.Debug("not judged", slog.String("why", skip))
		return reconcile.Result{}, nil
	}
	_, stores, err := r.Conn.Stores(ctx, ns, r.Options.LockBackend)
	if err != nil {
		r.metrics.errors.WithLabelValues("read").Inc()
		return reconcile.Result{}, fmt.Errorf("release %q in namespace %q: %w", rel, ns, err)
	}
	st, err := r.Conn.Inspect(ctx, ns, rel, stores)
	if err != nil {
		r.countError(err)
		return reconcile.Result{}, err
	}
	if st.State == protocol.Live || st.Confirming {
		// A live holder, or one whose expiry this controller has not yet
		// confirmed on its own clock: nothing to decide before then (the
		// history is not read).
		r.metrics.observe(key, "live", len(st.Waiters))
		step := Next(Observation{Decision: recovery.Decision{Verdict: recovery.Blocked}, Live: true, LockedTill: st.LockedTill, Margin: protocol.TakeoverMargin, NowEarliest: st.Now.Earliest, ConfirmIn: st.ConfirmIn})
		log.Debug("held by a live holder", slog.String("holder", st.HolderIdentity), slog.Duration("again_in", step.After))
		return reconcile.Result{RequeueAfter: step.After}, nil
	}
	// Decide on the lock as read, with no writer: nothing is written unless
	// the release is recoverable.
	plan, err := r.Conn.Recover(ctx, protocol.Procedure{Release: rel, Namespace: ns, Lock: recovery.ObservedLock(st), Policy: r.Options.Policy, Next: protocol.OpRecover})
	if err != nil {
		r.countError(err)
		return reconcile.Result{}, err
	}
	live := st.State == protocol.Live
	r.metrics.observe(key, stateOf(plan.Decision, st), len(st.Waiters))
	step := Next(Observation{
		Decision: plan.Decision, Live: live, LockedTill: st.LockedTill,
		Margin: protocol.TakeoverMargin, NowEarliest: st.Now.Earliest, ConfirmIn: st.ConfirmIn,
	})
	if holder := st.HolderIdentity; holder != "" {
		// "session" names the controller's own session once it holds the
		// lock; the abandoned one is the holder.
		log = log.With(slog.String("holder", holder))
	}
	if !step.Recover {
		if step.After > 0 {
			log.Debug("not recoverable yet", slog.Duration("again_in", step.After), slog.String("why", step.Why))
		}
		return reconcile.Result{RequeueAfter: step.After}, nil
	}
	return r.recover(ctx, log, key, ns, rel, plan.Decision.Verdict == recovery.RecoverThenRollback)
}

// recover takes the release's lock and recovers it, as the recover command.
//
// Every write of the recovery (converge's, marking revisions failed, helm's
// rollback) is judged by the write fence of this release's own lock: made
// only while that lock is valid, bounded by its renew deadline, and never
// after an earlier one was cut off. Other releases recovered at the same
// time have fences of their own.
func (r *Reconciler) recover(ctx context.Context, log *slog.Logger, key, ns, rel string, rollsBack bool) (reconcile.Result, error) {
	req := protocol.Request{
		Release:   rel,
		Namespace: ns,
		Operation: protocol.OpRecover,
		Backend:   r.Options.LockBackend,
		Who:       r.Options.Who,
		// A recovery (and a rollback's hooks) never holds a release for
		// longer than this; its lock's bound for earlier clients follows.
		MaxHold: maxHold,
	}
	held, err := r.Conn.Take(ctx, req)
	if le, ok := protocol.IsLocked(err); ok {
		// Someone took the lock first (a client, or another replica during
		// a leader change): judge again once it may have expired, or in a
		// few seconds when waiters queued ahead take it.
		wait := max(le.Left, minRequeue)
		if le.State != protocol.Live {
			wait = waitersRequeue
		}
		log.Info("the release's lock was taken first; looking again later", slog.String("taken_by", le.HolderIdentity), slog.Duration("again_in", wait))
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	if err != nil {
		r.countError(err)
		return reconcile.Result{}, err
	}
	log = log.With(slog.String("session", held.Session()))
	release := held.Hold(ctx)
	defer func() {
		if err := release(); err != nil {
			log.Warn("releasing the lock failed; it expires by itself", slog.Any("error", err))
		}
	}()

	// The release (deferred above) first drains the lock's fence: no write
	// let through may still land once the lock is free (one that got no
	// answer, a reset connection, may commit until its deadline).
	// This lock's own fence: the recovery's own writes carry it in their
	// context (the connection's clients are helmx.OwnWrites), helm's
	// rollback builds its clients through it.
	fence := held.Fence()
	fenced := helmx.WithFence(ctx, fence)
	var rollback func(string, int) error
	if rollsBack && r.Options.Rollback != nil {
		rollback = func(release string, revision int) error {
			return r.Options.Rollback(fenced, held, release, revision)
		}
	}
	// Kinds installed since the last recovery (a CRD) must be known to
	// undo what the abandoned revision applied.
	r.Conn.RefreshDiscovery()
	out, err := held.Recover(fenced, protocol.Procedure{
		Policy:     r.Options.Policy,
		Next:       protocol.OpRecover,
		Rollback:   rollback,
		Log:        logWriter{log},
		DeleteData: r.Options.DeleteData,
	})
	if len(out.Marked) > 0 {
		r.recorded(ctx, log, out, held.Session())
	}
	if errors.Is(err, protocol.ErrRollback) {
		// Recovered (marked failed, set back to the last deployed state),
		// and said so in the Event; helm's rollback failed and is not
		// retried: the release is no longer pending.
		r.metrics.errors.WithLabelValues("rollback").Inc()
		r.metrics.observe(key, "", 0)
		log.Warn("recovered, but helm's rollback failed; not retried", slog.Any("error", err))
		return reconcile.Result{}, nil
	}
	if err != nil {
		r.countError(err)
		return reconcile.Result{}, fmt.Errorf("release %q in namespace %q: %w", rel, ns, err)
	}
	if len(out.Marked) == 0 {
		// Judged again under the lock: no longer recoverable (a holder
		// came back, another client recovered it first).
		step := Next(Observation{Decision: out.Decision})
		log.Info("not recovered", slog.String("why", out.Decision.Reason))
		return reconcile.Result{RequeueAfter: step.After}, nil
	}
	r.metrics.observe(key, "", 0)
	return reconcile.Result{}, nil
}

// recorded logs, counts and reports (an Event) a recovery.
func (r *Reconciler) recorded(ctx context.Context, log *slog.Logger, out protocol.Outcome, session string) {
	dec := out.Decision
	reason, became := "legacy", time.Time{}
	if a := dec.Target.Lock; a != nil {
		reason, became = "expired-lock", a.LockedTill
		if !a.AcquiredAt.IsZero() && a.LockedTill.After(a.AcquiredAt) {
			r.metrics.held.Observe(a.LockedTill.Sub(a.AcquiredAt).Seconds())
		}
	} else if !dec.Target.PendingSince.IsZero() {
		became = dec.Target.PendingSince.Add(r.Options.Policy.LegacyAfter)
	}
	// What was done, not what was configured: a rollback recovery kept
	// from rolling back (or whose rollback failed) only marked failed.
	strategy := string(recovery.StrategyFail)
	if out.RolledBack {
		strategy = string(recovery.StrategyRollback)
	}
	r.metrics.recoveries.WithLabelValues(reason, strategy).Inc()
	// The server time of the recovery is known within bounds (the Date
	// header's second, the request's round trip): their midpoint.
	at := out.At
	if !out.AtEarliest.IsZero() {
		at = out.AtEarliest.Add(out.At.Sub(out.AtEarliest) / 2)
	}
	if !became.IsZero() && at.After(became) {
		r.metrics.delay.Observe(at.Sub(became).Seconds())
	}
	revs := make([]string, 0, len(out.Marked))
	for _, m := range out.Marked {
		revs = append(revs, fmt.Sprintf("%d", m.Release.Revision))
	}
	log.Info("recovered", slog.String("reason", reason), slog.String("marked_failed", strings.Join(revs, ",")), slog.Bool("rolled_back", out.RolledBack), slog.String("why", out.Said()))
	note := fmt.Sprintf("Recovered by the helm-autorecover controller %s (session %s): %s", r.Options.Who, session, out.Said())
	if err := events.Emit(ctx, r.Conn.Client(), events.Event{
		Regarding: out.Marked[0].Record.Ref(), Type: corev1.EventTypeNormal, Reason: events.ReasonRecovered,
		Action: "Recover", Note: note, At: out.At, Instance: r.Options.Who,
	}); err != nil {
		log.Warn("recording the Event failed", slog.Any("error", err))
	}
}

// skip says why a release is not judged ("" when it is): no pending record
// of it is cached (it left pending: every helm operation ends so, and
// nothing is read for it), it or its namespace opted out, or its namespace
// is gone or being deleted.
func (r *Reconciler) skip(ctx context.Context, ns, rel string) (string, error) {
	items, err := r.pendingRecords(ctx, ns, rel)
	if err != nil {
		return "", err
	}
	if len(items) == 0 {
		return "no pending record", nil
	}
	for _, it := range items {
		// A label set with helm's --labels is copied to every revision; an
		// annotation set by hand is on that record only.
		if it.Labels[AnnotationIgnore] == "true" || it.Annotations[AnnotationIgnore] == "true" {
			return "opted out: " + AnnotationIgnore, nil
		}
	}
	// Read live, not cached: a controller limited to some namespaces may
	// not list namespaces, and only releases being judged are read.
	switch nsObj, err := r.Conn.Client().CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); {
	case err == nil:
		if nsObj.Annotations[AnnotationIgnore] == "true" {
			return "namespace opted out: " + AnnotationIgnore, nil
		}
		if nsObj.DeletionTimestamp != nil || nsObj.Status.Phase == corev1.NamespaceTerminating {
			return "namespace being deleted", nil
		}
	case apierrors.IsNotFound(err):
		return "namespace gone", nil
	case apierrors.IsForbidden(err):
		// No right to read namespaces (per-namespace Roles): release
		// annotations still opt out.
	default:
		return "", err
	}
	return "", nil
}

// pendingRecords lists the metadata of the release's pending records. The
// cache holds the pending records only; the events that bring a release
// here come from it, so it has seen what they announce. With helm's sql
// driver, the database is asked whether the release has a pending row
// (reading no body); a row carries no label but helm's own, so only the
// namespace's annotation opts out there.
func (r *Reconciler) pendingRecords(ctx context.Context, ns, rel string) ([]metav1.ObjectMeta, error) {
	var out []metav1.ObjectMeta
	if r.sql {
		pending, err := r.Conn.PendingSQL(ctx, []string{ns}, pendingStatuses)
		if err != nil {
			return nil, err
		}
		if slices.Contains(pending, types.NamespacedName{Namespace: ns, Name: rel}) {
			out = append(out, metav1.ObjectMeta{Namespace: ns, Name: rel})
		}
		return out, nil
	}
	list := &metav1.PartialObjectMetadataList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: r.kind + "List"}}
	if err := r.Cache.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{helmx.LabelName: rel}); err != nil {
		return nil, err
	}
	for _, it := range list.Items {
		out = append(out, it.ObjectMeta)
	}
	return out, nil
}

func (r *Reconciler) countError(err error) {
	kind := "recover"
	switch {
	case apierrors.IsForbidden(err):
		kind = "forbidden"
	case apierrors.IsConflict(err):
		kind = "conflict"
	}
	r.metrics.errors.WithLabelValues(kind).Inc()
}

// stateOf names the lock state of a pending release for the metrics.
func stateOf(d recovery.Decision, st *protocol.Status) string {
	switch {
	case d.Verdict == recovery.Proceed || d.Verdict == recovery.NoRelease:
		return ""
	case st.State == protocol.Live:
		return "live"
	case st.State == protocol.Expired:
		return "expired"
	case d.Target.Lock == nil:
		return "legacy-pending"
	}
	return "none"
}

// logWriter turns recovery's progress lines into log records.
type logWriter struct{ log *slog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimSpace(string(p)), "\n") {
		if line != "" {
			w.log.Info(strings.TrimPrefix(line, "helm-autorecover: "))
		}
	}
	return len(p), nil
}

var _ io.Writer = logWriter{}

// Backoff of a release whose recovery fails.
const (
	backoffFirst = time.Second
	backoffMax   = 5 * time.Minute
	// waitersRequeue is how soon a release whose lock waiters took first
	// is looked at again.
	waitersRequeue = 5 * time.Second
	// maxHold bounds how long the controller holds a release's lock.
	maxHold = 10 * time.Minute
)

type retry struct {
	failures int
	next     time.Time
}

// notYet is how long until the next attempt at a release whose recovery
// failed; 0 when it may be attempted now.
func (r *Reconciler) notYet(key string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.backoff[key]
	if !ok {
		return 0
	}
	return max(0, b.next.Sub(r.now()))
}

// failed counts a failure and returns the wait before the next attempt.
func (r *Reconciler) failed(key string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.backoff == nil {
		r.backoff = map[string]retry{}
	}
	b := r.backoff[key]
	b.failures++
	wait := backoffFirst << min(b.failures-1, 20)
	wait = min(wait, backoffMax)
	b.next = r.now().Add(wait)
	r.backoff[key] = b
	return wait
}

func (r *Reconciler) now() time.Time {
	if r.Clock == nil {
		return time.Now()
	}
	return r.Clock.Now()
}

func (r *Reconciler) succeeded(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.backoff, key)
}
