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
	"github.com/helm-autorecover/helm-autorecover/internal/sqlstore"
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
	// Rollback rolls the release back to a revision, for
	// --recover-strategy=rollback. nil disables the strategy.
	Rollback func(release string, revision int) error
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
	if st := conn.SQL(); st != nil {
		// helm's writes to the sql driver's database are fenced by the
		// session its connection string names (the CLI put this one
		// there before helm opened it): make sure it arrived.
		if err := st.CheckSession(ctx, g.Session); errors.Is(err, sqlstore.ErrNoSession) {
			return nil, &exitcode.Error{Code: exitcode.Usage, Err: fmt.Errorf("release %q in namespace %q: HELM_DRIVER=sql: %w", t.Release, t.Namespace, err)}
		} else if err != nil {
			return nil, fmt.Errorf("release %q in namespace %q: HELM_DRIVER=sql: %w", t.Release, t.Namespace, err)
		}
	}
	maxHold := g.Options.LockMaxHold
	if maxHold == 0 {
		maxHold = DefaultMaxHold(t.Timeout)
	}
	// A signal while waiting, or the end of helm when this is its plugin,
	// leaves the queue at once (rather than holding a place in it until the
	// entry's lease runs out) and ends the command.
	var interrupted func() bool
	var p *progress
	waitCtx := func(ctx context.Context) (context.Context, context.CancelFunc) {
		p = newProgress(g.Stderr, g.Clock, g.Options.LockTimeout)
		sctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		sctx, stopParent := context.WithCancel(sctx)
		go func() {
			select {
			case <-parentwatch.Gone():
				stopParent()
			case <-sctx.Done():
			}
		}()
		interrupted = func() bool { return sctx.Err() != nil && ctx.Err() == nil }
		return sctx, func() { p.done(); stopParent(); stopSignals() }
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
		Wait:          max(g.Options.LockTimeout, 0),
		WaitContext:   waitCtx,
		OnConfirm:     confirmNotice(g.Stderr, t.Release, t.Namespace),
		OnWait:        func(h *protocol.Record, left time.Duration) { p.update(h, left) },
		Fence:         g.Fence,
	}
	held, err := conn.Take(ctx, req)
	if err == nil {
		return held, nil
	}
	if interrupted != nil && interrupted() {
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
	// deferred are the objects only the abandoned revision rendered, which
	// recovery left for after the operation (protocol.Conn.RemoveDeferred);
	// nil on the happy path.
	deferred *recovery.Deferred
}

func (r *run) do(ctx context.Context, op func() error) (err error) {
	defer r.background.Wait()
	released := false
	defer func() {
		if !released {
			r.release(err == nil)
		}
	}()
	// Renew from the start: recovery (and undoing what an abandoned revision
	// applied) can take longer than a short lease.
	keepCtx, stopKeep := context.WithCancel(context.Background())
	defer stopKeep()
	go r.held.Keep(keepCtx, r.onLost)

	latest, err := r.recover(ctx)
	if _, rerr := r.conn.Records(); err == nil && rerr == nil && latest == 0 {
		r.noRevision = true
	}
	if err != nil {
		// The lock's release hands an expired holder's revision, still
		// pending, on to the next client (protocol.Lock.Release).
		return err
	}
	if err := r.recordRevision(ctx, latest); err != nil {
		return err
	}

	select {
	case <-parentwatch.Gone():
		// helm ended while the lock was being taken: do not start.
		return &exitcode.Error{Code: exitcode.Interrupted, Err: fmt.Errorf("release %q in namespace %q: interrupted by %s before the operation started; nothing was written by it", r.t.Release, r.t.Namespace, parentEnded{})}
	default:
	}
	stopSignals := r.handleSignals()
	defer stopSignals()

	err = op()
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
	case sqlstore.IsRefused(err):
		// The sql driver's database refused helm's write: this session
		// no longer holds the release's lock row.
		err = r.lost(fmt.Errorf("%w: %w", protocol.ErrLost, err))
	case !errors.As(err, &coded):
		err = r.failed(err)
	}
	if err == nil && r.conn.SQL() != nil {
		err = r.checkSQLWritten(ctx)
	}
	if err != nil && r.conn.SQL() != nil {
		// No write of helm's to the sql driver's database is seen here
		// (the write fence sees the API server's): a failed operation may
		// have left its own revision pending, which the release reads and
		// marks failed while it still holds the lock.
		r.held.OwnRecordWrite(r.held.Record().Revision, false)
	}
	if derr := r.removeDeferred(ctx); derr != nil && err == nil {
		err = derr
	}
	stopKeep()
	r.release(err == nil)
	released = true
	if err != nil && r.interrupted.Load() {
		// Helm's install and upgrade handle the first signal themselves
		// (they cancel, mark the release failed and return an error); the
		// process must still end with the documented interrupted code.
		return &exitcode.Error{Code: exitcode.Interrupted, Err: err}
	}
	return err
}

// checkSQLWritten reads the revision a successful operation wrote to the
// sql driver's database: helm's sql driver ignores a failed commit of its
// create (the server ended the transaction, a failover), and would report
// success for a revision that was never stored, or left pending. An
// uninstall removes rows instead, and is not checked.
func (r *run) checkSQLWritten(ctx context.Context) error {
	rev := r.held.Record().Revision
	recs, rerr := r.conn.Records()
	if r.t.Op == protocol.OpUninstall || rev <= 0 || rerr != nil {
		return nil
	}
	rec, err := recs.Get(ctx, r.t.Namespace, helmx.ReleaseSecretName(r.t.Release, rev))
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("release %q in namespace %q: helm reported success, but revision %d is not in its sql database (helm's sql driver ignores a failed commit); check the release with helm history %s -n %s before the next operation",
			r.t.Release, r.t.Namespace, rev, r.t.Release, r.t.Namespace)
	}
	if err != nil {
		fmt.Fprintf(r.g.Stderr, "helm-autorecover: release %q in namespace %q: could not read back revision %d from the sql database: %v\n", r.t.Release, r.t.Namespace, rev, err)
		return nil
	}
	if s, err := helmx.SummarizeRecord(rec); err == nil && recovery.IsPending(s.Status) {
		// The failed operation's path then resolves it while the lock is
		// held (OwnRecordWrite).
		return fmt.Errorf("release %q in namespace %q: helm reported success, but revision %d is still %s in its sql database (a write of helm's did not land)",
			r.t.Release, r.t.Namespace, rev, s.Status)
	}
	return nil
}

// history reads every stored revision of the release. With a driver that
// keeps no record (memory) it is empty.
func (r *run) history(ctx context.Context) ([]helmx.Summary, error) {
	if _, err := r.conn.Records(); err != nil {
		return nil, nil
	}
	return r.conn.History(ctx, r.t.Namespace, r.t.Release)
}

// recover runs the one recovery procedure (protocol.Lock.Recover) before
// helm's operation and says what its outcome means for this command.
//
// It returns the highest revision stored once it is done, or -1 when it
// rolled the release back (a new revision whose number it did not read).
func (r *run) recover(ctx context.Context) (latest int, err error) {
	if _, err := r.conn.Records(); err != nil {
		return 0, nil // memory: nothing here to recover
	}
	out, err := r.held.Recover(ctx, protocol.Procedure{
		Policy:     r.g.Options.policy(),
		Next:       r.t.Op,
		Rollback:   r.g.Rollback,
		Log:        r.g.Stderr,
		DeleteData: r.g.Options.RecoverDeleteData,
	})
	if err != nil {
		if errors.Is(err, protocol.ErrLost) {
			return 0, r.lost(err)
		}
		return 0, err
	}
	r.deferred = out.Converged.Deferred
	dec := out.Decision
	switch dec.Verdict {
	case recovery.Blocked:
		if !r.g.Options.Autorecover && !dec.HolderMayWrite && (r.t.Op == protocol.OpRollback || r.t.Op == protocol.OpUninstall) {
			// Stock helm's manual way out of a stuck release stays open
			// when the user turned recovery off.
			return out.Latest, nil
		}
		return 0, &exitcode.Error{Code: exitcode.Pending, Err: errors.New(dec.Reason)}
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
	return out.Latest, nil
}

// removeDeferred removes, once helm's operation has run (successful or
// not), the objects only the abandoned revision rendered that the revision
// the operation wrote does not render, still under the lock. It does
// nothing on the happy path. A failure is a warning on stderr naming the
// objects left, except a lost lock, which is an error (exit 4). Helm's
// operation and its revision stand either way.
func (r *run) removeDeferred(ctx context.Context) error {
	if r.deferred.Empty() {
		return nil
	}
	_, err := r.conn.RemoveDeferred(context.WithoutCancel(ctx), r.held, r.deferred, r.g.Stderr)
	switch {
	case err == nil, errors.Is(err, recovery.ErrNoNewRevision):
		// (the warning is written already)
		return nil
	case errors.Is(err, protocol.ErrLost):
		return r.lost(err)
	}
	fmt.Fprintf(r.g.Stderr, "helm-autorecover: warning: %v\n", err)
	return nil
}

// recordRevision writes into the lock record which revision the operation
// is about to write, so that whoever finds it abandoned can tell it is ours.
// latest is the highest revision recovery read, or -1 to read it again.
func (r *run) recordRevision(ctx context.Context, latest int) error {
	rev, err := r.held.NextRevision(ctx, r.t.Op, latest)
	if err != nil {
		return err
	}
	if err := r.held.SetRevision(ctx, rev); err != nil {
		return r.lost(err)
	}
	return nil
}

// release gives the lock back (and deletes it after a complete uninstall).
func (r *run) release(success bool) {
	chaos.Point("before-release")
	// (The release drains the fence first: no update of helm's that failed
	// is sent again after it.)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if (success && r.t.DeleteLock) || (!success && r.stillNoRevision(ctx)) {
		err = r.held.ReleaseAndDelete(ctx)
	} else {
		err = r.held.Release(ctx)
	}
	for _, msg := range r.held.Resolved() {
		fmt.Fprintf(r.g.Stderr, "helm-autorecover: %s\n", msg)
	}
	r.warnRelease(err)
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

func (r *run) warnRelease(err error) {
	if err != nil && !errors.Is(err, protocol.ErrLost) {
		fmt.Fprintf(r.g.Stderr, "helm-autorecover: warning: releasing the lock of release %q in namespace %q: %v (it expires by itself within %s)\n",
			r.t.Release, r.t.Namespace, err, r.g.Options.LeaseDuration)
	}
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
