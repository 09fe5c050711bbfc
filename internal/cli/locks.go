package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"helm.sh/helm/v4/pkg/cli/output"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/guard"
	"github.com/helm-autorecover/helm-autorecover/internal/inspect"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
)

const locksLong = `Show the lock of each release: who holds it (user@host, pid, session ID,
operation, CI job URL), its state, when it was acquired and last renewed,
LOCKED TILL and the time left before another client may take it over. Every
time is the API server's clock, read from its responses, never this machine's.
When a client waiting for the lock asked its holder to stop (--preempt),
HOLDER adds who asked and since when (preempt_requested_by in -o json|yaml),
and why the holder will not stop when its operation is a rollback or an
uninstall; the clients waiting are listed under waiters in -o json|yaml.

States:
  live            a holder has the lock and may still be renewing it
  expired         its holder stopped renewing; the next operation takes it
                  over and recovers the revision it abandoned
  legacy-pending  the latest revision is pending and no held lock covers it
                  (stock helm wrote it, or its holder released the lock);
                  PENDING FOR says how old it is and when automatic recovery
                  may take it (--recover-legacy-after)
  none            nobody holds the lock and nothing is pending

With RELEASE, shows that release's lock whatever its state. Without it, shows
every live, expired and legacy-pending release of the namespace (-n) or of
all namespaces (-A); --all adds the releases in state none.

Reads helm's release Secrets (sh.helm.release.v1.<release>.v<revision>:
metadata only, where the lock lives) and the lock's small objects
helm-autorecover.v1.<release>; with --lock-backend=lease also the Leases of
that name, and with auto those too when the API server lets the caller read
them (a user with the release backend's rights reads the records alone,
which every client locks first). Writes nothing.

Exit codes: 0; 2 for a bad flag or release name; 7 when RELEASE is unknown
(no stored revision, and nobody holds its lock). A Lease whose lock record cannot be read or
does not match it (edited by hand, foreign) is shown with a warning on stderr.
`

type locksOptions struct {
	output        string
	allNamespaces bool
	all           bool
	noHeaders     bool
	legacyAfter   time.Duration
	// envCheck reports a variable behind a flag that does not parse.
	envCheck func() error
}

func newLocksCmd(c *lockCmds) *cobra.Command {
	o := &locksOptions{}
	cmd := &cobra.Command{
		Use:               "locks [RELEASE]",
		Short:             "show who holds the lock of each release, until when, and what is pending",
		Long:              locksLong,
		Args:              atMostOneRelease,
		ValidArgsFunction: c.completeReleases,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.runLocks(cmd.Context(), o, args)
		},
	}
	f := cmd.Flags()
	outputFlag(cmd, &o.output)
	f.BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "show locks in all namespaces")
	f.BoolVarP(&o.all, "all", "a", false, "also show releases whose lock is in state none")
	f.BoolVar(&o.noHeaders, "no-headers", false, "don't print headers when using the default output format")
	guard.LockBackendFlag(f, &c.backend)
	o.envCheck = legacyAfterFlag(f, &o.legacyAfter, "when a legacy pending revision counts as abandoned, to say when it becomes recoverable (0: never)")
	return cmd
}

func (c *lockCmds) runLocks(ctx context.Context, o *locksOptions, args []string) error {
	if err := o.envCheck(); err != nil {
		return err
	}
	format, err := parseOutput(o.output)
	if err != nil {
		return err
	}
	ns := c.settings.Namespace()
	if len(args) == 1 {
		if o.allNamespaces {
			return exitError(exitcode.Usage, "--all-namespaces: cannot be used with a release name; use -n to name its namespace")
		}
		if err := validRelease(args[0], ns); err != nil {
			return err
		}
	}
	cn, err := c.open()
	if err != nil {
		return err
	}
	var rows []inspect.Row
	if len(args) == 1 {
		row, err := c.releaseRow(ctx, cn, ns, args[0], o.legacyAfter)
		if err != nil {
			return err
		}
		rows = []inspect.Row{row}
	} else {
		if o.allNamespaces {
			ns = ""
		}
		rows, err = c.namespaceRows(ctx, cn, ns, o.legacyAfter)
		if err != nil {
			return err
		}
		if !o.all {
			kept := rows[:0]
			for _, r := range rows {
				if r.State != inspect.StateNone || r.Problem != "" {
					kept = append(kept, r)
				}
			}
			rows = kept
		}
	}
	if len(rows) == 0 && format == output.Table {
		// No bare header: say what was looked at, on stderr (as kubectl).
		what := "no release is held, expired or pending"
		if o.all || len(args) == 1 {
			what = "no release"
		}
		fmt.Fprintf(c.errOut, "No locks found %s: %s.", protocol.InNamespace(ns), what)
		if !o.all {
			fmt.Fprint(c.errOut, " --all lists every release.")
		}
		fmt.Fprintln(c.errOut)
		return nil
	}
	if err := inspect.WriteLocks(c.out, format, rows, o.noHeaders); err != nil {
		return err
	}
	c.warnProblems(rows)
	return nil
}

func (c *lockCmds) warnProblems(rows []inspect.Row) {
	for _, r := range rows {
		if r.Problem != "" {
			fmt.Fprintf(c.errOut, "Warning: release %q in namespace %q: %s\n", r.Release, r.Namespace, r.Problem)
		}
	}
}

// releaseRow inspects one release. An unknown release (no stored revision
// and no Lease) is an error with exit code 7.
func (c *lockCmds) releaseRow(ctx context.Context, cn *conn, ns, rel string, legacyAfter time.Duration) (inspect.Row, error) {
	st, err := cn.inspect(ctx, ns, rel)
	if err != nil {
		return inspect.Row{}, err
	}
	st.Release = rel
	rels, err := cn.latestRevisions(ctx, ns, rel)
	if err != nil {
		return inspect.Row{}, err
	}
	r, ok := rels[releaseKey{ns, rel}]
	if !ok && st.HolderIdentity == "" {
		// No revision and nobody holding the lock: the release does not
		// exist (a Lease left by an earlier version's failed operation is
		// not a release).
		return inspect.Row{}, unknownRelease(ns, rel)
	}
	r.Name, r.Namespace = rel, ns
	now, err := cn.serverNow(ctx)
	if err != nil {
		return inspect.Row{}, fmt.Errorf("release %q in namespace %q: %w", rel, ns, err)
	}
	return inspect.NewRow(inspect.Input{Lock: st, Release: r, Now: now, Margin: cn.locks.Margin(), LegacyAfter: legacyAfter}), nil
}

// namespaceRows inspects every release with a Lease or a stored revision
// in ns ("" for all namespaces).
func (c *lockCmds) namespaceRows(ctx context.Context, cn *conn, ns string, legacyAfter time.Duration) ([]inspect.Row, error) {
	sts, err := cn.list(ctx, ns)
	if err != nil {
		return nil, err
	}
	rels, err := cn.latestRevisions(ctx, ns, "")
	if err != nil {
		return nil, err
	}
	now, err := cn.serverNow(ctx)
	if err != nil {
		return nil, err
	}
	locks := map[releaseKey]*protocol.Status{}
	for i := range sts {
		st := &sts[i]
		locks[releaseKey{st.Namespace, st.Release}] = st
	}
	// A pending release whose Lease lost its labels (edited by hand) is not
	// in the labelled list: look it up by name before calling it legacy.
	for k, r := range rels {
		if _, ok := locks[k]; ok || r.Latest == nil || !isPending(r.Latest) {
			continue
		}
		st, err := cn.inspect(ctx, k.namespace, k.name)
		if err != nil {
			return nil, err
		}
		if st.Exists {
			st.Release = k.name
			locks[k] = st
		}
	}
	keys := map[releaseKey]bool{}
	for k := range locks {
		keys[k] = true
	}
	for k := range rels {
		keys[k] = true
	}
	rows := make([]inspect.Row, 0, len(keys))
	for k := range keys {
		r, ok := rels[k]
		if st := locks[k]; !ok && st != nil && st.HolderIdentity == "" && st.RecordErr == nil {
			continue // a lock left with no release (see releaseRow)
		}
		r.Name, r.Namespace = k.name, k.namespace
		rowNow := now
		if st := locks[k]; st != nil && !st.Now.IsZero() {
			rowNow = st.Now
		}
		rows = append(rows, inspect.NewRow(inspect.Input{Lock: locks[k], Release: r, Now: rowNow, Margin: cn.locks.Margin(), LegacyAfter: legacyAfter}))
	}
	inspect.SortRows(rows)
	return rows, nil
}
