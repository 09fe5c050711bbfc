package autorecover

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

var (
	// ErrLocked: another session holds the release's lock (or, while the
	// lock is takeable, earlier waiters are queued for it). The error is a
	// *LockedError that names the holder.
	ErrLocked = lock.ErrLocked
	// ErrLost: the lock is no longer held by this session (taken over after
	// it expired, deleted, released, or not renewed before its renew
	// deadline). Stop writing the release at once.
	ErrLost = lock.ErrLost
	// ErrMaxHold: the lock was held longer than LockRequest.MaxHold; Keep
	// reports it and stops renewing, and the operation must abort.
	ErrMaxHold = lock.ErrMaxHold
	// ErrConflict: a fenced write found the release record changed since it
	// was read, and was refused rather than overwrite the other writer; or
	// recovery kept meeting concurrent writers. Read again and decide again.
	ErrConflict = helmx.ErrConflict
)

// DefaultLeaseDuration is the lease of a lock whose request sets none. A
// holder renews every third of it (Keep), and a holder that dies is taken
// over about one lease plus a second after its last renewal.
const DefaultLeaseDuration = lock.DefaultLeaseDuration

// Operation is the Helm operation a lock protects. It is recorded for people
// and for recovery: a revision left pending by an operation whose lock has
// expired is recovered at once.
type Operation string

// The operations that take a lock.
const (
	OpInstall   Operation = "install"
	OpUpgrade   Operation = "upgrade"
	OpRollback  Operation = "rollback"
	OpUninstall Operation = "uninstall"
	// OpRecover is a recovery on its own (Client.Recover): it writes no
	// revision, so nothing pending is ever attributed to it.
	OpRecover Operation = "recover"
)

// Client locks, inspects and recovers Helm releases of one cluster. It is
// safe for concurrent use.
type Client struct {
	kube    kubernetes.Interface
	est     *servertime.Estimator
	backend *lock.Backend
	clock   clock.Clock
}

// Option configures a Client.
type Option func(*clientOptions)

type clientOptions struct {
	clock clock.Clock
}

// WithClock sets the local clock the client measures elapsed time with
// (clock.RealClock by default). Only differences between its readings are
// used; expiry is always judged in the API server's clock.
func WithClock(c clock.Clock) Option {
	return func(o *clientOptions) { o.clock = c }
}

// NewClient returns a Client for the cluster cfg points at. Its requests
// feed an estimate of the API server's clock (from the responses' Date
// headers), in which every expiry is judged; cfg itself is not modified.
func NewClient(cfg *rest.Config, opts ...Option) (*Client, error) {
	if cfg == nil {
		return nil, errors.New("autorecover: no REST configuration given")
	}
	o := clientOptions{clock: clock.RealClock{}}
	for _, opt := range opts {
		opt(&o)
	}
	est := servertime.New(o.clock)
	cs, err := kubernetes.NewForConfig(est.Instrument(cfg))
	if err != nil {
		return nil, fmt.Errorf("autorecover: kubernetes client: %w", err)
	}
	return &Client{
		kube:    cs,
		est:     est,
		backend: lock.NewLeaseBackend(cs, est, o.clock),
		clock:   o.clock,
	}, nil
}

// Kubernetes returns the client's clientset. Requests made with it feed the
// client's estimate of the API server's clock.
func (c *Client) Kubernetes() kubernetes.Interface { return c.kube }

// TimeBounds bracket the API server's clock: the true server time lies
// between Earliest and Latest.
type TimeBounds struct {
	Earliest time.Time
	Latest   time.Time
}

// ServerTime returns the client's current estimate of the API server's
// clock, making one request when nothing is known yet.
func (c *Client) ServerTime(ctx context.Context) (TimeBounds, error) {
	if err := c.est.Sync(ctx, c.kube.Discovery()); err != nil {
		return TimeBounds{}, fmt.Errorf("autorecover: %w", err)
	}
	b, _ := c.est.Now()
	return TimeBounds{Earliest: b.Earliest, Latest: b.Latest}, nil
}

// LockRequest describes the operation that wants a release's lock.
type LockRequest struct {
	Release   string
	Namespace string
	// Operation is required.
	Operation Operation
	// Revision is the revision the operation will write, when known; it can
	// also be recorded later with Lock.SetRevision. Recording it lets whoever
	// finds the revision abandoned recover it at once.
	Revision int
	// Timeout is the operation's helm timeout, recorded for people.
	Timeout time.Duration
	// LeaseDuration defaults to DefaultLeaseDuration and must be longer than
	// 2 s (twice the safety margin).
	LeaseDuration time.Duration
	// MaxHold, when positive, bounds how long the lock may be held: Keep
	// stops renewing and reports ErrMaxHold once it has been held that long.
	MaxHold time.Duration
	// Wait is how long Acquire waits for a live holder: 0 fails at once with
	// a *LockedError; a positive value waits up to that long; a negative
	// value waits until ctx ends. Waiters are served in arrival order and a
	// dead holder is taken over as soon as its lock expires.
	Wait time.Duration
	// OnWait, when set, is called while waiting, on every change and about
	// once a second, with the current holder (nil when unknown) and how long
	// until its lock may be taken over unless it renews.
	OnWait func(holder *Holder, left time.Duration)
	// Session defaults to a new UUID; Who to user@host; PID to this process;
	// ToolVersion to this module's version; CIJobURL to the CI job detected
	// from the environment.
	Session     string
	Who         string
	PID         int
	ToolVersion string
	CIJobURL    string
}

func (r LockRequest) internal() lock.Request {
	return lock.Request{
		Release:       r.Release,
		Namespace:     r.Namespace,
		Operation:     lock.Operation(r.Operation),
		Revision:      r.Revision,
		Timeout:       r.Timeout,
		LeaseDuration: r.LeaseDuration,
		MaxHold:       r.MaxHold,
		Session:       r.Session,
		Who:           r.Who,
		PID:           r.PID,
		ToolVersion:   r.ToolVersion,
		CIJobURL:      r.CIJobURL,
	}
}

// Holder is a lock record: who holds (or last held) a release's lock, for
// what, and until when. Times are API-server time.
type Holder struct {
	Session   string
	Operation Operation
	Release   string
	Namespace string
	// Revision is the revision the holder is writing; 0 when unknown, -1 for
	// a session that writes no revision of its own (Client.Recover).
	Revision    int
	Who         string
	PID         int
	ToolVersion string
	CIJobURL    string
	// Timeout is the holder's helm timeout (informational).
	Timeout       time.Duration
	LeaseDuration time.Duration
	AcquiredAt    time.Time
	RenewedAt     time.Time
	// LockedTill is LOCKED TILL: RenewedAt + LeaseDuration. Unless it
	// renews, the holder stops writing before the server clock reaches it.
	LockedTill time.Time
	// MaxHoldUntil is when the holder gives up however alive it is (zero:
	// no limit).
	MaxHoldUntil time.Time
	// ReleasedAt is set once the lock was given back; ReleasedBy names who
	// released it when that was not the holder itself.
	ReleasedAt time.Time
	ReleasedBy string
}

func holderFrom(r *lock.Record) *Holder {
	if r == nil {
		return nil
	}
	return &Holder{
		Session:       r.Session,
		Operation:     Operation(r.Operation),
		Release:       r.Release,
		Namespace:     r.Namespace,
		Revision:      r.Revision,
		Who:           r.Who,
		PID:           r.PID,
		ToolVersion:   r.ToolVersion,
		CIJobURL:      r.CIJobURL,
		Timeout:       r.Timeout.Duration,
		LeaseDuration: r.LeaseDuration.Duration,
		AcquiredAt:    r.AcquiredAt,
		RenewedAt:     r.RenewedAt,
		LockedTill:    r.LockedTill,
		MaxHoldUntil:  r.MaxHoldUntil,
		ReleasedAt:    r.ReleasedAt,
		ReleasedBy:    r.ReleasedBy,
	}
}

// LockedError reports that a release is locked by someone else.
// errors.Is(err, ErrLocked) holds for it.
type LockedError struct {
	Release   string
	Namespace string
	// Holder is the live holder's record; nil when it could not be read or
	// when the lock is free but earlier waiters are queued (see Ahead).
	Holder *Holder
	// HolderSession names the live holder even when its record is
	// unreadable; empty when no one holds the lock.
	HolderSession string
	// LockedTill is the holder's expiry in server time (zero if unknown);
	// Left is how long, when the error was made, until the lock may be
	// taken over unless the holder renews it.
	LockedTill time.Time
	Left       time.Duration
	// Ahead counts live waiters queued before the caller.
	Ahead int
}

// Unwrap makes errors.Is(err, ErrLocked) true.
func (e *LockedError) Unwrap() error { return ErrLocked }

func (e *LockedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "release %q in namespace %q is locked", e.Release, e.Namespace)
	switch h := e.Holder; {
	case h != nil:
		who := h.Who
		if who == "" {
			who = "an unknown holder"
		}
		fmt.Fprintf(&b, " by %s (session %s, operation %s", who, h.Session, h.Operation)
		if h.Revision > 0 {
			fmt.Fprintf(&b, " of revision %d", h.Revision)
		}
		if !h.AcquiredAt.IsZero() {
			fmt.Fprintf(&b, ", since %s", stamp(h.AcquiredAt))
		}
		if h.CIJobURL != "" {
			fmt.Fprintf(&b, ", job %s", h.CIJobURL)
		}
		b.WriteString(")")
	case e.HolderSession != "":
		fmt.Fprintf(&b, " by session %s (lock record unreadable)", e.HolderSession)
	default:
		fmt.Fprintf(&b, ": %d earlier waiter(s) are queued for it", e.Ahead)
		return b.String()
	}
	if !e.LockedTill.IsZero() {
		fmt.Fprintf(&b, ", LOCKED TILL %s (can be taken over in %s unless renewed)", stamp(e.LockedTill), e.Left.Round(time.Second))
	}
	if e.Ahead > 0 {
		fmt.Fprintf(&b, ", %d waiter(s) queued", e.Ahead)
	}
	return b.String()
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func lockedFrom(e *lock.LockedError) *LockedError {
	out := &LockedError{
		Release:    e.Release,
		Namespace:  e.Namespace,
		Holder:     holderFrom(e.Holder),
		LockedTill: e.LockedTill,
		Left:       e.Left,
		Ahead:      e.Ahead,
	}
	if e.State == lock.Live {
		out.HolderSession = e.HolderIdentity
	}
	return out
}

// translate turns the lock package's *LockedError into ours, keeping every
// other error as it is. waitCtx is the context a wait ran under; when it
// ended, its cause is wrapped too.
func translate(waitCtx context.Context, err error) error {
	le, ok := errors.AsType[*lock.LockedError](err)
	if !ok {
		return err
	}
	pub := lockedFrom(le)
	if cause := context.Cause(waitCtx); cause != nil {
		return fmt.Errorf("gave up waiting for the lock (%w): %w", cause, pub)
	}
	return pub
}

// Acquire takes the lock of req.Release. When a live holder has it, Acquire
// fails at once with a *LockedError, or with req.Wait waits for it (then an
// error wrapping both the *LockedError and the context's error when it gives
// up). A lock whose holder let it expire is taken over; Lock.Previous then
// describes that holder, and Lock.Recover recovers what it abandoned.
//
// The caller must Release the lock, and keep it alive with Keep (or Renew
// every third of its lease) while its operation runs.
func (c *Client) Acquire(ctx context.Context, req LockRequest) (*Lock, error) {
	ireq := req.internal()
	var held *lock.Held
	var err error
	wctx := ctx
	if req.Wait == 0 {
		held, _, err = c.backend.TryAcquire(ctx, ireq)
	} else {
		if req.Wait > 0 {
			var cancel context.CancelFunc
			wctx, cancel = context.WithTimeout(ctx, req.Wait)
			defer cancel()
		}
		var progress func(*lock.Record, time.Duration)
		if req.OnWait != nil {
			progress = func(r *lock.Record, left time.Duration) { req.OnWait(holderFrom(r), left) }
		}
		held, err = c.backend.Wait(wctx, ireq, progress)
	}
	if err != nil {
		return nil, translate(wctx, err)
	}
	l := &Lock{c: c, held: held, release: req.Release, namespace: req.Namespace}
	if held.Previous != nil {
		l.Previous = holderFrom(held.Previous)
		l.PreviousState = stateFrom(held.PreviousState)
	}
	return l, nil
}

// Lock is a release lock this process holds. Its methods are safe for
// concurrent use.
type Lock struct {
	// Previous is the record of the session that held the lock before
	// (nil when there was none, or it was unreadable), and PreviousState how
	// it was found: LockFree when that session released it, LockExpired when
	// it died or stalled and this lock took over; the revision it was writing
	// may then be pending, and Recover recovers it.
	Previous      *Holder
	PreviousState LockState

	c                  *Client
	held               *lock.Held
	release, namespace string

	mu sync.Mutex
	// recoverFailed is set while the last Recover of an expired holder's
	// revision failed.
	recoverFailed bool
}

// ReleaseName is the name of the locked release.
func (l *Lock) ReleaseName() string { return l.release }

// Namespace is the namespace of the locked release.
func (l *Lock) Namespace() string { return l.namespace }

// Session is this lock's session ID (the Lease's holderIdentity).
func (l *Lock) Session() string { return l.held.Session() }

// Holder returns this lock's record as last written.
func (l *Lock) Holder() Holder {
	r := l.held.Record()
	return *holderFrom(&r)
}

// Valid reports whether it is still safe to write under this lock: nil while
// the lock is held and its renew deadline has not passed, an error wrapping
// ErrLost otherwise. Check it before every write the lock protects; the
// fenced storage driver does so before every release write.
func (l *Lock) Valid() error { return l.held.Valid() }

// Deadline is the renew deadline on the client's local clock: unless a
// renewal succeeds first, the lock counts as lost from then on. It is the
// send time of the last successful renewal plus the lease, less a one second
// margin, so it falls before any other client may take the lock over.
func (l *Lock) Deadline() time.Time { return l.held.Deadline() }

// Done is closed once the lock is released or lost.
func (l *Lock) Done() <-chan struct{} { return l.held.Done() }

// Renew extends the lock by one lease from now. An error wrapping ErrLost
// means the lock is gone and the caller must stop writing; ErrMaxHold means
// the maximum hold time has passed; any other error is transient and the
// lock stays valid until Deadline.
func (l *Lock) Renew(ctx context.Context) error { return l.held.Renew(ctx) }

// SetRevision records the revision the operation is writing, renewing the
// lock in the same write.
func (l *Lock) SetRevision(ctx context.Context, rev int) error {
	return l.held.SetRevision(ctx, rev)
}

// Release gives the lock back; it is idempotent, and safe after the lock
// was lost: the write is conditional on this session still holding it, and
// when another session holds the lock already (or deleted it) there is
// nothing to give back and Release returns nil. On
// the way out of a cancelled operation, pass a context that is not already
// cancelled, such as context.WithoutCancel(ctx) with a timeout.
//
// When this lock took over an expired holder's and Recover failed, the
// record left names that holder, so the next client's Recover recovers its
// revision at once rather than taking it for stock helm's.
func (l *Lock) Release(ctx context.Context) error {
	l.mu.Lock()
	failed := l.recoverFailed
	l.mu.Unlock()
	release := l.held.Release
	if failed {
		release = l.held.ReleaseAfterFailedRecovery
	}
	err := release(ctx)
	if errors.Is(err, ErrLost) {
		// Someone else holds it now or deleted it: nothing is left to give back.
		return nil
	}
	return err
}

// Keep renews the lock every third of its lease until ctx ends or the lock
// is released or lost, and blocks until then: run it in its own goroutine.
// It calls onLost once, with an error wrapping ErrLost or ErrMaxHold, when
// the lock was taken, could not be renewed before its deadline, or was held
// past MaxHold; the caller must then stop its operation before writing the
// release again (the fenced storage driver refuses such writes anyway).
// Transient renewal errors are retried until the deadline.
func (l *Lock) Keep(ctx context.Context, onLost func(error)) { l.held.Keep(ctx, onLost) }
