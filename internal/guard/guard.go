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

	"github.com/helm-autorecover/helm-autorecover/internal/events"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
	"github.com/helm-autorecover/helm-autorecover/internal/version"
)

// Target is one mutating operation on one release.
type Target struct {
	Op        lock.Operation
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
}

// Run takes the lock for t, recovers the release when the recovery decision
// allows it, runs op, and gives the lock back. While op runs the lock is
// renewed; if it cannot be, the process exits (fail-stop) before helm
// writes again.
func (g *Guard) Run(ctx context.Context, t Target, op func() error) error {
	if err := g.Options.Validate(); err != nil {
		return &ExitError{Code: ExitUsage, Err: err}
	}
	est := servertime.New(g.Clock)
	client, err := kubernetes.NewForConfig(est.Instrument(g.Config))
	if err != nil {
		return fmt.Errorf("release %q in namespace %q: kubernetes client: %w", t.Release, t.Namespace, err)
	}
	if ok, err := g.ensureNamespace(ctx, client, t); err != nil {
		return err
	} else if !ok {
		// No namespace: helm fails with its own message; there is nothing
		// to lock or recover.
		return op()
	}

	backend, backends, err := g.backends(ctx, client, est, g.Clock, t.Namespace)
	if err != nil {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("release %q in namespace %q: %w", t.Release, t.Namespace, err)}
	}
	maxHold := g.Options.LockMaxHold
	if maxHold == 0 {
		maxHold = DefaultMaxHold(t.Timeout)
	}
	req := lock.Request{
		Release:       t.Release,
		Namespace:     t.Namespace,
		Operation:     t.Op,
		Timeout:       t.Timeout,
		LeaseDuration: g.Options.LeaseDuration,
		MaxHold:       maxHold,
		ToolVersion:   version.Version,
		Backend:       backend,
		Session:       lock.NewSession(),
	}
	held, err := g.acquire(ctx, backends, req)
	if err != nil {
		return err
	}
	r := &run{g: g, t: t, client: client, est: est, held: held, opDone: make(chan struct{})}
	// The sql driver keeps no Kubernetes record: the lock (a Lease) still
	// excludes other clients, but there is no history here to recover.
	r.records, r.recordsErr = helmx.NewRecords(client, g.HelmDriver)
	return r.do(ctx, op)
}

func (g *Guard) acquire(ctx context.Context, backends []*lock.LeaseBackend, req lock.Request) (*lock.Joint, error) {
	held, err := lock.AcquireJoint(ctx, req, false, nil, backends...)
	if err == nil {
		return held, nil
	}
	if !errors.Is(err, lock.ErrLocked) || g.Options.LockTimeout <= 0 {
		return nil, lockError(err, req)
	}
	// A signal while waiting leaves the queue at once (rather than holding a
	// place in it until the entry's lease runs out) and ends the command.
	sctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	wctx, cancel := context.WithTimeout(sctx, g.Options.LockTimeout)
	defer cancel()
	p := newProgress(g.Stderr, g.Clock, g.Options.LockTimeout)
	held, err = lock.AcquireJoint(wctx, req, true, p.update, backends...)
	p.done()
	if err != nil {
		if sctx.Err() != nil && ctx.Err() == nil {
			return nil, &ExitError{Code: ExitInterrupted, Err: fmt.Errorf("release %q in namespace %q: interrupted while waiting for the lock; nothing was written: %w", req.Release, req.Namespace, err)}
		}
		return nil, lockError(err, req)
	}
	return held, nil
}

func lockError(err error, req lock.Request) error {
	if errors.Is(err, lock.ErrLocked) {
		return &ExitError{Code: ExitLocked, Err: err}
	}
	if apierrors.IsForbidden(err) {
		var se apierrors.APIStatus
		what := "its lock"
		if errors.As(err, &se) && se.Status().Details != nil {
			what = se.Status().Details.Kind
		}
		need := "get, list, watch and update on secrets (or configmaps with HELM_DRIVER=configmap)"
		if req.Backend == BackendLease {
			need = "get, list, watch, create, update and delete on leases (coordination.k8s.io), and " + need + ","
		}
		return fmt.Errorf("%w; --lock-backend=%s needs %s in the release's namespace (denied: %s): see docs/rbac.md for the minimal Role, or use --lock-backend=auto", err, req.Backend, need, what)
	}
	return err
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
	g      *Guard
	t      Target
	client kubernetes.Interface
	est    *servertime.Estimator
	held   *lock.Joint
	// records are helm's release records (Secrets or ConfigMaps); recordsErr
	// is set when the storage driver keeps none (sql).
	records    helmx.Records
	recordsErr error

	// exitOnce makes sure only one path ends the process.
	exitOnce sync.Once
	opDone   chan struct{}
	// interrupted is set once a first SIGINT or SIGTERM arrived.
	interrupted atomic.Bool
	// background counts writes that run beside helm's operation (the
	// recovery Event); do waits for them before it returns.
	background sync.WaitGroup
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
	if r.g.Fence != nil {
		stopFence := r.g.Fence.Guard(helmx.GuardedWrites{
			Namespace: r.t.Namespace, Release: r.t.Release,
			Resource: r.records.Resource(), Lock: r.held,
		})
		defer stopFence()
	}

	latest, err := r.recover(ctx)
	if err != nil {
		// The revision an expired holder left pending may still be
		// pending: the record left behind hands it on, so that the next
		// client recovers it at once.
		stopKeep()
		r.releaseAbandoning()
		released = true
		return err
	}
	if err := r.recordRevision(ctx, latest); err != nil {
		return err
	}

	stopSignals := r.handleSignals()
	defer stopSignals()

	err = op()
	close(r.opDone)
	if err != nil && r.g.Fence != nil && r.g.Fence.CreateConflict() {
		// Another client created the revision this operation was about to
		// write: it holds the release (a first install raced with ours).
		err = &ExitError{Code: ExitLocked, Err: fmt.Errorf("release %q in namespace %q is locked: another client wrote its next revision first (%w); wait for it with --lock-timeout=DURATION, or list locks with \"helm-autorecover locks\": %w", r.t.Release, r.t.Namespace, lock.ErrLocked, err)}
	}
	stopKeep()
	r.release(err == nil)
	released = true
	if err != nil && r.interrupted.Load() {
		// Helm's install and upgrade handle the first signal themselves
		// (they cancel, mark the release failed and return an error); the
		// process must still end with the documented interrupted code.
		return &ExitError{Code: ExitInterrupted, Err: err}
	}
	return err
}

// history reads every stored revision of the release, with their
// resourceVersions. With a driver that keeps no Kubernetes record (sql) it
// is empty: there is nothing this process can read or recover.
func (r *run) history(ctx context.Context) ([]helmx.Summary, error) {
	if r.recordsErr != nil {
		return nil, nil
	}
	return helmx.ReadHistory(ctx, r.records, r.t.Namespace, r.t.Release)
}

func (r *run) serverNow(ctx context.Context) (recovery.ServerTime, error) {
	b, ok := r.est.Now()
	if !ok {
		if err := r.est.Sync(ctx, r.client.Discovery()); err != nil {
			return recovery.ServerTime{}, fmt.Errorf("reading the API server's clock: %w", err)
		}
		b, _ = r.est.Now()
	}
	return recovery.ServerTime{Earliest: b.Earliest, Latest: b.Latest}, nil
}

// previousLock maps the record found when the lock was taken onto the
// recovery decision's input.
func (r *run) previousLock() recovery.LockInfo {
	return PreviousLock(r.held.Previous())
}

// PreviousLock maps the record a lock was taken from (lock.Joint.Previous),
// as found, onto the recovery decision's input.
func PreviousLock(prev *lock.Record, found lock.State) recovery.LockInfo {
	if prev == nil {
		return recovery.LockInfo{State: recovery.LockNone}
	}
	state := recovery.LockReleased
	if found == lock.Expired {
		state = recovery.LockExpired
	}
	return LockInfo(prev, state)
}

// LockInfo maps a lock record found in state onto the recovery decision's
// input; a nil record means no lock record at all. The guard, and the recover
// and unlock commands, all map through here so they judge alike.
func LockInfo(rec *lock.Record, state recovery.LockState) recovery.LockInfo {
	if rec == nil {
		return recovery.LockInfo{State: recovery.LockNone}
	}
	info := recovery.LockInfo{
		State:      state,
		Session:    rec.Session,
		Who:        rec.Who,
		Operation:  string(rec.Operation),
		Revision:   rec.Revision,
		AcquiredAt: rec.AcquiredAt,
		LockedTill: rec.LockedTill,
	}
	if rec.Revision > 0 {
		// The record's AcquiredAt is an upper bound of server time (up to
		// the Date header's second plus a round trip late), while the rule
		// that uses it needs a lower bound: a revision created in the same
		// server second as the acquisition was judged "written before the
		// lock" and left pending as legacy. When the holder recorded its
		// revision the check adds nothing: the guard records it only after
		// reading the history under the lock and finding nothing pending
		// (or recovering it), so a pending write on that revision happened
		// after the acquisition.
		info.AcquiredAt = time.Time{}
	}
	return info
}

// recover applies the recovery decision. Writes are conditional on the
// resourceVersion read; on a conflict the release is read again and the
// decision made again.
//
// It returns the highest revision stored once it is done, or -1 when it
// rolled the release back (a new revision whose number it did not read).
func (r *run) recover(ctx context.Context) (latest int, err error) {
	for attempt := 0; attempt < 5; attempt++ {
		hist, err := r.history(ctx)
		if err != nil {
			return 0, err
		}
		if n := len(hist); n > 0 {
			latest = hist[n-1].Revision
		}
		now, err := r.serverNow(ctx)
		if err != nil {
			return 0, fmt.Errorf("release %q in namespace %q: %w", r.t.Release, r.t.Namespace, err)
		}
		dec := recovery.Decide(recovery.Input{
			Release:   r.t.Release,
			Namespace: r.t.Namespace,
			History:   hist,
			Lock:      r.previousLock(),
			Now:       now,
			Policy:    r.g.Options.policy(),
		})
		switch dec.Verdict {
		case recovery.NoRelease, recovery.Proceed:
			return latest, nil
		case recovery.Blocked:
			if !r.g.Options.Autorecover && (r.t.Op == lock.OpRollback || r.t.Op == lock.OpUninstall) {
				// Stock helm's manual way out of a stuck release stays open
				// when the user turned recovery off.
				return latest, nil
			}
			return 0, &ExitError{Code: ExitPending, Err: errors.New(dec.Reason)}
		case recovery.Recover, recovery.RecoverThenRollback:
			rollingBack := dec.Verdict == recovery.RecoverThenRollback && r.g.Rollback != nil && r.t.Op != lock.OpRollback
			// Undo what the abandoned revision applied before marking it
			// failed, so that a failure here leaves it pending and the next
			// attempt converges again. Rollback and uninstall diff against
			// the abandoned revision themselves.
			if !rollingBack && (r.t.Op == lock.OpUpgrade || r.t.Op == lock.OpInstall) {
				if err := r.converge(ctx, dec.Target.Release); err != nil {
					return 0, err
				}
			}
			conflict, err := r.markAbandoned(ctx, dec, now)
			if err != nil {
				return 0, err
			}
			if conflict {
				continue
			}
			fmt.Fprintf(r.g.Stderr, "helm-autorecover: recovered: %s\n", dec.Reason)
			// The Event is for people reading later: it is written beside
			// helm's operation rather than before it (run.do waits for it).
			target, reason, session := dec.Target.Release, dec.Reason, r.held.Session()
			r.background.Add(1)
			go func() {
				defer r.background.Done()
				if err := events.AutoRecovered(context.WithoutCancel(ctx), r.client, r.records, target, reason, session, now.Latest); err != nil {
					fmt.Fprintf(r.g.Stderr, "helm-autorecover: warning: %v\n", err)
				}
			}()
			if rollingBack {
				fmt.Fprintf(r.g.Stderr, "helm-autorecover: rolling release %q back to revision %d (--recover-strategy=rollback)\n", r.t.Release, dec.RollbackTo)
				if err := r.g.Rollback(r.t.Release, dec.RollbackTo); err != nil {
					return 0, fmt.Errorf("release %q in namespace %q: rollback to revision %d after recovery: %w", r.t.Release, r.t.Namespace, dec.RollbackTo, err)
				}
				return -1, nil
			}
			return latest, nil
		}
	}
	return 0, fmt.Errorf("release %q in namespace %q: other writers kept changing the release during recovery; try again", r.t.Release, r.t.Namespace)
}

// converge undoes what the abandoned revision applied (fields it changed,
// objects it created) so that helm's operation starts from the last
// deployed state; see recovery.ConvergeAbandoned.
func (r *run) converge(ctx context.Context, abandoned helmx.Summary) error {
	rep, err := recovery.ConvergeAbandoned(ctx, r.g.Config, r.records, abandoned,
		recovery.ConvergeOptions{BeforeWrite: r.held.Valid})
	if rep.Notable() || err != nil {
		fmt.Fprintf(r.g.Stderr, "helm-autorecover: %s\n", rep.Summary())
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, recovery.ErrFenced):
		return r.lost(err)
	default:
		return fmt.Errorf("release %q in namespace %q: undoing what abandoned revision %d applied failed, so helm's %s did not run (it would keep those leftovers); the revision stays pending and the next attempt retries: %w",
			r.t.Release, r.t.Namespace, abandoned.Revision, r.t.Op, err)
	}
}

// markAbandoned marks the decision's target and strays failed. It reports
// conflict when a revision changed since it was read.
func (r *run) markAbandoned(ctx context.Context, dec recovery.Decision, now recovery.ServerTime) (conflict bool, err error) {
	if err := r.held.Valid(); err != nil {
		return false, r.lost(err)
	}
	by := recovery.Recoverer{Session: r.held.Session(), At: now.Latest}
	for _, a := range append([]recovery.Abandonment{dec.Target}, dec.Stray...) {
		desc := recovery.DescribeAbandoned(a, by)
		_, err := recovery.MarkFailed(ctx, r.records, r.t.Namespace, a.Release, desc, now.Latest)
		switch {
		case err == nil, errors.Is(err, recovery.ErrNotPending):
		case errors.Is(err, recovery.ErrConflict):
			return true, nil
		default:
			return false, err
		}
	}
	return false, nil
}

// recordRevision writes into the lock record which revision the operation
// is about to write, so that whoever finds it abandoned can tell it is ours.
// latest is the highest revision recovery read, or -1 to read it again.
func (r *run) recordRevision(ctx context.Context, latest int) error {
	if latest < 0 {
		hist, err := r.history(ctx)
		if err != nil {
			return err
		}
		latest = 0
		if n := len(hist); n > 0 {
			latest = hist[n-1].Revision
		}
	}
	rev := latest + 1
	if r.t.Op == lock.OpUninstall {
		rev = latest
	}
	if err := r.held.SetRevision(ctx, rev); err != nil {
		return r.lost(err)
	}
	return nil
}

// release gives the lock back (and deletes it after a complete uninstall).
func (r *run) release(success bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	if success && r.t.DeleteLock {
		err = r.held.ReleaseAndDelete(ctx)
	} else {
		err = r.held.Release(ctx)
	}
	r.warnRelease(err)
}

func (r *run) warnRelease(err error) {
	if err != nil && !errors.Is(err, lock.ErrLost) {
		fmt.Fprintf(r.g.Stderr, "helm-autorecover: warning: releasing the lock of release %q in namespace %q: %v (it expires by itself within %s)\n",
			r.t.Release, r.t.Namespace, err, r.g.Options.LeaseDuration)
	}
}

// releaseAbandoning gives the lock back after recovery failed: when the lock
// was taken over from an expired holder, the record left names that holder
// (lock.Record.Abandoned).
func (r *run) releaseAbandoning() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r.warnRelease(r.held.ReleaseAfterFailedRecovery(ctx))
}

func (r *run) lost(err error) error {
	return &ExitError{Code: ExitLockLost, Err: fmt.Errorf("release %q in namespace %q: %w", r.t.Release, r.t.Namespace, err)}
}

// onLost is the fail-stop: the lock could not be renewed in time or was
// taken, so this process stops before helm writes the release again.
func (r *run) onLost(err error) {
	select {
	case <-r.opDone:
		return
	default:
	}
	if errors.Is(err, lock.ErrMaxHold) {
		r.exitOnce.Do(func() {
			fmt.Fprintf(r.g.Stderr, "Error: release %q in namespace %q: the operation held its lock longer than --lock-max-hold; aborting. Raise --lock-max-hold or --timeout if it legitimately takes this long.\n",
				r.t.Release, r.t.Namespace)
			r.abandonOwn("the operation exceeded --lock-max-hold")
			r.release(false)
			r.g.Exit(ExitMaxHold)
		})
		return
	}
	r.exitOnce.Do(func() {
		fmt.Fprintf(r.g.Stderr, "Error: release %q in namespace %q: lost the lock (%v); stopping before any further write. The next operation recovers the release once the lock has expired.\n",
			r.t.Release, r.t.Namespace, err)
		r.g.Exit(ExitLockLost)
	})
}

// abandonOwn marks the revision this operation was writing failed, if it is
// still pending, so a cancelled or aborted operation never leaves it pending.
func (r *run) abandonOwn(why string) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	if r.held.Valid() != nil {
		return
	}
	own := r.held.Record().Revision
	for attempt := 0; attempt < 3; attempt++ {
		hist, err := r.history(ctx)
		if err != nil || len(hist) == 0 {
			return
		}
		latest := hist[len(hist)-1]
		if latest.Revision < own || !recovery.IsPending(latest.Status) {
			return
		}
		now, _ := r.serverNow(ctx)
		desc := fmt.Sprintf("%s %s: %s (session %s at %s)", "Cancelled", latest.Status, why, r.held.Session(), now.Latest.UTC().Format(time.RFC3339))
		_, err = recovery.MarkFailed(ctx, r.records, r.t.Namespace, latest, desc, now.Latest)
		if !errors.Is(err, recovery.ErrConflict) {
			return
		}
	}
}

// handleSignals implements the signal contract: after a first SIGINT or
// SIGTERM the release ends failed and the lock is released within 5 s; a
// second signal exits at once (the lease then expires and the next
// operation recovers). Helm's own install and upgrade react to the first
// signal by cancelling and marking the release failed; for rollback and
// uninstall, which do not, and as a backstop, this marks it failed itself.
func (r *run) handleSignals() (stop func()) {
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	quit := make(chan struct{})
	go func() {
		var sig os.Signal
		select {
		case sig = <-ch:
		case <-quit:
			return
		}
		r.interrupted.Store(true)
		grace := 3 * time.Second
		if r.t.Op == lock.OpRollback || r.t.Op == lock.OpUninstall {
			grace = 0
		}
		timer := r.g.Clock.NewTimer(grace)
		select {
		case <-quit:
			return
		case <-ch:
			// Not through exitOnce: a second signal must end the process
			// at once even while another path (fail-stop) is cleaning up.
			r.g.Exit(ExitInterrupted)
			return
		case <-timer.C():
		}
		select {
		case <-r.opDone:
			return // helm handled it and the operation has ended
		default:
		}
		// Marking the release failed and releasing the lock can take up to
		// their timeouts when the API server is slow; they run aside so that
		// a second signal still ends the process at once.
		go r.exitOnce.Do(func() {
			r.abandonOwn("interrupted by " + sig.String())
			r.release(false)
			fmt.Fprintf(r.g.Stderr, "Error: release %q in namespace %q: interrupted by %s; the release is marked failed and its lock released\n",
				r.t.Release, r.t.Namespace, sig)
			r.g.Exit(ExitInterrupted)
		})
		select {
		case <-quit:
		case <-ch:
			r.g.Exit(ExitInterrupted)
		}
	}()
	return func() {
		signal.Stop(ch)
		close(quit)
	}
}
