package autorecover

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/sleepclock"
)

var (
	// ErrLocked: another session holds the release's lock (or, while the
	// lock is takeable, earlier waiters are queued for it). The error is a
	// *LockedError that names the holder.
	ErrLocked = protocol.ErrLocked
	// ErrLost: the lock is no longer held by this session (taken over after
	// it expired, deleted, released, or not renewed before its renew
	// deadline). Stop writing the release at once.
	ErrLost = protocol.ErrLost
	// ErrMaxHold: the lock was held longer than LockRequest.MaxHold; Keep
	// reports it and stops renewing, and the operation must abort.
	ErrMaxHold = protocol.ErrMaxHold
	// ErrConflict: recovery kept meeting concurrent writers of the release,
	// and overwrote none of them. Read again and decide again. (A fenced
	// rewrite of a release record that changed since it was read fails as
	// the API server's conflict, apierrors.IsConflict.)
	ErrConflict = protocol.ErrConflict
	// ErrPreempted: Run's operation was stopped because a client waiting
	// for the lock asked it to (LockRequest.Preempt); its revision was
	// marked failed naming that client. The error's chain holds a
	// *PreemptedError.
	ErrPreempted = protocol.ErrPreempted
)

// PreemptedError is the end of an operation stopped at a waiter's request
// (errors.Is(err, ErrPreempted) holds for it): By names the waiter.
type PreemptedError = protocol.PreemptedError

// DefaultLeaseDuration is the lease of a lock whose request sets none. A
// holder renews every third of it (Keep), and a holder that dies is taken
// over about one lease plus a second after its last renewal.
const DefaultLeaseDuration = protocol.DefaultLeaseDuration

// Operation is the Helm operation a lock protects. It is recorded for people
// and for recovery: a revision left pending by an operation whose lock has
// expired is recovered at once.
type Operation = protocol.Operation

// The operations that take a lock. OpRecover is a recovery on its own
// (Client.Recover): it writes no revision, so nothing pending is ever
// attributed to it.
const (
	OpInstall   = protocol.OpInstall
	OpUpgrade   = protocol.OpUpgrade
	OpRollback  = protocol.OpRollback
	OpUninstall = protocol.OpUninstall
	OpRecover   = protocol.OpRecover
)

// Client locks, inspects and recovers Helm releases of one cluster. It is
// safe for concurrent use.
type Client struct {
	conn    *protocol.Conn
	config  *rest.Config
	backend Backend
}

// Backend is where a release's lock lives; see WithLockBackend.
type Backend string

// The lock backends, as the helm-autorecover CLI's --lock-backend names them.
const (
	// BackendAuto picks BackendLease when the caller may get, create and
	// update Leases in the release's namespace, BackendRelease otherwise
	// (asked once per namespace with SelfSubjectAccessReviews).
	BackendAuto Backend = protocol.BackendAuto
	// BackendLease keeps the lock on the release's newest stored record and
	// in a coordination.k8s.io/v1 Lease helm-autorecover.v1.<release>.
	BackendLease Backend = protocol.BackendLease
	// BackendRelease keeps it on the release's newest stored record alone:
	// it needs no rights beyond helm's own.
	BackendRelease Backend = protocol.BackendRelease
)

// Option configures a Client.
type Option func(*clientOptions)

type clientOptions struct {
	clock   clock.Clock
	backend Backend
	driver  string
	sqlDSN  string
}

// WithClock sets the local clock the client measures elapsed time with (by
// default the real clock, counting time the machine spends asleep, which
// clock.RealClock{} also stands for). Only differences between its readings
// are used; expiry is always judged in the API server's clock.
func WithClock(c clock.Clock) Option {
	return func(o *clientOptions) { o.clock = c }
}

// WithLockBackend chooses where locks live (BackendAuto by default). Every
// client, whichever backend it chose, takes the lock on the release's newest
// stored record first, so clients of different backends (this package, the
// helm-autorecover CLI, its controller) exclude each other.
func WithLockBackend(b Backend) Option {
	return func(o *clientOptions) { o.backend = b }
}

// WithStorageDriver names helm's storage driver the releases are kept with:
// "secret" (the default, also ""), "configmap" or "sql", as helm's
// HELM_DRIVER. With "sql" the lock is a row in helm's PostgreSQL database,
// beside helm's table of releases, whose trigger refuses helm's writes of a
// session that no longer holds it; the database is the one
// WithSQLConnectionString names, or else HELM_DRIVER_SQL_CONNECTION_STRING,
// as for helm. The client keeps one pool to it for its own reads and
// writes (Close ends it); each lock opens helm's own driver for its
// operation (Lock.ActionConfig) and closes it when the lock is given back.
func WithStorageDriver(name string) Option {
	return func(o *clientOptions) { o.driver = name }
}

// WithSQLConnectionString is the PostgreSQL connection string of helm's sql
// driver (WithStorageDriver("sql")), in either form helm takes (a URL or
// key=value pairs); by default HELM_DRIVER_SQL_CONNECTION_STRING's.
func WithSQLConnectionString(dsn string) Option {
	return func(o *clientOptions) { o.sqlDSN = dsn }
}

// NewClient returns a Client for the cluster cfg points at. Its requests
// feed an estimate of the API server's clock (from the responses' Date
// headers), in which every expiry is judged; cfg itself is not modified.
func NewClient(cfg *rest.Config, opts ...Option) (*Client, error) {
	if cfg == nil {
		return nil, errors.New("autorecover: no REST configuration given")
	}
	o := clientOptions{clock: sleepclock.System(), backend: BackendAuto}
	for _, opt := range opts {
		opt(&o)
	}
	switch o.backend {
	case BackendAuto, BackendLease, BackendRelease:
	default:
		return nil, fmt.Errorf("autorecover: lock backend %q: must be %s, %s or %s", o.backend, BackendAuto, BackendLease, BackendRelease)
	}
	var conn *protocol.Conn
	var err error
	switch o.driver {
	case "", "secret", "secrets", "configmap", "configmaps":
		if o.sqlDSN != "" {
			return nil, fmt.Errorf("autorecover: a sql connection string given with storage driver %q: it is for WithStorageDriver(%q) alone", o.driver, protocol.DriverSQL)
		}
		conn, err = protocol.Connect(cfg, o.clock, o.driver)
	case protocol.DriverSQL:
		dsn := o.sqlDSN
		if dsn == "" {
			dsn = os.Getenv(EnvSQLConnectionString)
		}
		if dsn == "" {
			return nil, fmt.Errorf("autorecover: storage driver %q needs the PostgreSQL connection string helm uses: WithSQLConnectionString, or %s", o.driver, EnvSQLConnectionString)
		}
		conn, err = protocol.ConnectSQL(cfg, o.clock, dsn)
	default:
		return nil, fmt.Errorf("autorecover: storage driver %q: only helm's secret, configmap and sql drivers keep releases where the lock can fence them (memory keeps them in one process, where no other client could see a lock)", o.driver)
	}
	if err != nil {
		return nil, fmt.Errorf("autorecover: %w", err)
	}
	return &Client{conn: conn, config: rest.CopyConfig(cfg), backend: o.backend}, nil
}

// EnvSQLConnectionString is the variable helm's sql driver reads its
// connection string from, and the client too when WithSQLConnectionString
// names none.
const EnvSQLConnectionString = protocol.EnvSQLConnectionString

// Close ends the client's pool to the sql driver's database
// (WithStorageDriver("sql")); with any other driver there is nothing to
// close. Give back every lock first.
func (c *Client) Close() error {
	if err := c.conn.Close(); err != nil {
		return fmt.Errorf("autorecover: closing the sql database: %w", err)
	}
	return nil
}

// Kubernetes returns the client's clientset. Requests made with it feed the
// client's estimate of the API server's clock.
func (c *Client) Kubernetes() kubernetes.Interface { return c.conn.Client() }

// TimeBounds bracket the API server's clock: the true server time lies
// between Earliest and Latest.
type TimeBounds struct {
	Earliest time.Time
	Latest   time.Time
}

// ServerTime returns the client's current estimate of the API server's
// clock, making one request when nothing is known yet.
func (c *Client) ServerTime(ctx context.Context) (TimeBounds, error) {
	b, err := c.conn.ServerNow(ctx)
	if err != nil {
		return TimeBounds{}, fmt.Errorf("autorecover: %w", err)
	}
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
	// 2 s (twice the safety margin) and at most 10 minutes
	// (protocol.MaxLeaseDuration): a holder that dies keeps the release locked
	// for one lease.
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
	// Preempt, while waiting, asks the live holder to stop (cooperative
	// preemption, the CLI's --preempt): a holder that can stop safely (an
	// install or upgrade with no hook running) ends its operation failed
	// and gives the lock back; this client still waits in arrival order, up
	// to Wait, which should then be positive. Nothing is ever taken from a
	// holder that does not stop.
	Preempt bool
	// Session defaults to a new UUID; Who to user@host; PID to this process;
	// ToolVersion to this module's version; CIJobURL to the CI job detected
	// from the environment.
	Session     string
	Who         string
	PID         int
	ToolVersion string
	CIJobURL    string
}

func (r LockRequest) internal(backend Backend) protocol.Request {
	req := protocol.Request{
		Release:       r.Release,
		Namespace:     r.Namespace,
		Operation:     r.Operation,
		Backend:       string(backend),
		Revision:      r.Revision,
		Timeout:       r.Timeout,
		LeaseDuration: r.LeaseDuration,
		MaxHold:       r.MaxHold,
		Session:       r.Session,
		Who:           r.Who,
		PID:           r.PID,
		ToolVersion:   r.ToolVersion,
		CIJobURL:      r.CIJobURL,
		Wait:          r.Wait,
		Preempt:       r.Preempt,
	}
	if r.OnWait != nil {
		req.OnWait = func(rec *protocol.Record, left time.Duration) { r.OnWait(holderFrom(rec), left) }
	}
	return req
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

func holderFrom(r *protocol.Record) *Holder {
	if r == nil {
		return nil
	}
	return &Holder{
		Session:       r.Session,
		Operation:     r.Operation,
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

func lockedFrom(e *protocol.LockedError) *LockedError {
	out := &LockedError{
		Release:    e.Release,
		Namespace:  e.Namespace,
		Holder:     holderFrom(e.Holder),
		LockedTill: e.LockedTill,
		Left:       e.Left,
		Ahead:      e.Ahead,
	}
	if e.State == protocol.Live {
		out.HolderSession = e.HolderIdentity
	}
	return out
}

// translate turns the protocol's *LockedError into ours, and names the
// package in every other error. When a wait for the lock ended, the
// context's cause (or the end of req.Wait) is wrapped too.
func translate(ctx context.Context, req LockRequest, err error) error {
	le, ok := errors.AsType[*protocol.LockedError](err)
	if !ok {
		if _, usage := errors.AsType[*protocol.BackendError](err); usage {
			return fmt.Errorf("autorecover: release %q in namespace %q: %w", req.Release, req.Namespace, err)
		}
		return fmt.Errorf("autorecover: %w", err)
	}
	pub := lockedFrom(le)
	switch cause := context.Cause(ctx); {
	case le.Waited > 0:
		return fmt.Errorf("gave up waiting for the lock (%w): %w", context.DeadlineExceeded, pub)
	case req.Wait != 0 && cause != nil:
		return fmt.Errorf("gave up waiting for the lock (%w): %w", cause, pub)
	}
	return pub
}

// Acquire takes the lock of req.Release in the client's backend. When a live
// holder has it, Acquire fails at once with a *LockedError, or with
// req.Wait waits for it (then an error wrapping both the *LockedError and
// the context's error when it gives up). A lock whose holder let it expire
// is taken over; Lock.Previous then describes that holder, and Lock.Recover
// recovers what it abandoned.
//
// The caller must Release the lock, and keep it alive with Keep while its
// operation runs. Run does all of this around one helm action.
func (c *Client) Acquire(ctx context.Context, req LockRequest) (*Lock, error) {
	held, err := c.conn.Take(ctx, req.internal(c.backend))
	if err != nil {
		return nil, translate(ctx, req, err)
	}
	return &Lock{c: c, held: held, op: req.Operation, release: req.Release, namespace: req.Namespace, fence: held.Fence()}, nil
}

// Lock is a release lock this process holds. Its methods are safe for
// concurrent use.
type Lock struct {
	c                  *Client
	held               *protocol.Lock
	op                 Operation
	release, namespace string
	// fence is the lock's write fence (protocol.Lock.Fence).
	fence *helmx.WriteFence
	// after holds what Recover left for after the operation (recover.go).
	after afterRecovery
}

// ReleaseName is the name of the locked release.
func (l *Lock) ReleaseName() string { return l.release }

// Namespace is the namespace of the locked release.
func (l *Lock) Namespace() string { return l.namespace }

// Session is this lock's session ID.
func (l *Lock) Session() string { return l.held.Session() }

// Holder returns this lock's record as last written.
func (l *Lock) Holder() Holder {
	r := l.held.Record()
	return *holderFrom(&r)
}

// Previous describes the session that held the lock before, and how it was
// found: LockFree when it released the lock, LockExpired when it died or
// stalled and this lock took over (the revision it was writing may then be
// pending, and Recover recovers it). The holder is nil when there was none
// or its record was unreadable.
func (l *Lock) Previous() (*Holder, LockState) {
	rec, st := l.held.Taken()
	return holderFrom(rec), stateFrom(st, false)
}

// Valid reports whether it is still safe to write under this lock: nil while
// the lock is held and its renew deadline has not passed, an error wrapping
// ErrLost otherwise. The fenced configuration (ActionConfig, FencedStorage)
// asks it before every write.
func (l *Lock) Valid() error { return l.held.Valid() }

// Renew extends the lock by one lease from now. An error wrapping ErrLost
// means the lock is gone and the caller must stop writing; ErrMaxHold means
// the maximum hold time has passed; any other error is transient and the
// lock stays valid until its renew deadline. Keep renews by itself.
func (l *Lock) Renew(ctx context.Context) error { return l.held.Renew(ctx) }

// SetRevision records the revision the operation is writing, renewing the
// lock in the same write. Whoever finds that revision abandoned then
// recovers it at once. Run records it itself.
func (l *Lock) SetRevision(ctx context.Context, rev int) error {
	return l.held.SetRevision(ctx, rev)
}

// Release gives the lock back; it is idempotent. A lock already lost (its
// renew deadline passed, or another session took it) is not written at all:
// it runs out by itself, and the next client then takes it over and
// recovers what this one left, as after a crash. On the way out of a
// cancelled operation, pass a context that is not already cancelled, such
// as context.WithoutCancel(ctx) with a timeout.
//
// When this lock took over an expired holder whose revision was not
// recovered (Recover failed, was blocked, or was not called), the record
// left names that holder, so the next client recovers its revision at once
// rather than taking it for stock helm's.
//
// When Recover left objects for after the operation (those only the
// abandoned revision rendered), Release first removes the ones the revision
// written since does not render; see Lock.Recover.
func (l *Lock) Release(ctx context.Context) error {
	_ = l.finishRecovery(ctx) // (a lost lock: Release has nothing to give back either)
	// No write of helm's let through may land once the lock is free (an
	// operation cancelled by its context may have one in flight: helm's
	// upgrade goroutine goes on after it returned): the release drains the
	// lock's fence first.
	err := l.held.Release(ctx)
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
// past MaxHold; the caller must then stop its operation (the fenced
// configuration refuses its writes anyway). Transient renewal errors are
// retried until the deadline.
func (l *Lock) Keep(ctx context.Context, onLost func(error)) { l.held.Keep(ctx, onLost) }
