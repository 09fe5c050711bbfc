package guard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/chaos"
	"github.com/helm-autorecover/helm-autorecover/internal/events"
	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/parentwatch"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// Target is one mutating operation on one release.
type Target struct {
	Op        protocol.Operation
	Release   string
	Namespace string
	// Timeout is the operation's --timeout.
	Timeout time.Duration
	// CreateNamespace is install's --create-namespace: the namespace is
	// created before the lock, which lives in it.
	CreateNamespace bool
	// DeleteLock removes the Lease after a successful uninstall that kept no
	// history.
	DeleteLock bool
}

// Guard puts the lock and recovery around helm's mutating commands.
type Guard struct {
	Options Options
	// Config is the REST configuration of the cluster (helm's settings).
	Config *rest.Config
	// Stderr receives progress and recovery messages.
	Stderr io.Writer
	// Clock is the local clock (clock.RealClock in production).
	Clock clock.Clock
	// Exit ends the process; fail-stop and second signals call it. It is
	// os.Exit in production.
	Exit func(code int)
	// Rollback rolls the release back to a revision under held, for
	// --recover-strategy=rollback. nil disables the strategy.
	Rollback func(ctx context.Context, held *protocol.Lock, release string, revision int) error
	// HelmDriver is helm's HELM_DRIVER ("" is secret).
	HelmDriver string
	// Fence, when set, fences the writes of helm's own clients and puts the
	// lock into the revision records they create (helmx.DefaultWriteFence
	// for the CLI).
	Fence *helmx.WriteFence
	// AutoMemory, when set, remembers --lock-backend=auto's choice across
	// runs (protocol.AutoMemory): no access reviews on every deploy.
	AutoMemory *protocol.AutoMemory
	// Session is the lock session to take the lock as; empty takes a fresh
	// one. With helm's sql driver it is the session helm's connection
	// string names (the database fences helm's writes by it).
	Session string
}

// Run takes the lock for t, recovers the release when the recovery decision
// allows it, runs op, and gives the lock back. While op runs the lock is
// renewed; if it cannot be, the process exits (fail-stop) before helm
// writes again.
func (g *Guard) Run(ctx context.Context, t Target, op func() error) error {
	if err := g.Options.Validate(); err != nil {
		return &exitcode.Error{Code: exitcode.Usage, Err: err}
	}
	// The guard handles the end of helm (plugin mode) itself, as a first
	// signal: no SIGTERM from parentwatch, which would count as a second.
	parentwatch.Claim()
	chaos.Point("before-lock")
	conn, err := protocol.Connect(g.Config, g.Clock, g.HelmDriver)
	if err != nil {
		return fmt.Errorf("release %q in namespace %q: %w", t.Release, t.Namespace, err)
	}
	if t.CreateNamespace {
		// The lock lives in the namespace: it is created first. Without
		// --create-namespace nothing is read for it: a missing namespace
		// shows when the lock is taken (namespaceMissing).
		if ok, err := g.ensureNamespace(ctx, conn.Client(), t); err != nil {
			return err
		} else if !ok {
			return op()
		}
	}

	conn.RememberAuto(g.AutoMemory)
	held, err := g.take(ctx, conn, t)
	if namespaceMissing(err, t.Namespace) {
		// No namespace: helm fails with its own message; there is nothing
		// to lock or recover.
		return op()
	}
	if err != nil {
		return err
	}
	chaos.Point("after-lock")
	r := &run{g: g, t: t, conn: conn, held: held, opDone: make(chan struct{}), ended: make(chan struct{})}
	err = r.do(ctx, op)
	var coded *exitcode.Error
	if err != nil && errors.Is(err, protocol.ErrLost) && !errors.As(err, &coded) {
		// Lost before helm ran (while recovering, or recording the
		// revision): the documented code, as after.
		err = r.lost(err)
	}
	return err
}

// take takes the release's lock (protocol.Conn.Take), waiting up to
// --lock-timeout for a live holder.
func (g *Guard) take(ctx context.Context, conn *protocol.Conn, t Target) (*protocol.Lock, error) {
	// helm's writes to the sql driver's database are fenced by the
	// session its connection string names (the CLI put this one there
	// before helm opened it): make sure it arrived.
	if err := conn.CheckSQLSession(ctx, g.Session); errors.Is(err, protocol.ErrNoSQLSession) {
		return nil, &exitcode.Error{Code: exitcode.Usage, Err: fmt.Errorf("release %q in namespace %q: HELM_DRIVER=sql: %w", t.Release, t.Namespace, err)}
	} else if err != nil {
		return nil, fmt.Errorf("release %q in namespace %q: HELM_DRIVER=sql: %w", t.Release, t.Namespace, err)
	}
	maxHold := g.Options.LockMaxHold
	if maxHold == 0 {
		maxHold = DefaultMaxHold(t.Timeout)
	}
	// A signal while waiting, or the end of helm when this is its plugin,
	// leaves the queue at once (rather than holding a place in it until the
	// entry's lease runs out) and ends the command.
	var interrupted atomic.Bool
	var p *progress
	wait := max(g.Options.LockTimeout, 0)
	if g.Options.Preempt {
		wait = g.Options.PreemptWait(t.Timeout)
	}
	waitCtx := func(ctx context.Context) (context.Context, context.CancelFunc) {
		p = newProgress(g.Stderr, g.Clock, wait)
		p.preempt = g.Options.Preempt
		signals := make(chan os.Signal, 1)
		signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
		wctx, cancel := context.WithCancel(ctx)
		stop := make(chan struct{})
		go func() {
			select {
			case <-signals:
			case <-parentwatch.Gone():
			case <-stop:
				return
			}
			interrupted.Store(true)
			cancel()
		}()
		return wctx, func() { p.done(); signal.Stop(signals); close(stop); cancel() }
	}
	req := protocol.Request{
		Release:       t.Release,
		Namespace:     t.Namespace,
		Operation:     t.Op,
		Backend:       g.Options.LockBackend,
		Timeout:       t.Timeout,
		LeaseDuration: g.Options.LeaseDuration,
		MaxHold:       maxHold,
		Session:       g.Session,
		Wait:          wait,
		Preempt:       g.Options.Preempt,
		WaitContext:   waitCtx,
		OnConfirm:     confirmNotice(g.Stderr, t.Release, t.Namespace),
		OnWait:        func(h *protocol.Record, left time.Duration) { p.update(h, left) },
		Fence:         g.Fence,
	}
	held, err := conn.Take(ctx, req)
	if err == nil {
		return held, nil
	}
	if interrupted.Load() && ctx.Err() == nil {
		return nil, &exitcode.Error{Code: exitcode.Interrupted, Err: fmt.Errorf("release %q in namespace %q: interrupted while waiting for the lock; nothing was written: %w", t.Release, t.Namespace, err)}
	}
	return nil, lockError(err, t, g.Options.LockBackend)
}

// lockError gives a failure to take the lock its exit code. chosen is
// --lock-backend as given.
func lockError(err error, t Target, chosen string) error {
	if le, ok := protocol.IsLocked(err); ok {
		le.HolderNotRunning = le.State == protocol.Live && holderNotRunningHere(le.Holder)
		return &exitcode.Error{Code: exitcode.Locked, Err: err}
	}
	if _, ok := errors.AsType[*protocol.BackendError](err); ok {
		return &exitcode.Error{Code: exitcode.Usage, Err: fmt.Errorf("release %q in namespace %q: --lock-backend=%s: %w", t.Release, t.Namespace, chosen, err)}
	}
	if errors.Is(err, protocol.ErrLost) {
		// A part taken first was lost while a later one was taken.
		return lostError(t.Release, t.Namespace, err)
	}
	return err
}

// namespaceMissing reports whether err is the API server saying that
// namespace ns does not exist (a write into it was refused).
func namespaceMissing(err error, ns string) bool {
	var st apierrors.APIStatus
	if err == nil || !errors.As(err, &st) {
		return false
	}
	s := st.Status()
	return s.Reason == metav1.StatusReasonNotFound && s.Details != nil && s.Details.Kind == "namespaces" && s.Details.Name == ns
}

// ensureNamespace creates the namespace when the operation asks for it and
// reports whether it exists.
func (g *Guard) ensureNamespace(ctx context.Context, client kubernetes.Interface, t Target) (bool, error) {
	_, err := client.CoreV1().Namespaces().Get(ctx, t.Namespace, metav1.GetOptions{})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsForbidden(err):
		// Users with rights in their namespace only: assume it exists.
		return true, nil
	case !apierrors.IsNotFound(err):
		return false, fmt.Errorf("release %q: reading namespace %q: %w", t.Release, t.Namespace, err)
	case !t.CreateNamespace:
		return false, nil
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: t.Namespace}}
	_, err = client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return false, fmt.Errorf("release %q: creating namespace %q: %w", t.Release, t.Namespace, err)
	}
	return true, nil
}

// run is one guarded operation.
type run struct {
	g    *Guard
	t    Target
	conn *protocol.Conn
	held *protocol.Lock

	// exitOnce makes sure only one path ends the process.
	exitOnce sync.Once
	opDone   chan struct{}
	// endMu orders the end of helm's operation (opDone) with the start of
	// the first signal's clean-up (ending): once that has started, it ends
	// the process, and do waits for it (ended) rather than end the
	// process itself with helm's own error.
	endMu  sync.Mutex
	ending bool
	ended  chan struct{}
	// guarded is the sequence do runs (protocol.Lock.Run); the paths that
	// end the process before it returns give the lock back through it too
	// (end).
	guarded protocol.Guarded
	// interrupted is set once a first SIGINT or SIGTERM arrived.
	interrupted atomic.Bool
	// background counts writes that run beside helm's operation (the
	// recovery Event); do waits for them before it returns.
	background sync.WaitGroup
	// noRevision is set when the release had no stored revision when the
	// lock was taken: if the operation fails without writing one (an
	// upgrade, rollback or uninstall of a release that does not exist), the
	// lock is deleted rather than released, so nothing is left behind.
	noRevision bool
}

func (r *run) do(ctx context.Context, op func() error) (err error) {
	defer r.background.Wait()
	stopSignals := func() {}
	defer func() { stopSignals() }()
	var rollback func(string, int) error
	if r.g.Rollback != nil {
		rollback = func(release string, revision int) error { return r.g.Rollback(ctx, r.held, release, revision) }
	}
	r.guarded = protocol.Guarded{
		Procedure: protocol.Procedure{
			Policy:     r.g.Options.policy(),
			Next:       r.t.Op,
			Rollback:   rollback,
			Log:        r.g.Stderr,
			DeleteData: r.g.Options.RecoverDeleteData,
		},
		Decided: func(out protocol.Outcome) error { return r.decided(ctx, out) },
		Op: func(ctx context.Context) error {
			select {
			case <-parentwatch.Gone():
				// helm ended while the lock was being taken: do not start.
				return &exitcode.Error{Code: exitcode.Interrupted, Err: fmt.Errorf("release %q in namespace %q: interrupted by %s before the operation started; nothing was written by it", r.t.Release, r.t.Namespace, parentEnded{})}
			default:
			}
			// The signal contract holds until the process ends: through
			// the release of the lock too.
			stopSignals = r.handleSignals()
			return r.operate(ctx, op)
		},
		OnLost: r.onLost,
		Releasing: func(ctx context.Context, err error) bool {
			chaos.Point("before-release")
			return (err == nil && r.t.DeleteLock) || (err != nil && r.stillNoRevision(ctx))
		},
		Released:    r.released,
		Log:         r.g.Stderr,
		Preemptible: true,
		Preempted:   r.preempted,
		Declined:    r.declined,
	}
	err = r.held.Run(ctx, r.guarded)
	if p, ok := errors.AsType[*protocol.PreemptedError](err); ok && !r.interrupted.Load() {
		// Helm ended after the fence was closed for a waiter's request to
		// stop (--preempt), before its revision was settled (helm's
		// install returns success when its last record write is refused,
		// and fails on any other refused write): preempted, whatever
		// helm said (protocol.Lock.Run).
		r.sayStopping(p)
		return &exitcode.Error{Code: exitcode.Preempted, Err: err}
	}
	if err != nil && r.interrupted.Load() {
		// Helm's install and upgrade handle the first signal themselves
		// (they cancel, mark the release failed and return an error); the
		// process must still end with the documented interrupted code.
		return &exitcode.Error{Code: exitcode.Interrupted, Err: err}
	}
	return err
}

// operate runs helm's operation and gives its error the documented exit
// code.
func (r *run) operate(ctx context.Context, op func() error) error {
	err := op()
	// A request to stop (--preempt) from now on finds nothing to stop.
	r.held.OperationEnded()
	r.endMu.Lock()
	close(r.opDone)
	ending := r.ending
	r.endMu.Unlock()
	if ending {
		// The first signal's clean-up is under way: it marks the
		// revision failed, gives the lock back and ends the process. helm
		// may have returned sooner than it because the clean-up closed
		// the write fence under it.
		<-r.ended
		if p := r.held.Preempted(); p != nil && !r.interrupted.Load() {
			return &exitcode.Error{Code: exitcode.Preempted, Err: p}
		}
		if err == nil {
			err = fmt.Errorf("release %q in namespace %q: interrupted as the operation ended", r.t.Release, r.t.Namespace)
		}
		return &exitcode.Error{Code: exitcode.Interrupted, Err: err}
	}
	if err != nil && r.held.Fence().CreateConflict() {
		// Another client created the revision this operation was about to
		// write: it holds the release (a first install raced with ours).
		err = &exitcode.Error{Code: exitcode.Locked, Err: fmt.Errorf("release %q in namespace %q is locked: another client wrote its next revision first (%w); wait for it with --lock-timeout=DURATION, or list locks with \"helm-autorecover locks\": %w", r.t.Release, r.t.Namespace, protocol.ErrLocked, err)}
	}
	var coded *exitcode.Error
	switch {
	case err == nil:
	case errors.Is(err, protocol.ErrLost) && !errors.As(err, &coded):
		// The fence refused helm's write: the lock was lost or taken
		// over (helm wraps the refusal in its own error).
		err = r.lost(err)
	case protocol.SQLRefused(err):
		// The sql driver's database refused helm's write: this session
		// no longer holds the release's lock row.
		err = r.lost(fmt.Errorf("%w: %w", protocol.ErrLost, err))
	case !errors.As(err, &coded):
		err = r.failed(err)
	}
	return err
}

// history reads every stored revision of the release. With a driver that
// keeps no record (memory) it is empty.
func (r *run) history(ctx context.Context) ([]helmx.Summary, error) {
	if _, err := r.conn.Records(); err != nil {
		return nil, nil
	}
	return r.conn.History(ctx, r.t.Namespace, r.t.Release)
}

// decided says what recovery's outcome (protocol.Lock.Run) means for this
// command: a blocked release ends it with exit code 5 (unless stock helm's
// manual way out stays open), a recovery is said on stderr and in an Event.
func (r *run) decided(ctx context.Context, out protocol.Outcome) error {
	dec := out.Decision
	switch dec.Verdict {
	case recovery.Blocked:
		if !r.g.Options.Autorecover && !dec.HolderMayWrite && (r.t.Op == protocol.OpRollback || r.t.Op == protocol.OpUninstall) {
			// Stock helm's manual way out of a stuck release stays open
			// when the user turned recovery off.
			break
		}
		return &exitcode.Error{Code: exitcode.Pending, Err: errors.New(dec.Reason)}
	case recovery.Recover, recovery.RecoverThenRollback:
		fmt.Fprintf(r.g.Stderr, "helm-autorecover: recovered: %s\n", out.Said())
		// The Event is for people reading later: it is written beside
		// helm's operation rather than before it (run.do waits for it).
		target, reason, session := dec.Target.Release, out.Said(), r.held.Session()
		recs, _ := r.conn.Records()
		r.background.Add(1)
		go func() {
			defer r.background.Done()
			if err := events.AutoRecovered(context.WithoutCancel(ctx), r.conn.Client(), recs, target, reason, session, out.At); err != nil {
				fmt.Fprintf(r.g.Stderr, "helm-autorecover: warning: %v\n", err)
			}
		}()
	case recovery.NoRelease, recovery.Proceed:
	}
	if _, err := r.conn.Records(); err == nil && out.Latest == 0 {
		r.noRevision = true
	}
	return nil
}

// end gives the lock back before the process ends on a path that does not
// wait for helm's operation (a signal, the fail-stop), as do would.
func (r *run) end() {
	r.held.End(context.Background(), r.guarded, errors.New("the operation was stopped"))
}

// released says what the release of the lock did about revisions of this
// holder's own, and warns when it failed (the lock then runs out by
// itself).
func (r *run) released(err error) {
	for _, msg := range r.held.Resolved() {
		fmt.Fprintf(r.g.Stderr, "helm-autorecover: %s\n", msg)
	}
	if err != nil {
		fmt.Fprintf(r.g.Stderr, "helm-autorecover: warning: releasing the lock of release %q in namespace %q: %v (it expires by itself within %s)\n",
			r.t.Release, r.t.Namespace, err, r.g.Options.LeaseDuration)
	}
}

// stillNoRevision reports whether a release that had no stored revision
// when the lock was taken still has none (one more read, on the failure
// path only).
func (r *run) stillNoRevision(ctx context.Context) bool {
	if !r.noRevision {
		return false
	}
	hist, err := r.history(ctx)
	return err == nil && len(hist) == 0
}

// failed is helm's error for an operation that failed under the lock: its
// first line is helm's own, as stock helm prints it (many do not name the
// release or its namespace: a server's 503, an unreachable cluster); a
// second line names both and says what this tool leaves behind.
func (r *run) failed(err error) error {
	return &opFailure{err: err, note: fmt.Sprintf("helm-autorecover: the %s of release %q in namespace %q failed (above); this command gives the release's lock back as it ends; see where the release stands with: helm history %s -n %s",
		r.t.Op, r.t.Release, r.t.Namespace, r.t.Release, r.t.Namespace)}
}

// opFailure is helm's error followed by a line of this tool's.
type opFailure struct {
	err  error
	note string
}

func (e *opFailure) Error() string { return e.err.Error() + "\n" + e.note }
func (e *opFailure) Unwrap() error { return e.err }

func (r *run) lost(err error) error { return lostError(r.t.Release, r.t.Namespace, err) }

// lostError is err, a loss of the lock of release in namespace, with its
// documented exit code (LockLost).
func lostError(release, namespace string, err error) error {
	return &exitcode.Error{Code: exitcode.LockLost, Err: fmt.Errorf("release %q in namespace %q: %w", release, namespace, err)}
}
