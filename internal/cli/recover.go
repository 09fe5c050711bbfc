package cli

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

// dryRunSession stands for the session a real run would take, in the
// descriptions a dry run shows.
const dryRunSession = "<new session>"

const recoverLong = `Decide whether RELEASE is stuck and recover it if it may be: print the
verdict in plain words, why, and what is (or would be) written.

A release is recoverable when its latest revision is pending and either its
holder's lock expired (it died), or no lock covers it and it has been pending
for at least --recover-legacy-after in API-server time (stock helm left it;
lower the flag if you know no helm process is running) and no hook Job or
Pod of it is still running (its helm may still be at work). A pending
revision under a live lock is never recovered. This is the same decision install,
upgrade, rollback and uninstall make before they run.

Recovering takes the release's lock first (as the guarded commands do) and
runs the same recovery they run: it undoes what the abandoned revision
applied (fields it changed go back to the last deployed revision; objects
only it created are left in place and recorded on it, and the next upgrade
or install removes those its own revision does not render, never those
annotated helm.sh/resource-policy: keep, and never what holds data:
PersistentVolumeClaims, CRDs, Namespaces, LoadBalancer Services,
StatefulSets whose claims go with them, or any owner of those, unless
--recover-delete-data), marks the pending revision (and any older stray
pending revision) failed with a description of who abandoned what and when,
and releases the lock. No revision is deleted; helm history keeps every
one. With --recover-strategy=rollback it rolls back to the last deployed
revision instead of undoing the changes itself.

Touches: the release's lock (on its newest stored record and its beat, and
the Lease helm-autorecover.v1.RELEASE under the lease backend, chosen by
--lock-backend as for upgrade; taken, then released), the objects the
abandoned revision changed or created, the Secret of each pending revision
(status and description, and on the abandoned one the objects left in
place, under the release JSON key helm_autorecover_left; a write conditional
on the resourceVersion read), one Event (Recovered) regarding the release's latest Secret, and, with
--recover-strategy=rollback, a new revision. The report lists every object
of the abandoned revision it reverted, deleted, left in place or kept, with
the reason. --dry-run reads the same, lists the same objects in the same
form ("would be reverted"), and writes nothing.

Exit codes (the same with --dry-run): 0 recovered, recoverable, or nothing to
recover; 3 a live holder has the lock; 5 pending but not recoverable now (the
message says when it becomes so); 7 unknown release or no stored revision;
9 the Lease or its lock record cannot be trusted (nothing written).
`

// recoverGuardFlags are the guard's flags recover takes.
var recoverGuardFlags = []string{"lock-backend", "recover-legacy-after", "recover-strategy", "recover-delete-data", "lease-duration", "lock-timeout"}

type recoverOptions struct {
	dryRun bool
	opts   guard.Options
}

func newRecoverCmd(c *lockCmds) *cobra.Command {
	o := &recoverOptions{}
	cmd := &cobra.Command{
		Use:               "recover RELEASE",
		Short:             "explain whether a release is stuck, and recover it when it may be",
		Long:              recoverLong,
		Args:              oneRelease,
		ValidArgsFunction: c.completeReleases,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.runRecover(cmd.Context(), o, args[0])
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.dryRun, "dry-run", false, "print the verdict and what would be written; write nothing")
	// The guard's own flags, defaults and environment variables, for the
	// ones that mean something here.
	guardFlags := pflag.NewFlagSet("guard", pflag.ContinueOnError)
	_ = o.opts.AddFlags(guardFlags)
	guard.UseWithoutOperation(guardFlags)
	for _, name := range recoverGuardFlags {
		f.AddFlag(guardFlags.Lookup(name))
	}
	return cmd
}

func (o *recoverOptions) policy() recovery.Policy {
	return recovery.Policy{
		Autorecover: true,
		LegacyAfter: o.opts.RecoverLegacyAfter,
		Strategy:    recovery.Strategy(o.opts.RecoverStrategy),
		Hints:       recovery.CLIHints,
	}
}

func (c *lockCmds) runRecover(ctx context.Context, o *recoverOptions, rel string) (err error) {
	ns := c.settings.Namespace()
	if err := validRelease(rel, ns); err != nil {
		return err
	}
	if err := o.opts.ValidateFlags(recoverGuardFlags...); err != nil {
		return &exitcode.Error{Code: exitcode.Usage, Err: err}
	}
	c.backend = o.opts.LockBackend
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
	if len(hist) == 0 {
		if !st.Exists {
			return unknownRelease(ns, rel)
		}
		return exitError(exitcode.NotFound, "release %q in namespace %q has no stored revision (its %s exists, holder %q): nothing to recover",
			rel, ns, inspect.LockObject(st, rel), st.HolderIdentity)
	}
	if err := badLock(st, rel, ns); err != nil {
		return err
	}
	// Decide on the lock as read first (the procedure with no writer): a
	// dry run stops here, and a run that would not recover writes nothing,
	// not even the lock.
	observed := recovery.ObservedLock(st)
	planned, err := cn.Recover(ctx, protocol.Procedure{
		Release: rel, Namespace: ns, Lock: observed, Policy: o.policy(), Next: protocol.OpRecover,
		Preview: o.dryRun, DeleteData: o.opts.RecoverDeleteData,
	})
	if err != nil {
		return err
	}
	dec := planned.Decision
	live := observed.State == recovery.LockLive
	if o.dryRun {
		rep := planReport(dec, rel, ns, planned.At)
		rep.Objects = planned.Converged.Lines()
		if err := inspect.WriteReport(c.out, rep); err != nil {
			return err
		}
		return verdictError(dec, live)
	}
	switch dec.Verdict {
	case recovery.NoRelease, recovery.Proceed:
		return inspect.WriteReport(c.out, inspect.Report{Release: rel, Namespace: ns, Decision: dec})
	case recovery.Blocked:
		if !live || o.opts.LockTimeout <= 0 {
			if err := inspect.WriteReport(c.out, inspect.Report{Release: rel, Namespace: ns, Decision: dec}); err != nil {
				return err
			}
			return verdictError(dec, live)
		}
	case recovery.Recover, recovery.RecoverThenRollback:
	}

	req := protocol.Request{
		Release:       rel,
		Namespace:     ns,
		Operation:     protocol.OpRecover,
		LeaseDuration: o.opts.LeaseDuration,
		Session:       c.newSession(),
		Who:           c.who(),
		Wait:          max(o.opts.LockTimeout, 0),
		// A rollback (--recover-strategy=rollback) runs helm's own action:
		// its writes go through the same fence as the guarded commands'.
		Fence: helmx.DefaultWriteFence,
	}
	var told sync.Once
	req.OnWait = func(h *protocol.Record, left time.Duration) {
		told.Do(func() {
			who := "another client"
			if h != nil {
				who = fmt.Sprintf("%s (%s, session %s)", h.Who, h.Operation, h.Session)
			}
			fmt.Fprintf(c.errOut, "helm-autorecover: release %q in namespace %q is locked by %s; waiting up to %s\n", rel, ns, who, o.opts.LockTimeout)
		})
	}
	held, err := cn.take(ctx, req)
	if err != nil {
		le, ok := protocol.IsLocked(err)
		if !ok {
			return err
		}
		if le.State == protocol.Live {
			dec := c.decideLive(ctx, cn, o, le, rel, ns)
			_ = inspect.WriteReport(c.out, inspect.Report{Release: rel, Namespace: ns, Decision: dec})
			if dec.Verdict == recovery.Proceed {
				// Someone is operating on a release that is not stuck.
				return nil
			}
		}
		return &exitcode.Error{Code: exitcode.Locked, Err: err}
	}
	defer c.keep(ctx, held, rel, ns)()

	out, err := held.Recover(ctx, protocol.Procedure{
		Policy: o.policy(),
		Next:   protocol.OpRecover,
		Rollback: func(release string, revision int) error {
			return lockRollback(helmGetter)(ctx, held, release, revision)
		},
		Log:        c.errOut,
		DeleteData: o.opts.RecoverDeleteData,
	})
	rep := inspect.Report{Release: rel, Namespace: ns, Decision: out.Decision, RolledBack: out.RolledBack, Said: out.Said(), Objects: out.Converged.Lines()}
	for _, m := range out.Marked {
		rep.Writes = append(rep.Writes, inspect.Write{Revision: m.Release.Revision, RecordKind: m.Release.RecordKind, RecordName: m.Release.RecordName, From: m.Release.Status, Description: m.Description})
	}
	if len(out.Marked) > 0 {
		rep.Event = events.ReasonRecovered
		note := fmt.Sprintf("Recovered by %s with helm-autorecover recover (session %s): %s", c.who(), held.Session(), out.Said())
		if eerr := events.Emit(ctx, cn.Client(), events.Event{
			Regarding: out.Marked[0].Record.Ref(), Type: corev1.EventTypeNormal, Reason: events.ReasonRecovered,
			Action: "Recover", Note: note, At: out.At, Instance: c.who(),
		}); eerr != nil {
			rep.Event = ""
			fmt.Fprintf(c.errOut, "Warning: %v\n", eerr)
		}
	}
	if err != nil {
		if len(out.Marked) > 0 {
			_ = inspect.WriteReport(c.out, rep)
		}
		if errors.Is(err, protocol.ErrLost) {
			return &exitcode.Error{Code: exitcode.LockLost, Err: err}
		}
		return err
	}
	switch out.Decision.Verdict {
	case recovery.NoRelease:
		return exitError(exitcode.NotFound, "%s (it was uninstalled meanwhile)", out.Decision.Reason)
	case recovery.Blocked:
		if err := inspect.WriteReport(c.out, rep); err != nil {
			return err
		}
		return verdictError(out.Decision, false)
	case recovery.Proceed, recovery.Recover, recovery.RecoverThenRollback:
	}
	return inspect.WriteReport(c.out, rep)
}

// planReport is what a recovery would write, as a dry run shows it.
func planReport(dec recovery.Decision, rel, ns string, at time.Time) inspect.Report {
	rep := inspect.Report{Release: rel, Namespace: ns, Decision: dec, DryRun: true}
	if dec.Verdict == recovery.Recover || dec.Verdict == recovery.RecoverThenRollback {
		by := recovery.Recoverer{Session: dryRunSession, At: at}
		for _, a := range append([]recovery.Abandonment{dec.Target}, dec.Stray...) {
			rep.Writes = append(rep.Writes, inspect.Write{Revision: a.Release.Revision, RecordKind: a.Release.RecordKind, RecordName: a.Release.RecordName, From: a.Release.Status, Description: recovery.DescribeAbandoned(a, by)})
		}
		rep.Event = events.ReasonRecovered
	}
	return rep
}

// verdictError is the exit status a dry run shares with a real run, once
// the report has been printed.
func verdictError(dec recovery.Decision, live bool) error {
	if dec.Verdict != recovery.Blocked {
		return nil
	}
	code := exitcode.Pending
	if live {
		code = exitcode.Locked
	}
	// The report on stdout says it already.
	return &exitcode.Error{Code: code, Err: errors.New(dec.Reason), Reported: true}
}

// decideLive decides on a release whose lock a live holder has.
func (c *lockCmds) decideLive(ctx context.Context, cn *conn, o *recoverOptions, le *protocol.LockedError, rel, ns string) recovery.Decision {
	info := recovery.LockInfo{State: recovery.LockLive, Session: le.HolderIdentity, LockedTill: le.LockedTill}
	if le.Holder != nil {
		info = recovery.FromRecord(le.Holder, recovery.LockLive)
		info.LockedTill = le.LockedTill
	}
	out, _ := cn.Recover(ctx, protocol.Procedure{Release: rel, Namespace: ns, Lock: info, Policy: o.policy(), Next: protocol.OpRecover})
	return out.Decision
}
