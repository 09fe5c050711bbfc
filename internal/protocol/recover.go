package protocol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/chaos"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// Writer is the lock recovery writes under: Valid is asked before every
// write (nil: still held), and Session names the recovering session in the
// descriptions it writes.
type Writer interface {
	Valid() error
	Session() string
	// SetRevision records the revision helm's rollback is about to write,
	// so that whoever finds it abandoned recovers it at once.
	SetRevision(ctx context.Context, rev int) error
}

// Procedure describes one recovery: which release, what was found of its
// lock, the user's policy, and what follows it under the same lock.
type Procedure struct {
	Release   string
	Namespace string
	// Lock is the release's lock as found: what the lock was taken from
	// (Lock.Recover sets it), or as observed for a dry run.
	Lock   recovery.LockInfo
	Policy recovery.Policy
	// Next is the operation that runs under the same lock once recovery is
	// done; lock.OpRecover when none does (recover, unlock, the
	// controller, an embedder's Recover). It decides whether recovery
	// converges first (see converges).
	Next lock.Operation
	// Writer is the lock the writes are made under (Lock.Recover sets it);
	// nil decides and writes nothing (a dry run).
	Writer Writer
	// Describe writes the description of an abandoned revision; nil is
	// recovery.DescribeAbandoned. unlock names the person instead.
	Describe func(a recovery.Abandonment, by recovery.Recoverer) string
	// Rollback rolls the release back with helm's own action, for a
	// RecoverThenRollback verdict; nil leaves the release as marked (the
	// caller is told by the verdict). It runs under the lock, after the
	// abandoned revision was marked failed.
	Rollback func(release string, revision int) error
	// Log receives converge's summary when it did something notable or
	// failed, and a line when recovery waits for a holder whose lock was
	// released before it ran out; nil discards them.
	Log io.Writer
	// DeleteData lets recovery delete PersistentVolumeClaims,
	// CustomResourceDefinitions and Namespaces that only the abandoned
	// revision created (--recover-delete-data); they are kept otherwise.
	DeleteData bool
	// Preview, with no Writer (a dry run), also reads what undoing the
	// abandoned revision's changes would revert, delete or leave, and
	// reports it in Outcome.Converged (recovery.ConvergeOptions.DryRun);
	// without it a dry run reads only the history and the clock.
	Preview bool
}

// Outcome is what a recovery found and did.
type Outcome struct {
	// Decision is the last decision made (after a conflict, the release is
	// read and judged again).
	Decision recovery.Decision
	// Latest is the highest stored revision read, or -1 after a rollback
	// (a new revision whose number was not read).
	Latest int
	// Marked lists the revisions marked failed, in the order written.
	Marked []Mark
	// Converged reports what undoing the abandoned revision's changes did.
	// Before an upgrade or install, the objects only the abandoned revision
	// rendered are not removed yet: Converged.Deferred lists them, for
	// Conn.RemoveDeferred once that operation has written its revision.
	Converged recovery.ConvergeReport
	// RolledBack is set when Rollback ran and succeeded.
	RolledBack bool
	// NotRolledBack says why a RecoverThenRollback verdict was carried out
	// without its rollback (objects recovery keeps that helm's rollback
	// would delete or rewrite); empty otherwise.
	NotRolledBack string
	// At is the server time (upper bound) the recovery was judged at;
	// AtEarliest its lower bound.
	At, AtEarliest time.Time
}

// Said tells what the recovery did, for the Event, the log and the
// report: the decision as carried out, and why a rollback it called for was
// left out.
func (o Outcome) Said() string {
	if o.Decision.Verdict == recovery.RecoverThenRollback && !o.RolledBack && o.Decision.DoneMarked != "" {
		why := o.NotRolledBack
		if why == "" {
			why = "no rollback ran"
		}
		return o.Decision.DoneMarked + "; not rolled back: " + why
	}
	return o.Decision.Said(true)
}

// Mark is one revision recovery marked failed.
type Mark struct {
	recovery.Abandonment
	// Description is what was written into it; Record is its record as
	// written.
	Description string
	Record      helmx.Record
}

// Recovered reports whether the outcome marked anything failed.
func (o Outcome) Recovered() bool { return len(o.Marked) > 0 }

// ErrConflict: other writers kept changing the release while recovery read
// and wrote it; nothing was overwritten. Read again and decide again.
var ErrConflict = errors.New("the release kept changing during recovery")

// ErrRollback wraps a failure of helm's rollback after a recovery
// (--recover-strategy=rollback): the abandoned revision was marked failed
// (Outcome.Marked) and the release was set back to its last deployed state
// before the rollback ran; helm records its failed rollback as a failed
// revision. Retrying does not roll back again: the release is no longer
// pending.
var ErrRollback = errors.New("helm's rollback after recovery failed")

// ErrConverge wraps a failure to undo what the abandoned revision applied:
// the revision stays pending and the next attempt converges again.
var ErrConverge = errors.New("undoing what the abandoned revision applied failed")

// maxRecoverAttempts bounds how often recovery reads the release again after
// a concurrent write; each conflict means another writer made progress.
const maxRecoverAttempts = 5

// converges reports whether recovery undoes what the abandoned revision
// applied before next runs: helm's upgrade and install diff against the
// last deployed revision and would keep those leftovers, and with no
// operation to follow the release must end as it was last deployed; helm's
// rollback and uninstall diff against the abandoned revision themselves.
func converges(next lock.Operation) bool {
	switch next {
	case lock.OpUpgrade, lock.OpInstall, lock.OpRecover:
		return true
	case lock.OpRollback, lock.OpUninstall:
	}
	return false
}

// Recover is the one recovery procedure every entry point runs (the guard,
// the recover and unlock commands, pkg/autorecover, the controller): read
// the history and the server's clock, decide (recovery.Decide), and when the
// decision is to recover and p.Writer is set, undo what the abandoned
// revision applied (converge), mark it and older pending revisions failed
// (writes conditional on the resourceVersion read), and roll back when the
// strategy asks. A conflict reads and decides again, up to a bound. A
// revision whose holder's lock was released before it ran out (a person's
// unlock) is recovered only once that lock's LOCKED TILL has passed: the
// procedure waits for it, holding its own lock.
//
// A Blocked or Proceed decision is returned with a nil error: what it means
// for the caller is the caller's to say. Errors: lock.ErrLost when the lock
// was lost before a write (nothing more was written); ErrConverge when
// undoing the abandoned revision's changes failed (it stays pending); any
// other read or write failure.
func (c *Conn) Recover(ctx context.Context, p Procedure) (Outcome, error) {
	subject := fmt.Sprintf("release %q in namespace %q", p.Release, p.Namespace)
	describe := p.Describe
	if describe == nil {
		describe = recovery.DescribeAbandoned
	}
	var out Outcome
	// The first read under a lock is served as soon as the API server's
	// cache holds the take's own write (and so everything before it):
	// right after a write, a fully consistent list can wait for the cache
	// to confirm it is current (about 80 ms a read on the local cluster).
	// Reads after a conflict are consistent.
	floor := ""
	if f, ok := p.Writer.(interface{ ReadFloor() string }); ok {
		floor = f.ReadFloor()
	}
	// When the take found the newest record settled by its labels, that
	// record alone is read (its release data says the status helm goes
	// by; labels can be edited by hand): settled there too, the decision
	// needs no more (recovery.Decide's rule 2 looks at the newest
	// revision's status alone), and the whole history, every revision's
	// release data, is not read.
	settled, haveSettled := c.settledAtTake(ctx, p)
	for attempt := 0; attempt < maxRecoverAttempts; {
		var hist []helmx.Summary
		var err error
		if haveSettled {
			hist, haveSettled = settled, false
		} else {
			// A floored read that fails is read again consistently (records).
			hist, err = c.History(records.WithNotOlderThan(ctx, floor), p.Namespace, p.Release)
			floor = ""
		}
		if err != nil {
			return out, err
		}
		if n := len(hist); n > 0 {
			out.Latest = hist[n-1].Revision
		}
		now, err := c.ServerNow(ctx)
		if err != nil {
			return out, fmt.Errorf("%s: %w", subject, err)
		}
		out.At, out.AtEarliest = now.Latest, now.Earliest
		in := recovery.Input{
			Release:   p.Release,
			Namespace: p.Namespace,
			History:   hist,
			Lock:      p.Lock,
			Now:       recovery.ServerTime{Earliest: now.Earliest, Latest: now.Latest},
			Policy:    p.Policy,
		}
		out.Decision = recovery.Decide(in)
		if out.Decision.LookForWork {
			// A legacy revision old enough to recover: first look for
			// signs that its helm is still at work (rule 5).
			in.Work = c.lookForWork(ctx, p.Namespace, out.Decision.Target.Release)
			out.Decision = recovery.Decide(in)
		}
		dec := out.Decision
		if p.Writer != nil && dec.HolderMayWrite && dec.RetryAfter > 0 {
			// The holder's lock was released before it ran out (a person's
			// unlock): wait, holding the lock, until the holder has
			// certainly stopped writing, then read and decide again.
			if p.Log != nil {
				fmt.Fprintf(p.Log, "helm-autorecover: %s; waiting for it\n", dec.Reason)
			}
			if err := c.sleep(ctx, dec.RetryAfter); err != nil {
				return out, fmt.Errorf("%s: %w", subject, err)
			}
			continue
		}
		if dec.Verdict == recovery.Proceed && p.Writer != nil && defersRemovals(p.Next) {
			c.takeLeft(ctx, p, &out, hist)
		}
		if dec.Verdict != recovery.Recover && dec.Verdict != recovery.RecoverThenRollback {
			return out, nil
		}
		if p.Writer == nil {
			if p.Preview && converges(p.Next) {
				return out, c.converge(ctx, p, &out, dec.Target.Release)
			}
			return out, nil
		}
		// Undo what the abandoned revision applied before marking it failed,
		// so that a failure here leaves it pending and the next attempt
		// converges again. Before a rollback too: converge applies the keep
		// rules (data holders, adopted objects) that helm's rollback does
		// not, and a rollback that fails then leaves the last deployed state.
		if converges(p.Next) {
			if err := c.converge(ctx, p, &out, dec.Target.Release); err != nil {
				return out, err
			}
		}
		conflict, err := c.markAbandoned(ctx, p, &out, describe, now.Latest)
		if err != nil {
			return out, err
		}
		if conflict {
			attempt++
			continue
		}
		if dec.Verdict != recovery.RecoverThenRollback {
			return out, nil
		}
		held := out.Converged.HeldBack()
		if !defersRemovals(p.Next) && !out.Converged.Deferred.Empty() {
			// helm's rollback follows at once: it deletes what only the
			// abandoned revision rendered, by helm's rules. It may run only
			// when recovery's own rules would delete each of them too (a
			// dry run of their removal against the rollback's target);
			// otherwise everything stays, recorded for the next upgrade.
			held = c.rollbackKeeps(ctx, p, dec.Target.Release, held)
		}
		out.NotRolledBack = whyNotRolledBack(p, dec.RollbackTo, held)
		switch {
		case out.NotRolledBack != "" && p.Rollback == nil:
			// The caller rolls back itself (pkg/autorecover): told not to.
			out.Decision.Verdict, out.Decision.RollbackTo = recovery.Recover, 0
			out.Decision.Reason += "; not rolled back: " + out.NotRolledBack
		case out.NotRolledBack != "" && rollsBackBefore(p.Next) && p.Log != nil:
			fmt.Fprintf(p.Log, "helm-autorecover: release %q in namespace %q not rolled back: %s\n", p.Release, p.Namespace, out.NotRolledBack)
		}
		if out.NotRolledBack == "" && p.Rollback != nil {
			if err := p.Writer.Valid(); err != nil {
				return out, fmt.Errorf("%s: stopped before rolling back to revision %d: %w", subject, dec.RollbackTo, err)
			}
			// The lock names the revision helm's rollback writes: if this
			// process dies during it, the next client recovers that revision
			// at once, as an abandoned one, not as stock helm's.
			if err := p.Writer.SetRevision(ctx, out.Latest+1); err != nil {
				return out, fmt.Errorf("%s: stopped before rolling back to revision %d: %w", subject, dec.RollbackTo, err)
			}
			if p.Log != nil {
				fmt.Fprintf(p.Log, "helm-autorecover: rolling release %q back to revision %d, the last deployed\n", p.Release, dec.RollbackTo)
			}
			if err := p.Rollback(p.Release, dec.RollbackTo); err != nil {
				out.NotRolledBack = fmt.Sprintf("helm's rollback failed (%v); the release was set back to revision %d's state before it", err, dec.RollbackTo)
				return out, fmt.Errorf("%s: %w to revision %d: %w", subject, ErrRollback, dec.RollbackTo, err)
			}
			out.RolledBack = true
			out.Latest = -1
		}
		return out, nil
	}
	return out, fmt.Errorf("%s: other writers kept changing the release during recovery; try again: %w", subject, ErrConflict)
}

// settledAtTake returns, for the first recovery under p.Writer's lock, the
// history to decide from when its take says nothing is pending: empty when
// the take found no record; the newest record alone when the take found
// its status label settled (deployed, failed, superseded, uninstalled)
// and its release data, read now, says a settled status too. ok false
// otherwise (pending, unknown, unreadable, or a take that read no record):
// the whole history is read.
func (c *Conn) settledAtTake(ctx context.Context, p Procedure) (hist []helmx.Summary, ok bool) {
	n, isLock := p.Writer.(interface{ NewestAtTake() (helmx.Summary, bool) })
	if !isLock || c.recordsErr != nil {
		return nil, false
	}
	taken, ok := n.NewestAtTake()
	switch {
	case !ok:
		return nil, false
	case taken.Revision == 0:
		return nil, true
	case !lock.SettledStatus(string(taken.Status)):
		return nil, false
	}
	r, err := c.records.Get(ctx, p.Namespace, taken.RecordName)
	if err != nil {
		return nil, false
	}
	s, err := helmx.SummarizeRecord(r)
	if err != nil || s.Revision != taken.Revision || !lock.SettledStatus(string(s.Status)) {
		return nil, false
	}
	return []helmx.Summary{s}, true
}

// rollsBackBefore reports whether helm's rollback may run before next:
// before an upgrade, or on its own (a recovery). Before an install it would
// make the install refuse the name (in use); before a rollback or an
// uninstall it is undone at once.
func rollsBackBefore(next lock.Operation) bool {
	return next == lock.OpUpgrade || next == lock.OpRecover
}

// whyNotRolledBack says why helm's rollback to revision rollbackTo must not
// follow this recovery, "" when it may: another operation follows instead,
// or the rollback would delete or rewrite held, what recovery keeps (before
// an upgrade, what waits for the upgrade's revision: a rollback first would
// delete what the upgrade may render again).
func whyNotRolledBack(p Procedure, rollbackTo int, held []recovery.ObjectRef) string {
	switch {
	case !rollsBackBefore(p.Next):
		return fmt.Sprintf("helm's %s, the operation requested, follows instead", p.Next)
	case len(held) == 0:
		return ""
	case defersRemovals(p.Next):
		return fmt.Sprintf("helm's rollback would delete or rewrite %s, which wait for helm's %s to say whether it renders them again; the release was set back to revision %d's state instead, and the %s follows", recovery.ObjectList(held), p.Next, rollbackTo, p.Next)
	}
	return fmt.Sprintf("helm's rollback would delete or rewrite %s, which recovery keeps, or leaves for the next upgrade or install to settle; the release was set back to revision %d's state instead; once they are safe to lose, run helm rollback %s %d", recovery.ObjectList(held), rollbackTo, p.Release, rollbackTo)
}

// sleep waits d on the connection's clock, or until ctx ends.
func (c *Conn) sleep(ctx context.Context, d time.Duration) error {
	t := c.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
		return nil
	}
}

// converge undoes what the abandoned revision applied (fields it changed,
// objects it created), so that the release starts from its last deployed
// state; see recovery.ConvergeAbandoned. Before an upgrade or install the
// objects only the abandoned revision rendered stay until that operation
// has written its revision (Outcome.Converged.Deferred): it may render them
// again, and a delete-then-recreate loses a volume's data, a CRD's custom
// resources, a Namespace's contents, a LoadBalancer's address.
//
// With --recover-strategy=rollback before an upgrade or install, they are
// deferred too, and the rollback is left out (HeldBack): deleting them
// first would lose what the operation may render again.
func (c *Conn) converge(ctx context.Context, p Procedure, out *Outcome, abandoned helmx.Summary) error {
	// What only the abandoned revision rendered is never deleted before
	// the next upgrade or install has written its revision (recorded on
	// the abandoned one by markAbandoned): not with no operation to follow,
	// and not before helm's rollback either, which then is held back
	// (HeldBack): a Secret it generated may be what a database it started,
	// and that recovery keeps, was initialised with.
	opts := recovery.ConvergeOptions{DeferRemovals: true, DeleteData: p.DeleteData, DryRun: p.Writer == nil}
	if p.Writer != nil {
		opts.BeforeWrite = p.Writer.Valid
	}
	rep, err := recovery.ConvergeAbandoned(ctx, c.clusterAccess, c.records, abandoned, opts)
	out.Converged = rep
	if (rep.Notable() || err != nil) && p.Log != nil && !opts.DryRun {
		fmt.Fprintf(p.Log, "helm-autorecover: %s\n", rep.Summary())
	}
	switch {
	case err == nil:
		return nil
	case opts.DryRun:
		// A preview that cannot read or dry-run everything (a reader
		// without patch rights, a webhook with side effects) still shows
		// the decision: what it could not preview is named in the report.
		out.Converged.Unpreviewed = err.Error()
		return nil
	case errors.Is(err, recovery.ErrFenced):
		return fmt.Errorf("release %q in namespace %q: %w: %w", p.Release, p.Namespace, lock.ErrLost, err)
	}
	next := "the next attempt retries"
	if p.Next != lock.OpRecover {
		next = fmt.Sprintf("helm's %s did not run (it would keep those leftovers); %s", p.Next, next)
	}
	return fmt.Errorf("release %q in namespace %q: %w: abandoned revision %d stays pending and %s: %w",
		p.Release, p.Namespace, ErrConverge, abandoned.Revision, next, err)
}

// rollbackKeeps returns held without the objects only the abandoned
// revision rendered that recovery's rules would delete against the last
// deployed revision (a dry run: nothing is written), so that those alone
// that recovery keeps (data, keep, adopted, unowned) hold helm's rollback
// back. A dry run that cannot tell keeps held whole.
func (c *Conn) rollbackKeeps(ctx context.Context, p Procedure, abandoned helmx.Summary, held []recovery.ObjectRef) []recovery.ObjectRef {
	rep, err := recovery.ConvergeAbandoned(ctx, c.clusterAccess, c.records, abandoned,
		recovery.ConvergeOptions{DryRun: true, DeleteData: p.DeleteData})
	if err != nil {
		return held
	}
	goes := map[recovery.ObjectRef]bool{}
	for _, o := range rep.Objects {
		if o.Action == recovery.ActionDeleted {
			goes[o.Object] = true
		}
	}
	var out []recovery.ObjectRef
	for _, o := range held {
		if !goes[o] {
			out = append(out, o)
		}
	}
	return out
}

// defersRemovals reports whether the objects only the abandoned revision
// rendered wait for next's revision before they are removed: an upgrade or
// install renders a manifest of its own, and whatever it renders again is
// its to adopt; with no operation to follow, the release ends as it was
// last deployed.
func defersRemovals(next lock.Operation) bool {
	return next == lock.OpUpgrade || next == lock.OpInstall
}

// takeLeft sets out.Converged.Deferred, before an upgrade or install that
// needs no recovery, to what an earlier recovery left in place on the
// newest revision (recovery.LoadLeft), for Conn.RemoveDeferred once that
// operation has written its revision. It reads nothing unless the newest
// revision records such objects. A record it cannot read is a warning: the
// objects stay, and the operation goes on.
func (c *Conn) takeLeft(ctx context.Context, p Procedure, out *Outcome, hist []helmx.Summary) {
	if len(hist) == 0 || len(hist[len(hist)-1].Left) == 0 {
		return
	}
	newest := hist[len(hist)-1]
	d, err := recovery.LoadLeft(ctx, c.records, newest)
	if err != nil && p.Log != nil {
		fmt.Fprintf(p.Log, "helm-autorecover: warning: %v\n", err)
	}
	if !d.Empty() {
		out.Converged = recovery.ConvergeReport{Release: d.Release, Namespace: d.Namespace, Abandoned: d.Abandoned, Deferred: d}
	}
}

// RemoveDeferred removes, after the operation a recovery preceded has run
// (successful or not), the objects only the abandoned revision rendered
// that the revision it wrote does not render (recovery.RemoveDeferred),
// under the lock w: every write is checked against w first; what holds
// data goes only with the consent d records (Deferred.DeleteData). Call it only
// when Outcome.Converged.Deferred is not empty (the happy path reads
// nothing). Log receives the summary when something was removed, kept on
// purpose or failed, and a warning naming the objects left when the
// operation wrote no revision. Errors: lock.ErrLost (wrapped) when the lock
// was lost before a write; recovery.ErrNoNewRevision; any read or write
// failure. Every error names the release and the objects left.
func (c *Conn) RemoveDeferred(ctx context.Context, w Writer, d *recovery.Deferred, log io.Writer) (recovery.ConvergeReport, error) {
	if d.Empty() {
		return recovery.ConvergeReport{}, nil
	}
	rep, err := recovery.RemoveDeferred(ctx, c.clusterAccess, c.records, d,
		recovery.ConvergeOptions{BeforeWrite: w.Valid})
	switch {
	case errors.Is(err, recovery.ErrFenced):
		err = fmt.Errorf("release %q in namespace %q: %w: %w", d.Release, d.Namespace, lock.ErrLost, err)
	case errors.Is(err, recovery.ErrNoNewRevision):
		if log != nil {
			fmt.Fprintf(log, "helm-autorecover: warning: %v. Helm's operation wrote no revision, so whether it still wants them is unknown; they stay recorded on revision %d, and the next upgrade or install settles them\n", err, d.Abandoned)
		}
		return rep, err
	}
	if log != nil && (err != nil || rep.Notable()) {
		fmt.Fprintf(log, "helm-autorecover: %s\n", rep.Summary())
	}
	return rep, err
}

// markAbandoned marks the decision's target and strays failed, checking the
// lock before each write. It reports conflict when a revision changed since
// it was read.
func (c *Conn) markAbandoned(ctx context.Context, p Procedure, out *Outcome, describe func(recovery.Abandonment, recovery.Recoverer) string, at time.Time) (conflict bool, err error) {
	dec := out.Decision
	by := recovery.Recoverer{Session: p.Writer.Session(), At: at}
	for _, a := range append([]recovery.Abandonment{dec.Target}, dec.Stray...) {
		if err := p.Writer.Valid(); err != nil {
			return false, fmt.Errorf("release %q in namespace %q: stopped before marking revision %d failed: %w", p.Release, p.Namespace, a.Release.Revision, err)
		}
		desc := describe(a, by)
		// The newest revision's record carries the lock (the gate): it
		// must still be ours when it is written. A store that fences its
		// own writes (the sql driver's) writes every revision as the
		// holder, and checks the lock itself.
		holder := ""
		if a.Release.RecordName == dec.Target.Release.RecordName || c.records.WriteFenced() {
			holder = p.Writer.Session()
		}
		// The objects converge left in place are recorded on the revision
		// they belong to, in the same write: if this process dies before
		// its operation removes them, the next one does.
		var left *recovery.Deferred
		if a.Release.RecordName == dec.Target.Release.RecordName {
			left = out.Converged.Deferred
		}
		rec, err := recovery.MarkFailedLeaving(recovery.WithBeforeWrite(ctx, p.Writer.Valid), c.records, p.Namespace, a.Release, holder, desc, at, left)
		switch {
		case err == nil:
			out.Marked = append(out.Marked, Mark{Abandonment: a, Description: desc, Record: rec})
			chaos.Point("recovery")
		case errors.Is(err, recovery.ErrNotPending) && a.Release.Revision == dec.Target.Release.Revision:
			// The target left pending since it was read (its writer ended
			// it): decide again, rather than roll back what it deployed.
			return true, nil
		case errors.Is(err, recovery.ErrNotPending):
		case errors.Is(err, recovery.ErrConflict):
			return true, nil
		default:
			return false, err
		}
	}
	return false, nil
}
