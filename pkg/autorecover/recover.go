package autorecover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// Strategy is what recovery does after marking an abandoned revision failed.
type Strategy string

const (
	// StrategyFail only marks the abandoned revision failed (the default).
	StrategyFail Strategy = "fail"
	// StrategyRollback asks, in addition, for a rollback to the last
	// deployed revision: the Decision then names it in RollbackTo and the
	// caller runs the rollback while it holds the lock.
	StrategyRollback Strategy = "rollback"
)

// DefaultLegacyAfter is the helm-autorecover CLI's default age, in server
// time, after which a pending revision that no lock covers (stock helm wrote
// it) counts as abandoned: an hour, twelve of helm's default --timeout,
// since helm applies its timeout to each hook and each wait, not to the
// operation (see docs/protocol.md).
const DefaultLegacyAfter = time.Hour

// Policy says how far recovery may go.
type Policy struct {
	// LegacyAfter is how long, in server time, a pending revision that no
	// lock record covers (stock helm wrote it, and may still be running it)
	// must have been pending before it counts as abandoned. Zero or negative
	// means never, which is the safe zero value; the CLI uses
	// DefaultLegacyAfter. A revision written under a lock that has expired is
	// abandoned at once, whatever this says.
	LegacyAfter time.Duration
	// Strategy is StrategyFail when empty.
	Strategy Strategy
	// DeleteData lets recovery delete PersistentVolumeClaims,
	// CustomResourceDefinitions and Namespaces that only the abandoned
	// revision created (the CLI's --recover-delete-data). The zero value
	// keeps them: deleting one destroys a volume's data, every custom
	// resource of the kind, or everything in the namespace.
	DeleteData bool
}

func (p Policy) internal() recovery.Policy {
	return recovery.Policy{Autorecover: true, LegacyAfter: p.LegacyAfter, Strategy: recovery.Strategy(p.Strategy)}
}

// Verdict is recovery's judgement of a release (the one recovery decides
// with).
type Verdict = recovery.Verdict

const (
	// VerdictNoRelease: the release has no stored revision.
	VerdictNoRelease = recovery.NoRelease
	// VerdictProceed: the latest revision is not pending; nothing to recover.
	VerdictProceed = recovery.Proceed
	// VerdictRecover: the pending revision is abandoned and is (or, under
	// DryRun, would be) marked failed.
	VerdictRecover = recovery.Recover
	// VerdictRecoverThenRollback: as VerdictRecover, and the caller should
	// then roll back to Decision.RollbackTo (Policy.Strategy rollback).
	VerdictRecoverThenRollback = recovery.RecoverThenRollback
	// VerdictBlocked: the latest revision is pending and may not be
	// recovered now: a live lock protects it, or it is a legacy revision
	// younger than Policy.LegacyAfter (see RetryAfter) or whose hook Job or
	// Pod still runs, or legacy recovery is off. Do not write the release.
	VerdictBlocked = recovery.Blocked
)

// Decision is the outcome of Recover.
type Decision struct {
	Verdict Verdict
	// Reason is one sentence for people: release, namespace, revision,
	// status and, where known, who abandoned it and when.
	Reason string
	// Revision and Status describe the latest revision when it is pending
	// (0 and "" otherwise); PendingSince is when it was last written, in
	// server time.
	Revision     int
	Status       string
	PendingSince time.Time
	// AbandonedBy is the expired lock record the pending revision was
	// written under, when recovery attributes it to one; nil for a revision
	// no lock of ours covers.
	AbandonedBy *Holder
	// Stray lists older pending revisions (newest first) marked failed
	// together with Revision.
	Stray []int
	// RollbackTo is the revision to roll back to under
	// VerdictRecoverThenRollback.
	RollbackTo int
	// RetryAfter is, under VerdictBlocked, the server-time wait until a
	// legacy pending revision becomes recoverable, or, while a hook of it
	// still runs (its helm may still be at work: see the Reason), until
	// it is looked at again; 0 when waiting will not help.
	RetryAfter time.Duration
	// Marked lists the revisions this call marked failed; empty under
	// DryRun.
	Marked []int
}

func decisionFrom(d recovery.Decision) Decision {
	out := Decision{
		Verdict:      d.Verdict,
		Reason:       d.Reason,
		Revision:     d.Target.Release.Revision,
		Status:       string(d.Target.Release.Status),
		PendingSince: d.Target.PendingSince,
		RollbackTo:   d.RollbackTo,
		RetryAfter:   d.RetryAfter,
	}
	if l := d.Target.Lock; l != nil {
		out.AbandonedBy = &Holder{
			Session:    l.Session,
			Who:        l.Who,
			Operation:  Operation(l.Operation),
			Revision:   l.Revision,
			AcquiredAt: l.AcquiredAt,
			LockedTill: l.LockedTill,
		}
	}
	for _, s := range d.Stray {
		out.Stray = append(out.Stray, s.Release.Revision)
	}
	return out
}

// revisionNone is recorded as the revision of a session that writes no
// revision of its own (Client.Recover): a pending revision is then never
// attributed to it, so if it dies, nothing written by anyone else during
// its tenure is recovered early.
const revisionNone = -1

// RecoverRequest names the release Client.Recover recovers and how.
type RecoverRequest struct {
	Release   string
	Namespace string
	Policy    Policy
	// DryRun decides and reports without taking the lock or writing
	// anything, judging the lock as it is now.
	DryRun bool
	// Wait is how long to wait for the release's lock when someone holds it
	// (see LockRequest.Wait); 0 fails at once with a *LockedError.
	Wait time.Duration
}

// Recover recovers a release whose latest revision was abandoned pending: it
// takes the release's lock (writing no revision of its own), runs the same
// recovery as the helm-autorecover CLI (it undoes what the abandoned
// revision applied, bringing the release's objects back to the last
// deployed revision, and marks the abandoned revision, and older pending
// ones, failed with a description that says who abandoned what and when),
// and releases the lock. Every write is conditional on the resourceVersion
// read; when a concurrent writer gets in between, the release is read and
// judged again. No revision is deleted.
//
// When someone holds the lock, Recover returns the decision a dry run makes
// together with a *LockedError.
func (c *Client) Recover(ctx context.Context, req RecoverRequest) (Decision, error) {
	if req.DryRun {
		return c.plan(ctx, req.Namespace, req.Release, req.Policy)
	}
	l, err := c.Acquire(ctx, LockRequest{
		Release:   req.Release,
		Namespace: req.Namespace,
		Operation: OpRecover,
		Revision:  revisionNone,
		Wait:      req.Wait,
	})
	if err != nil {
		if errors.Is(err, ErrLocked) {
			if d, derr := c.plan(ctx, req.Namespace, req.Release, req.Policy); derr == nil {
				return d, err
			}
		}
		return Decision{}, err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = l.Release(rctx)
	}()
	return l.Recover(ctx, req.Policy)
}

// Recover recovers what the previous holder abandoned, under this lock: see
// Client.Recover. Call it right after Acquire, before the operation reads
// the release; a revision left pending by an expired holder is then
// recovered at once. With the lock's operation install or upgrade (or
// recover), what the abandoned revision applied is undone first, since
// helm diffs against the last deployed revision; rollback and uninstall
// diff against the abandoned revision themselves.
//
// Before an install or upgrade, the objects only the abandoned revision
// rendered are not deleted yet: the operation may render them again (a
// PersistentVolumeClaim, a LoadBalancer Service) and then adopts them.
// Release removes, once the operation has written its revision, those
// that revision does not render (as helm removes what an upgrade drops:
// never one annotated helm.sh/resource-policy: keep, never a
// PersistentVolumeClaim, CustomResourceDefinition or Namespace unless
// Policy.DeleteData). If the operation wrote no revision, they are left
// and a warning naming them is logged (log/slog).
func (l *Lock) Recover(ctx context.Context, p Policy) (Decision, error) {
	out, err := l.recover(ctx, p, nil)
	return decisionOf(out), err
}

func (l *Lock) recover(ctx context.Context, p Policy, rollback func(string, int) error) (protocol.Outcome, error) {
	out, err := l.held.Recover(ctx, protocol.Procedure{
		Policy:     p.internal(),
		Next:       l.op,
		Rollback:   rollback,
		DeleteData: p.DeleteData,
	})
	if err != nil {
		return out, fmt.Errorf("autorecover: %w", err)
	}
	l.after.set(out.Converged.Deferred)
	return out, nil
}

// afterRecovery holds the objects a recovery left for after the operation
// it precedes (protocol.Outcome.Converged.Deferred).
type afterRecovery struct {
	mu       sync.Mutex
	deferred *recovery.Deferred
}

func (a *afterRecovery) set(d *recovery.Deferred) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.deferred = d
}

// take returns what is left to do, once.
func (a *afterRecovery) take() *recovery.Deferred {
	a.mu.Lock()
	defer a.mu.Unlock()
	d := a.deferred
	a.deferred = nil
	return d
}

// finishRecovery removes the objects Recover left for after the operation
// that its revision does not render (protocol.Conn.RemoveDeferred), under
// this lock; nothing on the happy path. It returns the error: ErrLost
// (wrapped) when the lock was lost first; a failure to remove, or no
// revision written after the abandoned one, is logged with log/slog (the
// operation and its revision stand).
func (l *Lock) finishRecovery(ctx context.Context) error {
	d := l.after.take()
	if d.Empty() {
		return nil
	}
	var log strings.Builder
	_, err := l.c.conn.RemoveDeferred(ctx, l.held, d, &log)
	switch {
	case err == nil:
		if log.Len() > 0 {
			slog.Info(strings.TrimSpace(log.String()), slog.String("release", d.Release), slog.String("namespace", d.Namespace))
		}
		return nil
	case errors.Is(err, ErrLost):
		return fmt.Errorf("autorecover: %w", err)
	}
	slog.Warn("autorecover: objects only the abandoned revision rendered were left in place", slog.String("release", d.Release), slog.String("namespace", d.Namespace), slog.Any("error", err))
	return nil
}

func decisionOf(out protocol.Outcome) Decision {
	d := decisionFrom(out.Decision)
	for _, m := range out.Marked {
		d.Marked = append(d.Marked, m.Release.Revision)
	}
	return d
}

// plan judges the lock as a dry run sees it: what a client taking it now
// would find, and decides with no writer.
func (c *Client) plan(ctx context.Context, namespace, release string, p Policy) (Decision, error) {
	if err := protocol.ValidateReleaseName(release); err != nil {
		return Decision{}, fmt.Errorf("autorecover: recover release in namespace %q: %w", namespace, err)
	}
	st, err := c.inspectLock(ctx, namespace, release)
	if err != nil {
		return Decision{}, err
	}
	out, err := c.conn.Recover(ctx, protocol.Procedure{
		Release: release, Namespace: namespace,
		Lock: recovery.ObservedLock(st), Policy: p.internal(), Next: protocol.OpRecover,
	})
	if err != nil {
		return Decision{}, fmt.Errorf("autorecover: %w", err)
	}
	return decisionOf(out), nil
}
