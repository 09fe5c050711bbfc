package autorecover

import (
	"context"
	"errors"
	"fmt"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/kube"
)

// ErrBlocked: the release's latest revision is pending and may not be
// recovered now (a revision stock helm left pending, younger than
// Policy.LegacyAfter). The error is a *BlockedError with the decision.
var ErrBlocked = errors.New("release is pending and may not be recovered now")

// BlockedError is Run's refusal to write a release that is pending and not
// recoverable yet. errors.Is(err, ErrBlocked) holds for it.
type BlockedError struct {
	Decision Decision
}

func (e *BlockedError) Error() string { return e.Decision.Reason }

// Unwrap makes errors.Is(err, ErrBlocked) true.
func (e *BlockedError) Unwrap() error { return ErrBlocked }

// RunConfig describes one guarded helm operation for Run: the lock request
// (release, namespace, operation, lease, waiting) and the recovery policy.
type RunConfig struct {
	Lock   LockRequest
	Policy Policy
}

// Run runs one helm operation under the release's lock, in the manner of
// client-go's leaderelection.RunOrDie: it takes the lock (or waits for it,
// LockRequest.Wait), recovers what a dead holder left (Lock.Recover, and
// with StrategyRollback a rollback to the last deployed revision), keeps
// the lock renewed, runs op with a helm action configuration whose every
// write goes through the lock's fence (Lock.ActionConfig), and releases the
// lock, success or failure.
//
// op's context is cancelled when the lock is lost (taken over, not renewed
// in time, or held past LockRequest.MaxHold); context.Cause tells which,
// wrapping ErrLost or ErrMaxHold, and Run returns an error wrapping it.
// Helm's install and upgrade mark their revision failed when their context
// ends. Errors: a *LockedError when a live holder refused the lock; a
// *BlockedError when the release is pending and not recoverable yet; the
// recovery's own errors; op's error.
func (c *Client) Run(ctx context.Context, rc RunConfig, op func(ctx context.Context, cfg *action.Configuration) error) (err error) {
	if op == nil {
		return errors.New("autorecover: run: no operation given")
	}
	l, err := c.Acquire(ctx, rc.Lock)
	if err != nil {
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if rerr := l.Release(rctx); rerr != nil && err == nil {
			err = fmt.Errorf("autorecover: releasing the lock of release %q in namespace %q: %w", l.release, l.namespace, rerr)
		}
	}()
	opCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	go l.Keep(opCtx, stop)

	cfg, err := l.ActionConfig()
	if err != nil {
		return err
	}
	out, err := l.recover(opCtx, rc.Policy, func(release string, revision int) error {
		rb := action.NewRollback(cfg)
		rb.Version = revision
		rb.Timeout = rc.Lock.Timeout
		if rb.Timeout <= 0 {
			rb.Timeout = 5 * time.Minute
		}
		rb.WaitStrategy = kube.HookOnlyStrategy
		return rb.Run(release)
	})
	if err != nil {
		return lostCause(opCtx, err)
	}
	if d := decisionOf(out); d.Verdict == VerdictBlocked {
		return &BlockedError{Decision: d}
	}
	// Record the revision op is about to write, so that whoever finds it
	// abandoned recovers it at once.
	rev, err := l.held.NextRevision(opCtx, rc.Lock.Operation, out.Latest)
	if err != nil {
		return lostCause(opCtx, fmt.Errorf("autorecover: %w", err))
	}
	if err := l.SetRevision(opCtx, rev); err != nil {
		return lostCause(opCtx, fmt.Errorf("autorecover: release %q in namespace %q: %w", l.release, l.namespace, err))
	}
	err = op(opCtx, cfg)
	// What only the abandoned revision rendered goes once op's revision
	// says it is not wanted (see Lock.Recover); nothing on the happy path.
	if ferr := l.finishRecovery(context.WithoutCancel(opCtx)); ferr != nil && err == nil {
		err = ferr
	}
	return lostCause(opCtx, err)
}

// lostCause adds the lost-lock cause to err when the lock was lost.
func lostCause(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil && (errors.Is(cause, ErrLost) || errors.Is(cause, ErrMaxHold)) && !errors.Is(err, cause) {
		return fmt.Errorf("%w (the operation stopped: %w)", cause, err)
	}
	return err
}
