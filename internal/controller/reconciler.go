package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/helm-autorecover/helm-autorecover/internal/events"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
	"github.com/helm-autorecover/helm-autorecover/internal/version"
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
	// rollbacks serializes recoveries that roll back with helm's action:
	// the write fence on helm's clients guards one release at a time.
	rollbacks sync.Mutex
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	ns, rel := req.Namespace, req.Name
	log := slog.With(slog.String("release", rel), slog.String("namespace", ns))
	key := ns + "/" + rel

	if ignored, err := r.ignored(ctx, ns, rel); err != nil {
		r.metrics.errors.WithLabelValues("read").Inc()
		return reconcile.Result{}, err
	} else if ignored {
		r.metrics.observe(key, "", 0)
		log.Debug("opted out", slog.String("annotation", AnnotationIgnore))
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
	// Decide on the lock as read, with no writer: nothing is written unless
	// the release is recoverable.
	plan, err := r.Conn.Recover(ctx, protocol.Procedure{Release: rel, Namespace: ns, Lock: recovery.ObservedLock(st), Policy: r.Options.Policy, Next: lock.OpRecover})
	if err != nil {
		r.countError(err)
		return reconcile.Result{}, err
	}
	live := st.State == lock.Live
	r.metrics.observe(key, stateOf(plan.Decision, st), len(st.Waiters))
	step := Next(Observation{
		Decision: plan.Decision, Live: live, LockedTill: st.LockedTill,
		Margin: lock.TakeoverMargin, NowEarliest: st.Now.Earliest,
	})
	if holder := st.HolderIdentity; holder != "" {
		log = log.With(slog.String("session", holder))
	}
	if !step.Recover {
		if step.After > 0 {
			log.Debug("not recoverable yet", slog.Duration("again_in", step.After), slog.String("why", step.Why))
		}
		return reconcile.Result{RequeueAfter: step.After}, nil
	}
	return r.recover(ctx, log, key, ns, rel, stores)
}

// recover takes the release's lock and recovers it, as the recover command.
func (r *Reconciler) recover(ctx context.Context, log *slog.Logger, key, ns, rel string, stores []*lock.Backend) (reconcile.Result, error) {
	req := lock.Request{
		Release:     rel,
		Namespace:   ns,
		Operation:   lock.OpRecover,
		Session:     lock.NewSession(),
		Who:         r.Options.Who,
		ToolVersion: version.Version,
	}
	held, err := r.Conn.Acquire(ctx, req, stores, false, nil)
	if le, ok := protocol.IsLocked(err); ok {
		// Someone took the lock first (a client, or another replica during
		// a leader change): judge again once it may have expired.
		wait := max(le.Left, minRequeue)
		log.Info("the release's lock was taken first; looking again later", slog.String("holder", le.HolderIdentity), slog.Duration("again_in", wait))
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	if err != nil {
		r.countError(err)
		return reconcile.Result{}, err
	}
	log = log.With(slog.String("session", held.Session()))
	keepCtx, stopKeep := context.WithCancel(ctx)
	defer stopKeep()
	go held.Keep(keepCtx, func(error) {})
	defer func() {
		stopKeep()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := held.Release(rctx); err != nil && !errors.Is(err, lock.ErrLost) {
			log.Warn("releasing the lock failed; it expires by itself", slog.Any("error", err))
		}
	}()

	var rollback func(string, int) error
	if r.Options.Policy.Strategy == recovery.StrategyRollback && r.Options.Rollback != nil {
		r.rollbacks.Lock()
		defer r.rollbacks.Unlock()
		// helm's rollback writes through the fence, carrying this lock, as
		// the CLI's (helmx.DefaultWriteFence on helm's clients).
		recs, _ := r.Conn.Records()
		defer helmx.DefaultWriteFence.Guard(helmx.GuardedWrites{Namespace: ns, Release: rel, Resource: recs.Resource(), Lock: held})()
		rollback = func(release string, revision int) error {
			return r.Options.Rollback(ctx, ns, release, revision)
		}
	}
	out, err := held.Recover(ctx, protocol.Procedure{
		Policy:     r.Options.Policy,
		Next:       lock.OpRecover,
		Rollback:   rollback,
		Log:        logWriter{log},
		DeleteData: r.Options.DeleteData,
	})
	if len(out.Marked) > 0 {
		r.recorded(ctx, log, out, held.Session())
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
	strategy := string(r.Options.Policy.Strategy)
	if strategy == "" {
		strategy = string(recovery.StrategyFail)
	}
	r.metrics.recoveries.WithLabelValues(reason, strategy).Inc()
	if !became.IsZero() && out.At.After(became) {
		r.metrics.delay.Observe(out.At.Sub(became).Seconds())
	}
	revs := make([]string, 0, len(out.Marked))
	for _, m := range out.Marked {
		revs = append(revs, fmt.Sprintf("%d", m.Release.Revision))
	}
	log.Info("recovered", slog.String("reason", reason), slog.String("marked_failed", strings.Join(revs, ",")), slog.Bool("rolled_back", out.RolledBack), slog.String("why", dec.Said(true)))
	note := fmt.Sprintf("Recovered by the helm-autorecover controller %s (session %s): %s", r.Options.Who, session, dec.Said(true))
	if err := events.Emit(ctx, r.Conn.Client(), events.Event{
		Regarding: out.Marked[0].Record.Ref(), Type: corev1.EventTypeNormal, Reason: events.ReasonRecovered,
		Action: "Recover", Note: note, At: out.At, Instance: r.Options.Who,
	}); err != nil {
		log.Warn("recording the Event failed", slog.Any("error", err))
	}
}

// ignored reports whether the release or its namespace opted out.
func (r *Reconciler) ignored(ctx context.Context, ns, rel string) (bool, error) {
	// Read live, not cached: a controller limited to some namespaces may
	// not list namespaces, and only releases being judged are read.
	switch nsObj, err := r.Conn.Client().CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); {
	case err == nil:
		if nsObj.Annotations[AnnotationIgnore] == "true" {
			return true, nil
		}
	case apierrors.IsNotFound(err):
		return true, nil // gone
	case apierrors.IsForbidden(err):
		// No right to read namespaces (per-namespace Roles): release
		// annotations still opt out.
	default:
		return false, err
	}
	list := &metav1.PartialObjectMetadataList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: r.kind + "List"}}
	if err := r.Cache.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{"name": rel}); err != nil {
		return false, err
	}
	for _, it := range list.Items {
		if it.Annotations[AnnotationIgnore] == "true" {
			return true, nil
		}
	}
	return false, nil
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
func stateOf(d recovery.Decision, st *lock.Status) string {
	switch {
	case d.Verdict == recovery.Proceed || d.Verdict == recovery.NoRelease:
		return ""
	case st.State == lock.Live:
		return "live"
	case st.State == lock.Expired:
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
