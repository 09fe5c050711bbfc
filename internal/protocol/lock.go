package protocol

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// Acquire takes the lock of req.Release in every store, in order (see
// Stores). With wait false it fails at once with an error wrapping
// lock.ErrLocked when a live client holds any of them; with wait true it
// waits in arrival order until ctx ends, calling onProgress as
// lock.Backend.Wait does.
func (c *Conn) Acquire(ctx context.Context, req lock.Request, stores []*lock.Backend, wait bool, onProgress func(*lock.Record, time.Duration)) (*Lock, error) {
	j, err := lock.AcquireJoint(ctx, req, wait, onProgress, stores...)
	if err != nil {
		return nil, err
	}
	l := &Lock{conn: c, joint: j, release: req.Release, namespace: req.Namespace}
	// Until recovery succeeds, a holder found expired is handed on when
	// this lock is released (see Release).
	_, found := j.Previous()
	l.handOn = found == lock.Expired
	return l, nil
}

// Lock is a release lock taken through Acquire: every store's part under
// one session, and what it was taken from. Its methods are safe for
// concurrent use.
type Lock struct {
	conn               *Conn
	joint              *lock.Joint
	release, namespace string

	mu sync.Mutex
	// handOn is set while the lock was taken over from an expired holder
	// whose revision has not been recovered: Release then leaves a record
	// that names that holder, so the next client recovers it at once.
	handOn bool
}

// Joint is the underlying set of locks.
func (l *Lock) Joint() *lock.Joint { return l.joint }

// Session is the lock's session ID.
func (l *Lock) Session() string { return l.joint.Session() }

// Record is the lock's record as last written (the release record's part).
func (l *Lock) Record() lock.Record { return l.joint.Record() }

// Valid is nil while it is still safe to write under the lock.
func (l *Lock) Valid() error { return l.joint.Valid() }

// Previous maps what the lock was taken from onto recovery's input.
func (l *Lock) Previous() recovery.LockInfo { return recovery.PreviousLock(l.joint.Previous()) }

// NextRevision is the revision op is about to write, to record with
// SetRevision so that whoever finds it abandoned recovers it at once: the
// one after latest, the highest stored revision recovery read (or latest
// itself for an uninstall, which rewrites it). A negative latest (recovery
// rolled back, writing a revision it did not read) reads the history again;
// a driver that keeps no record counts as no revision.
func (l *Lock) NextRevision(ctx context.Context, op lock.Operation, latest int) (int, error) {
	if latest < 0 {
		latest = 0
		if _, err := l.conn.Records(); err == nil {
			hist, err := l.conn.History(ctx, l.namespace, l.release)
			if err != nil {
				return 0, err
			}
			if n := len(hist); n > 0 {
				latest = hist[n-1].Revision
			}
		}
	}
	if op == lock.OpUninstall {
		return latest, nil
	}
	return latest + 1, nil
}

// Renew extends every part by one lease from now.
func (l *Lock) Renew(ctx context.Context) error { return l.joint.Renew(ctx) }

// SetRevision records the revision the operation is about to write.
func (l *Lock) SetRevision(ctx context.Context, rev int) error {
	return l.joint.SetRevision(ctx, rev)
}

// Keep renews every part until ctx ends or the lock is released; onLost is
// called once, when a part is lost or held past its maximum hold.
func (l *Lock) Keep(ctx context.Context, onLost func(error)) { l.joint.Keep(ctx, onLost) }

// Release gives the lock back. When it was taken over from an expired
// holder whose revision was not recovered (recovery failed, was blocked, or
// never ran), the record left names that holder (lock.Record.Abandoned), so
// the next client recovers it at once instead of taking it for stock
// helm's. A lock already lost (its renew deadline passed, or someone took
// or released it) is not written at all: the holder stops writing, as the
// CLI's fail-stop does, and its lock runs out by itself, after which the
// next client takes it over and recovers what it left.
func (l *Lock) Release(ctx context.Context) error {
	l.mu.Lock()
	handOn := l.handOn
	l.mu.Unlock()
	if err := l.joint.Valid(); err != nil {
		return err
	}
	if handOn {
		return l.joint.ReleaseAfterFailedRecovery(ctx)
	}
	return l.joint.Release(ctx)
}

// ReleaseAndDelete gives the lock back and removes what is left of it,
// after an uninstall that kept no history.
func (l *Lock) ReleaseAndDelete(ctx context.Context) error {
	return l.joint.ReleaseAndDelete(ctx)
}

// Recover runs the recovery procedure (Conn.Recover) under this lock, for
// what the holder it was taken from left behind.
func (l *Lock) Recover(ctx context.Context, p Procedure) (Outcome, error) {
	p.Release, p.Namespace = l.release, l.namespace
	p.Lock = l.Previous()
	p.Writer = l
	out, err := l.conn.Recover(ctx, p)
	if err == nil && out.Decision.Verdict != recovery.Blocked {
		l.mu.Lock()
		l.handOn = false
		l.mu.Unlock()
	}
	return out, err
}

// IsLocked reports whether err says another live client holds the lock.
func IsLocked(err error) (*lock.LockedError, bool) {
	var le *lock.LockedError
	if errors.As(err, &le) {
		return le, true
	}
	return nil, false
}
