package protocol

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// Request is what a door (the guarded commands, the lock commands, the
// controller, the Go package) asks of Take: which release, for which
// operation, and how long it may wait. Take turns it into the lock's own
// request, the one place that is done; what it leaves empty gets the lock's
// defaults (a new session, user@host, this process, this build, the CI job
// of the environment).
type Request struct {
	Release   string
	Namespace string
	Operation Operation
	// Backend is the lock backend chosen (BackendAuto, BackendLease or
	// BackendRelease; "" is auto).
	Backend string
	// Revision is the revision the operation will write, when known.
	Revision int
	// Timeout is the operation's helm --timeout, recorded for people.
	Timeout time.Duration
	// LeaseDuration defaults to DefaultLeaseDuration.
	LeaseDuration time.Duration
	// MaxHold, when positive, bounds how long the lock may be held.
	MaxHold time.Duration

	Session     string
	Who         string
	PID         int
	ToolVersion string
	CIJobURL    string

	// Wait is how long Take waits for a live holder: 0 fails at once with a
	// *LockedError; a positive value waits up to that long; a negative
	// value until ctx ends. Waiters are served in arrival order.
	Wait time.Duration
	// WaitContext, when set, gives the context the wait runs under (a door
	// that ends a wait on a signal); it is called only when Take has to wait.
	WaitContext func(context.Context) (context.Context, context.CancelFunc)
	// OnWait is told, while waiting, the holder and how long until its lock
	// may be taken over; OnConfirm, while an expiry is being confirmed on
	// this client's clock before a take (lock.Confirm), without waiting.
	OnWait    func(holder *Record, left time.Duration)
	OnConfirm func(holder *Record, in time.Duration)

	// Preempt, while waiting, asks the live holder to stop (see
	// preempt.go); the client still waits in arrival order.
	Preempt bool

	// Fence is the write fence the lock arms for the writes made under it
	// (helmx.DefaultWriteFence for helm's command tree); nil gives the lock
	// a fence of its own (Lock.Fence).
	Fence *helmx.WriteFence
}

// BackendError is a lock backend that cannot be used here: an unknown
// choice, or a store the storage driver does not have. It is a usage
// error, not a refusal of the lock.
type BackendError struct {
	Choice string
	Err    error
}

func (e *BackendError) Error() string { return e.Err.Error() }
func (e *BackendError) Unwrap() error { return e.Err }

// Take takes the lock of req.Release for req.Operation, in every store of
// the backend chosen (Stores), and arms its write fence: from then on every
// write through that fence is judged by the lock, and Release drains it
// before the lock is given back. With req.Wait it waits for a live holder;
// a lock whose holder let it expire is taken over (Lock.Previous), and
// Lock.Recover recovers what that holder left.
//
// Errors: a *LockedError when a live holder has the lock (after the wait,
// with Waited set, when it ran out); a *BackendError when the backend
// cannot be used; the API server's refusals, with the rights the backend
// needs.
func (c *Conn) Take(ctx context.Context, req Request) (*Lock, error) {
	if err := lock.ValidateReleaseName(req.Release); err != nil {
		return nil, fmt.Errorf("lock release in namespace %q: %w", req.Namespace, err)
	}
	if req.Operation == "" {
		return nil, fmt.Errorf("lock release %q in namespace %q: no operation given", req.Release, req.Namespace)
	}
	choice := req.Backend
	if choice == "" {
		choice = BackendAuto
	}
	l, backend, err := c.take(ctx, req, choice)
	if choice == BackendAuto && backend == BackendLease && LeaseForbidden(err) {
		// The Lease backend auto remembered choosing is refused now (a
		// right taken away): choose again, asking the API server.
		c.ForgetAuto(req.Namespace)
		l, backend, err = c.take(ctx, req, choice)
	}
	if err != nil {
		return nil, rightsNeeded(err, req, backend, choice)
	}
	fence := req.Fence
	if fence == nil {
		fence = &helmx.WriteFence{}
	}
	l.fence = fence
	if recs, rerr := c.Records(); rerr == nil {
		// The fence stays on for the lock's whole life (End turns it off
		// once the lock is given back, for a fence shared by a process's
		// successive locks): once the lock is released or lost, Valid
		// refuses every write that goes through it.
		l.unfence = fence.Guard(helmx.GuardedWrites{Namespace: req.Namespace, Release: req.Release, Resource: recs.Resource(), Lock: l})
	}
	return l, nil
}

// take chooses the stores and takes the lock in them, waiting as req says.
func (c *Conn) take(ctx context.Context, req Request, choice string) (*Lock, string, error) {
	backend, stores, err := c.Stores(ctx, req.Namespace, choice)
	if err != nil {
		return nil, "", &BackendError{Choice: choice, Err: err}
	}
	lreq := lock.Request{
		Release:       req.Release,
		Namespace:     req.Namespace,
		Operation:     req.Operation,
		Revision:      req.Revision,
		Timeout:       req.Timeout,
		LeaseDuration: req.LeaseDuration,
		MaxHold:       req.MaxHold,
		Session:       req.Session,
		Who:           req.Who,
		PID:           req.PID,
		ToolVersion:   req.ToolVersion,
		CIJobURL:      req.CIJobURL,
		Backend:       backend,
		Preempt:       req.Preempt,
	}
	if lreq.Session == "" {
		// One session for every part and for a retry after the wait.
		lreq.Session = lock.NewSession()
	}
	l, err := c.acquire(ctx, lreq, stores.list, false, req.OnConfirm)
	if err == nil || !errors.Is(err, lock.ErrLocked) || req.Wait == 0 {
		return l, backend, err
	}
	wctx := ctx
	if req.WaitContext != nil {
		var cancel context.CancelFunc
		wctx, cancel = req.WaitContext(ctx)
		defer cancel()
	}
	limited := wctx
	if req.Wait > 0 {
		var cancel context.CancelFunc
		limited, cancel = context.WithTimeout(wctx, req.Wait)
		defer cancel()
	}
	l, err = c.acquire(limited, lreq, stores.list, true, req.OnWait)
	if le, ok := IsLocked(err); ok && req.Wait > 0 && limited.Err() != nil && wctx.Err() == nil {
		// The wait ran out: the holder is the story, not the deadline.
		le.Waited = req.Wait
		return nil, backend, le
	}
	return l, backend, err
}

// rightsNeeded adds, to the API server's refusal of a right the backend in
// use needs, which rights those are and where to read more. chosen is the
// backend as asked (auto, or the backend itself), backend what it resolved
// to.
func rightsNeeded(err error, req Request, backend, chosen string) error {
	if !apierrors.IsForbidden(err) || backend == "" {
		return err
	}
	what := "the " + backend + " lock backend"
	if chosen == BackendAuto {
		what += " (what --lock-backend=auto chose)"
	}
	need := "get, list, watch, create, update and delete on secrets (configmaps with HELM_DRIVER=configmap)"
	if backend == BackendLease {
		need = "get, list, watch, create, update and delete on leases (coordination.k8s.io), and " + need + ","
	}
	advice := "see docs/rbac.md for the minimal Role"
	if backend == BackendLease && LeaseForbidden(err) && chosen == BackendLease {
		advice += ", or use --lock-backend=release, which needs no right on Leases"
	}
	return fmt.Errorf("%w; %s needs %s in namespace %q: %s", err, what, need, req.Namespace, advice)
}

// Fence is the write fence Take armed for this lock: clients built through
// it (Wrap, Getter) or requests carrying it (helmx.WithFence, on OwnWrites
// clients) write only while the lock is valid.
func (l *Lock) Fence() *helmx.WriteFence { return l.fence }
