package autorecover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/kube"

	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
)

// ErrBlocked: the release's latest revision is pending and may not be
// recovered now (a revision stock helm left pending, younger than
// Policy.LegacyAfter). The error is a *BlockedError with the decision.
var ErrBlocked = protocol.ErrBlocked

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
// ends. An install or upgrade is also stopped when a client waiting for the
// lock asks (LockRequest.Preempt) and no hook of the chart is running: op's
// context is then cancelled with a *PreemptedError as its cause, the
// revision is marked failed naming that client, and Run returns an error
// wrapping ErrPreempted. Errors: a *LockedError when a live holder refused the lock; a
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
	// Built once, when the rollback or the operation first needs it: after
	// Run has started renewing the lock (with the sql driver it opens
	// helm's driver, a connection and helm's migrations).
	config := sync.OnceValues(l.ActionConfig)
	opCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var opErr, releaseErr error
	err = l.held.Run(opCtx, protocol.Guarded{
		Procedure: protocol.Procedure{
			Policy:     rc.Policy.internal(),
			Next:       rc.Lock.Operation,
			DeleteData: rc.Policy.DeleteData,
			Rollback: func(release string, revision int) error {
				cfg, err := config()
				if err != nil {
					return err
				}
				rb := action.NewRollback(cfg)
				rb.Version = revision
				rb.Timeout = rc.Lock.Timeout
				if rb.Timeout <= 0 {
					rb.Timeout = 5 * time.Minute
				}
				rb.WaitStrategy = kube.HookOnlyStrategy
				return rb.Run(release)
			},
		},
		Decided: func(out protocol.Outcome) error {
			if d := decisionOf(out); d.Verdict == VerdictBlocked {
				return &BlockedError{Decision: d}
			}
			return nil
		},
		Op: func(ctx context.Context) error {
			cfg, err := config()
			if err != nil {
				return err
			}
			opErr = op(ctx, cfg)
			return opErr
		},
		OnLost:      stop,
		Released:    func(rerr error) { releaseErr = rerr },
		Log:         slogWriter{},
		Preemptible: true,
	})
	var blocked *BlockedError
	switch {
	case err == nil && releaseErr != nil:
		err = fmt.Errorf("autorecover: releasing the lock of release %q in namespace %q: %w", l.release, l.namespace, releaseErr)
	case err != nil && err != opErr && !errors.As(err, &blocked): //nolint:errorlint // the operation's own error is returned as it is
		err = fmt.Errorf("autorecover: release %q in namespace %q: %w", l.release, l.namespace, err)
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

// slogWriter logs each line written to it with log/slog: what became of
// the objects recovery left for after the operation (Lock.Recover and
// Release log the same way).
type slogWriter struct{}

func (slogWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimSpace(string(p)), "\n") {
		switch {
		case line == "":
		case strings.Contains(line, "warning:"):
			slog.Warn(line)
		default:
			slog.Info(line)
		}
	}
	return len(p), nil
}
