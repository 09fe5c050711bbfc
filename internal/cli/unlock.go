package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/events"
	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/guard"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/inspect"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// The descriptions unlock writes into the revision the unlocked holder
// left pending (helm history shows them). Verbs: the pending status; the
// holder (who, session, operation); [its LOCKED TILL;] who unlocked; when.
const (
	DescriptionUnlocked      = "Abandoned %s by %s; its lock was released by %s with helm-autorecover unlock at %s"
	DescriptionForceUnlocked = "Abandoned %s by %s; its live lock (LOCKED TILL %s) was force-released by %s with helm-autorecover unlock --force at %s"
)

const unlockLong = `Release the lock of RELEASE held by session ID (see "helm-autorecover locks"),
for a holder known to be dead, and mark the revision it left pending failed,
with a description naming who unlocked it. This is the manual way out; the
next install, upgrade, rollback or uninstall does the same by itself once the
lock has expired.

Refusals (nothing is written):
  - ID is not the holder's session: the message names the holder's session
    (exit 8), so a lock taken since you looked is never broken;
  - the lock is live (renewed within its lease): its holder may still be
    writing (exit 3). --force releases it anyway, after asking on a terminal;
    pass --yes as well in scripts (exit 10 when not confirmed). The holder
    finds its lock gone at its next renewal and stops (exit 4) before it
    writes again; its revision is recovered once its LOCKED TILL has passed
    (up to one lease, shown on stderr), since until then it may still be
    writing;
  - the release is unknown, has no stored revision, or nobody holds its lock
    (exit 7);
  - its Lease or lock record is unreadable, foreign or edited by hand (exit 9).

Touches: the lock of the holder (on the release's newest stored record and
its beat helm-autorecover.v1.RELEASE, and the Lease of that name when
--lock-backend is lease, or auto and the caller may write Leases: the holder
cleared, the record marked released by you and naming the dead holder). It then takes the lock itself
and runs the same recovery as "helm-autorecover recover": it undoes what the
revision the holder was writing applied (never deleting a
PersistentVolumeClaim, CustomResourceDefinition or Namespace unless
--recover-delete-data), marks that revision failed (status
and description only, a write conditional on the resourceVersion read), and
releases the lock; one Event (Unlocked or ForceUnlocked) regarding the
release's latest Secret tells the story. A pending revision not written
under that session (stock helm's) is left alone: see "helm-autorecover
recover". If another client takes the lock first, it recovers the revision
the same way.
`

type unlockOptions struct {
	session string
	force   bool
	yes     bool
	// gopts holds the guard's flags unlock takes (--recover-delete-data).
	gopts guard.Options
}

func newUnlockCmd(c *lockCmds) *cobra.Command {
	o := &unlockOptions{}
	cmd := &cobra.Command{
		Use:               "unlock RELEASE --session ID",
		Short:             "release a dead holder's lock and mark the revision it left pending failed",
		Long:              unlockLong,
		Args:              oneRelease,
		ValidArgsFunction: c.completeHeldReleases,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.runUnlock(cmd.Context(), o, args[0])
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.session, "session", "", "the SESSION ID of the holder whose lock to release (required; see helm-autorecover locks)")
	f.BoolVar(&o.force, "force", false, "release the lock even while it is live (its holder may still be running); asks for confirmation")
	f.BoolVarP(&o.yes, "yes", "y", false, "confirm --force without asking (for scripts)")
	// The guard's own flag, default and environment variable.
	guardFlags := pflag.NewFlagSet("guard", pflag.ContinueOnError)
	_ = o.gopts.AddFlags(guardFlags)
	guard.UseWithoutOperation(guardFlags)
	f.AddFlag(guardFlags.Lookup("recover-delete-data"))
	guard.LockBackendFlag(f, &c.backend)
	_ = cmd.RegisterFlagCompletionFunc("session", c.completeSessions)
	return cmd
}

func (c *lockCmds) runUnlock(ctx context.Context, o *unlockOptions, rel string) error {
	ns := c.settings.Namespace()
	if err := validRelease(rel, ns); err != nil {
		return err
	}
	if err := o.gopts.EnvError("recover-delete-data"); err != nil {
		return &exitcode.Error{Code: exitcode.Usage, Err: err}
	}
	if strings.TrimSpace(o.session) == "" {
		return exitError(exitcode.Usage, "release %q in namespace %q: --session is required; find the holder's session with: helm-autorecover locks %s -n %s", rel, ns, rel, ns)
	}
	cn, err := c.open()
	if err != nil {
		return err
	}
	st, err := cn.inspectConfirmed(ctx, ns, rel)
	if err != nil {
		return err
	}
	st.Release = rel
	hist, err := cn.history(ctx, ns, rel)
	if err != nil {
		return err
	}
	if err := c.checkUnlock(st, hist, o, rel, ns); err != nil {
		return err
	}
	rec := st.Record
	// An expiry not yet confirmed on this client's clock (lock.Confirm)
	// may be a server's wrong Date: its holder is taken for live.
	live := st.State == protocol.Live || st.Confirming
	if live && !o.yes {
		if err := c.confirm(st, rel, ns); err != nil {
			return err
		}
	}

	by := c.who()
	_, skipped, err := cn.forceRelease(ctx, ns, rel, o.session, by)
	if err != nil {
		cur, ierr := cn.inspect(ctx, ns, rel)
		if ierr == nil && cur.HolderIdentity != o.session {
			return exitError(exitcode.WrongSession, "release %q in namespace %q: session %s no longer holds the lock (now held by %q); it was released or taken over meanwhile; nothing was written",
				rel, ns, o.session, cur.HolderIdentity)
		}
		return fmt.Errorf("%w; nothing was written", err)
	}
	fmt.Fprintf(c.out, "Released the lock of release %q in namespace %q held by session %s (%s).\n", rel, ns, o.session, holderText(rec, o.session))
	if skipped != "" {
		fmt.Fprintf(c.errOut, "Warning: release %q in namespace %q: %s was not released: clients of the lease backend wait for it to expire (within one lease of its holder's last renewal); clients of the release backend do not\n", rel, ns, skipped)
	}

	// Recover what the holder left pending under a lock of our own, as any
	// client taking the lock next would: the released record hands the
	// holder on (protocol.Record.Abandoned). The person asserts it is dead, so
	// its revision is abandoned now; legacy revisions are not its, and stay.
	out, err := c.recoverUnlocked(ctx, cn, rel, ns, o.gopts.RecoverDeleteData, func(a recovery.Abandonment, r recovery.Recoverer) string {
		return unlockDescription(a, live, by, r.At)
	})
	if le, ok := protocol.IsLocked(err); ok {
		fmt.Fprintf(c.out, "Another client took the lock first (%v); it recovers what the holder left pending.\n", le)
		c.unlockEvent(ctx, cn, hist, nil, rec, o.session, live, by)
		return nil
	}
	for _, m := range out.Marked {
		fmt.Fprintf(c.out, "Marked revision %d (%s) failed.\n", m.Release.Revision, m.Release.Status)
	}
	if err != nil {
		c.unlockEvent(ctx, cn, hist, out.Marked, rec, o.session, live, by)
		if errors.Is(err, protocol.ErrLost) {
			return &exitcode.Error{Code: exitcode.LockLost, Err: err}
		}
		return fmt.Errorf("%w; the lock was released naming the holder, so the next install, upgrade, rollback or uninstall (or helm-autorecover recover %s -n %s) retries the recovery", err, rel, ns)
	}
	if len(out.Marked) == 0 {
		fmt.Fprintf(c.out, "Nothing was marked failed: %s.\n", strings.TrimSuffix(out.Decision.Reason, "."))
	}
	c.unlockEvent(ctx, cn, hist, out.Marked, rec, o.session, live, by)
	return nil
}

// recoverUnlocked takes the lock released by unlock and runs the one
// recovery procedure under it, with unlock's descriptions.
func (c *lockCmds) recoverUnlocked(ctx context.Context, cn *conn, rel, ns string, deleteData bool, describe func(recovery.Abandonment, recovery.Recoverer) string) (protocol.Outcome, error) {
	held, err := cn.take(ctx, protocol.Request{
		Release:   rel,
		Namespace: ns,
		Operation: protocol.OpRecover,
		Session:   c.newSession(),
		Who:       c.who(),
	})
	if err != nil {
		return protocol.Outcome{}, err
	}
	defer c.keep(ctx, held, rel, ns)()
	return held.Recover(ctx, protocol.Procedure{
		Policy:     recovery.Policy{Autorecover: true, Hints: recovery.CLIHints},
		Next:       protocol.OpRecover,
		Describe:   describe,
		Log:        c.errOut,
		DeleteData: deleteData,
	})
}

// checkUnlock makes every refusal before anything is written.
func (c *lockCmds) checkUnlock(st *protocol.Status, hist []helmx.Summary, o *unlockOptions, rel, ns string) error {
	if !st.Exists {
		if len(hist) == 0 {
			return unknownRelease(ns, rel)
		}
		msg := fmt.Sprintf("release %q in namespace %q has no lock (no %s): nothing to unlock", rel, ns, inspect.LockObject(st, rel))
		return exitError(exitcode.NotFound, "%s%s", msg, legacyPointer(hist, rel, ns))
	}
	if len(hist) == 0 {
		return exitError(exitcode.NotFound, "release %q in namespace %q has no stored revision (its %s exists, holder %q): nothing to recover. If it is gone for good, delete it: %s",
			rel, ns, inspect.LockObject(st, rel), st.HolderIdentity, inspect.DeleteLockObject(st, rel, ns))
	}
	if err := badLock(st, rel, ns); err != nil {
		return err
	}
	if st.HolderIdentity == "" {
		if st.Record != nil && st.Record.Session == o.session {
			return exitError(exitcode.NotFound, "release %q in namespace %q: the lock of session %s was already released at %s%s; nothing to unlock",
				rel, ns, o.session, stamp(st.Record.ReleasedAt), releasedBy(st.Record))
		}
		if p := legacyPointer(hist, rel, ns); p != "" {
			return exitError(exitcode.NotFound, "release %q in namespace %q: nobody holds its lock; nothing to unlock%s", rel, ns, p)
		}
		return exitError(exitcode.NotFound, "release %q in namespace %q: nobody holds its lock; nothing to unlock (see helm-autorecover locks %s -n %s)", rel, ns, rel, ns)
	}
	if st.HolderIdentity != o.session {
		return exitError(exitcode.WrongSession, "release %q in namespace %q: session %s does not hold its lock; it is held by session %s (%s, LOCKED TILL %s). Check with: helm-autorecover locks %s -n %s",
			rel, ns, o.session, st.HolderIdentity, holderText(st.Record, st.HolderIdentity), stamp(st.LockedTill), rel, ns)
	}
	if (st.State == protocol.Live || st.Confirming) && !o.force {
		return exitError(exitcode.Locked, "release %q in namespace %q: the lock of session %s is live: its holder (%s) renewed it at %s, LOCKED TILL %s (%s left); it may still be running. Wait for it to finish or expire; if you know it is dead (process killed, CI job cancelled), run again with --force",
			rel, ns, o.session, holderText(st.Record, o.session), stamp(st.Record.RenewedAt), stamp(st.LockedTill), left(st))
	}
	return nil
}

// confirm asks the person on the terminal before a live lock is broken.
func (c *lockCmds) confirm(st *protocol.Status, rel, ns string) error {
	if !c.isTerminal() {
		return exitError(exitcode.Declined, "release %q in namespace %q: --force on a live lock needs confirmation, and stdin is not a terminal; nothing was written. Pass --yes to confirm in scripts", rel, ns)
	}
	fmt.Fprintf(c.errOut, "The lock of release %q in namespace %q is live: its holder (session %s, %s) renewed it at %s, LOCKED TILL %s (%s left).\n"+
		"If that process is still running, it stops at its next renewal; the revision it is writing is recovered and marked failed once its LOCKED TILL has passed.\n"+
		"Release it? Type yes to confirm: ", rel, ns, st.HolderIdentity, holderText(st.Record, st.HolderIdentity), stamp(st.Record.RenewedAt), stamp(st.LockedTill), left(st))
	line, _ := bufio.NewReader(c.in).ReadString('\n')
	switch answer := strings.ToLower(strings.TrimSpace(line)); answer {
	case "yes":
		return nil
	case "", "n", "no":
		return exitError(exitcode.Declined, "release %q in namespace %q: not confirmed; nothing was written", rel, ns)
	}
	return exitError(exitcode.Declined, "release %q in namespace %q: not confirmed (the answer must be yes); nothing was written", rel, ns)
}

func unlockDescription(a recovery.Abandonment, forced bool, by string, at time.Time) string {
	h := "an unknown holder"
	if a.Lock != nil {
		h = a.Lock.Holder()
	}
	if forced {
		till := time.Time{}
		if a.Lock != nil {
			till = a.Lock.LockedTill
		}
		return fmt.Sprintf(DescriptionForceUnlocked, a.Release.Status, h, stamp(till), by, stamp(at))
	}
	return fmt.Sprintf(DescriptionUnlocked, a.Release.Status, h, by, stamp(at))
}

func (c *lockCmds) unlockEvent(ctx context.Context, cn *conn, hist []helmx.Summary, marked []protocol.Mark, rec *protocol.Record, session string, forced bool, by string) {
	var regarding helmx.Record
	switch {
	case len(marked) > 0:
		regarding = marked[0].Record
	case len(hist) > 0:
		recs, _ := cn.Records()
		s, err := events.ReleaseRecord(ctx, recs, hist[len(hist)-1])
		if err != nil {
			fmt.Fprintf(c.errOut, "Warning: %v\n", err)
			return
		}
		regarding = s
	default:
		return
	}
	reason, typ, verb := events.ReasonUnlocked, corev1.EventTypeNormal, "released"
	if forced {
		reason, typ, verb = events.ReasonForceUnlocked, corev1.EventTypeWarning, "force-released (it was live)"
	}
	note := fmt.Sprintf("Lock of session %s (%s) %s by %s with helm-autorecover unlock", session, holderText(rec, session), verb, by)
	for _, m := range marked {
		note += fmt.Sprintf("; revision %d (%s) marked failed", m.Release.Revision, m.Release.Status)
	}
	now, _ := cn.serverNow(ctx)
	err := events.Emit(ctx, cn.Client(), events.Event{
		Regarding: regarding.Ref(),
		Type:      typ,
		Reason:    reason,
		Action:    "Unlock",
		Note:      note,
		At:        now.Latest,
		Instance:  by,
	})
	if err != nil {
		fmt.Fprintf(c.errOut, "Warning: %v\n", err)
	}
}

// holderText describes the holder of session: who, pid, operation,
// revision and CI job.
func holderText(rec *protocol.Record, session string) string {
	if rec == nil || rec.Session != session {
		return "lock record unreadable"
	}
	who := rec.Who
	if who == "" {
		who = "unknown"
	}
	s := who
	if rec.PID != 0 {
		s += fmt.Sprintf(" pid %d", rec.PID)
	}
	s += fmt.Sprintf(", operation %s", rec.Operation)
	if rec.Revision > 0 {
		s += fmt.Sprintf(" of revision %d", rec.Revision)
	}
	if rec.CIJobURL != "" {
		s += ", job " + rec.CIJobURL
	}
	return s
}

func releasedBy(rec *protocol.Record) string {
	if rec.ReleasedBy == "" {
		return " by its holder"
	}
	return " by " + rec.ReleasedBy
}

func left(st *protocol.Status) string {
	if st.LockedTill.IsZero() || st.Now.IsZero() {
		return "unknown time"
	}
	return max(0, st.LockedTill.Add(protocol.TakeoverMargin).Sub(st.Now.Earliest)).Round(time.Second).String()
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "an unknown time"
	}
	return t.UTC().Format(time.RFC3339)
}

// legacyPointer is what unlock adds when nobody holds the release's lock
// but its latest revision is pending all the same: no lock of ours covers
// it (stock helm, or a client of ours that released before helm ended), so
// unlock has nothing to release, and recover is the way out, once no helm
// process is at work on it. "" when nothing is pending.
func legacyPointer(hist []helmx.Summary, rel, ns string) string {
	if len(hist) == 0 {
		return ""
	}
	latest := hist[len(hist)-1]
	if !recovery.IsPending(latest.Status) {
		return ""
	}
	return fmt.Sprintf(". Its revision %d is %s with no lock record covering it (stock helm may have written it, and may still be running): "+
		"helm-autorecover recover %s -n %s recovers it once it has been pending for --recover-legacy-after (see when with --dry-run; lower the flag only if you know no helm process is at work on it)",
		latest.Revision, latest.Status, rel, ns)
}
