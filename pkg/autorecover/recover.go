package autorecover

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
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
// it) counts as abandoned.
const DefaultLegacyAfter = 15 * time.Minute

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
	// DryRun decides and reports without taking the lock or writing
	// anything.
	DryRun bool
	// LockWait is how long Client.Recover waits for the release's lock when
	// someone holds it (see LockRequest.Wait); 0 fails at once with a
	// *LockedError.
	LockWait time.Duration
}

// Verdict is recovery's judgement of a release.
type Verdict string

const (
	// VerdictNoRelease: the release has no stored revision.
	VerdictNoRelease Verdict = "no-release"
	// VerdictProceed: the latest revision is not pending; nothing to recover.
	VerdictProceed Verdict = "proceed"
	// VerdictRecover: the pending revision is abandoned and is (or, under
	// DryRun, would be) marked failed.
	VerdictRecover Verdict = "recover"
	// VerdictRecoverThenRollback: as VerdictRecover, and the caller should
	// then roll back to Decision.RollbackTo (Policy.Strategy rollback).
	VerdictRecoverThenRollback Verdict = "recover-then-rollback"
	// VerdictBlocked: the latest revision is pending and may not be
	// recovered now: a live lock protects it, or it is a legacy revision
	// younger than Policy.LegacyAfter (see RetryAfter), or legacy recovery is
	// off. Do not write the release.
	VerdictBlocked Verdict = "blocked"
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
	// legacy pending revision becomes recoverable; 0 when waiting will not
	// help.
	RetryAfter time.Duration
	// Marked lists the revisions this call marked failed; empty under
	// DryRun.
	Marked []int
}

func verdictFrom(v recovery.Verdict) Verdict {
	switch v {
	case recovery.NoRelease:
		return VerdictNoRelease
	case recovery.Proceed:
		return VerdictProceed
	case recovery.Recover:
		return VerdictRecover
	case recovery.RecoverThenRollback:
		return VerdictRecoverThenRollback
	case recovery.Blocked:
		return VerdictBlocked
	}
	return VerdictBlocked
}

func decisionFrom(d recovery.Decision) Decision {
	out := Decision{
		Verdict:      verdictFrom(d.Verdict),
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

// Recover recovers a release whose latest revision was abandoned pending: it
// takes the release's lock (as operation upgrade, writing no revision of its
// own), decides as the helm-autorecover CLI does, marks the abandoned
// revision (and older pending ones) failed with a description that says who
// abandoned what and when, and releases the lock. Every write is conditional
// on the resourceVersion read; when a concurrent writer gets in between, the
// release is read and judged again. Nothing is deleted.
//
// With Policy.DryRun it takes no lock and writes nothing: the Decision says
// what would be done, judging the lock as it is now.
//
// When someone holds the lock, Recover returns the Blocked decision together
// with a *LockedError.
func (c *Client) Recover(ctx context.Context, namespace, release string, p Policy) (Decision, error) {
	if p.DryRun {
		info, err := c.observedLock(ctx, namespace, release)
		if err != nil {
			return Decision{}, err
		}
		return c.recoverWith(ctx, namespace, release, info, p, nil)
	}
	l, err := c.Acquire(ctx, LockRequest{
		Release:   release,
		Namespace: namespace,
		Operation: OpRecover,
		Revision:  revisionNone,
		Wait:      p.LockWait,
	})
	if err != nil {
		if errors.Is(err, ErrLocked) {
			dry := p
			dry.DryRun = true
			if d, derr := c.Recover(ctx, namespace, release, dry); derr == nil {
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
	return l.Recover(ctx, p)
}

// Recover recovers what the previous holder abandoned, under this lock: see
// Client.Recover. Call it right after Acquire, before the operation reads
// the release; a revision left pending by an expired holder is then
// recovered at once. Policy.LockWait is ignored.
func (l *Lock) Recover(ctx context.Context, p Policy) (Decision, error) {
	info := recovery.LockInfo{State: recovery.LockNone}
	if prev, found := lock.Found(l.held.Previous, l.held.PreviousState); prev != nil {
		state := recovery.LockReleased
		if found == lock.Expired {
			state = recovery.LockExpired
		}
		info = lockInfo(state, prev)
	}
	var writer *Lock
	if !p.DryRun {
		writer = l
	}
	d, err := l.c.recoverWith(ctx, l.namespace, l.release, info, p, writer)
	if info.State == recovery.LockExpired && !p.DryRun {
		// Release hands the expired holder on when recovery failed.
		l.mu.Lock()
		l.recoverFailed = err != nil
		l.mu.Unlock()
	}
	return d, err
}

func lockInfo(state recovery.LockState, r *lock.Record) recovery.LockInfo {
	info := recovery.LockInfo{State: state}
	if r != nil {
		info.Session = r.Session
		info.Who = r.Who
		info.Operation = string(r.Operation)
		info.Revision = r.Revision
		info.AcquiredAt = r.AcquiredAt
		info.LockedTill = r.LockedTill
	}
	return info
}

// observedLock judges the lock as a dry run sees it: what a client taking
// it now would find.
func (c *Client) observedLock(ctx context.Context, namespace, release string) (recovery.LockInfo, error) {
	if err := lock.ValidateReleaseName(release); err != nil {
		return recovery.LockInfo{}, fmt.Errorf("autorecover: recover release in namespace %q: %w", namespace, err)
	}
	st, err := c.backend.Inspect(ctx, namespace, release)
	if err != nil {
		return recovery.LockInfo{}, fmt.Errorf("autorecover: %w", err)
	}
	rec := st.Record
	if st.RecordErr != nil {
		rec = nil
	}
	switch {
	case !st.Exists:
		return recovery.LockInfo{State: recovery.LockNone}, nil
	case st.State == lock.Live:
		if rec != nil && rec.Session != st.HolderIdentity {
			rec = nil
		}
		info := lockInfo(recovery.LockLive, rec)
		info.LockedTill = st.LockedTill
		return info, nil
	case st.State == lock.Expired:
		return lockInfo(recovery.LockExpired, rec), nil
	case rec != nil:
		if prev, found := lock.Found(rec, lock.Free); found == lock.Expired {
			return lockInfo(recovery.LockExpired, prev), nil
		}
		return lockInfo(recovery.LockReleased, rec), nil
	}
	return recovery.LockInfo{State: recovery.LockNone}, nil
}

func (c *Client) serverNow(ctx context.Context) (recovery.ServerTime, error) {
	b, err := c.ServerTime(ctx)
	if err != nil {
		return recovery.ServerTime{}, err
	}
	return recovery.ServerTime{Earliest: b.Earliest, Latest: b.Latest}, nil
}

// maxRecoverAttempts bounds how often recovery re-reads the release after a
// concurrent write; each conflict means another writer made progress.
const maxRecoverAttempts = 5

// recoverWith decides and, when writer is not nil, marks the abandoned
// revisions failed under writer's lock.
func (c *Client) recoverWith(ctx context.Context, namespace, release string, info recovery.LockInfo, p Policy, writer *Lock) (Decision, error) {
	subject := fmt.Sprintf("release %q in namespace %q", release, namespace)
	var marked []int
	var acted *Decision
	for range maxRecoverAttempts {
		hist, err := c.history(ctx, namespace, release)
		if err != nil {
			return Decision{}, err
		}
		now, err := c.serverNow(ctx)
		if err != nil {
			return Decision{}, fmt.Errorf("autorecover: %s: %w", subject, err)
		}
		dec := recovery.Decide(recovery.Input{
			Release:   release,
			Namespace: namespace,
			History:   hist,
			Lock:      info,
			Now:       now,
			Policy: recovery.Policy{
				Autorecover: true,
				LegacyAfter: p.LegacyAfter,
				Strategy:    recovery.Strategy(p.Strategy),
			},
		})
		out := decisionFrom(dec)
		recoverable := dec.Verdict == recovery.Recover || dec.Verdict == recovery.RecoverThenRollback
		if !recoverable && acted != nil {
			// An earlier attempt recovered part of it before a conflict;
			// report what it did.
			return *acted, nil
		}
		if writer == nil || !recoverable {
			return out, nil
		}
		by := recovery.Recoverer{Session: writer.Session(), At: now.Latest}
		conflict := false
		for _, a := range append([]recovery.Abandonment{dec.Target}, dec.Stray...) {
			if err := writer.Valid(); err != nil {
				out.Marked = marked
				return out, fmt.Errorf("autorecover: %s: stopped before marking revision %d failed: %w", subject, a.Release.Revision, err)
			}
			_, err := recovery.MarkFailed(ctx, helmx.SecretRecords(c.kube), namespace, a.Release, recovery.DescribeAbandoned(a, by), now.Latest)
			switch {
			case err == nil:
				marked = append(marked, a.Release.Revision)
			case errors.Is(err, recovery.ErrNotPending):
			case errors.Is(err, recovery.ErrConflict):
				conflict = true
			default:
				out.Marked = marked
				return out, fmt.Errorf("autorecover: %w", err)
			}
			if conflict {
				break
			}
		}
		out.Marked = marked
		if !conflict {
			return out, nil
		}
		if len(marked) > 0 {
			acted = &out
		}
	}
	return Decision{Marked: marked}, fmt.Errorf("autorecover: %s: other writers kept changing the release during recovery; try again: %w", subject, ErrConflict)
}
