package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
	helmcli "helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/cli/output"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/guard"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/inspect"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// Exit codes of the locks, unlock and recover commands, documented in
// docs/exit-codes.md next to the guard's (2 to 6).
const (
	// ExitNotFound: the release is unknown (no stored revision and no
	// lock), has no stored revision, or has no lock to release.
	ExitNotFound = 7
	// ExitWrongSession: --session does not name the lock's holder; the
	// message names the holder's session.
	ExitWrongSession = 8
	// ExitBadLock: the release's Lease or lock record cannot be trusted
	// (unreadable, written by a newer or foreign tool, edited by hand).
	ExitBadLock = 9
	// ExitDeclined: a forced unlock of a live lock was not confirmed.
	ExitDeclined = 10
)

// lockCmds holds what the lock commands (locks, unlock, recover, list
// --locks) share: helm's settings, the streams, and the seams tests replace.
type lockCmds struct {
	settings    *helmcli.EnvSettings
	out, errOut io.Writer
	in          io.Reader
	// isTerminal reports whether in is a terminal a person can answer on.
	isTerminal func() bool
	// connect builds the clients; tests give a fake clientset and a fixed
	// server clock.
	connect func() (*conn, error)
	// who names the person running the command (user@host).
	who func() string
	// newSession returns the session ID of a lock this process takes.
	newSession func() string
}

// conn is one connection to the cluster: a client whose responses feed the
// server-time estimator, and the lock backend on top of both.
type conn struct {
	client  kubernetes.Interface
	est     *servertime.Estimator
	backend *lock.LeaseBackend
	// records is the lock on the release records (nil when the driver has
	// none, as with sql): every client takes it, whichever backend it chose.
	records *lock.LeaseBackend
	// recs are helm's release records (Secrets, or ConfigMaps with
	// HELM_DRIVER=configmap); recsErr is set when the driver keeps none.
	recs    helmx.Records
	recsErr error
}

func newConn(client kubernetes.Interface, est *servertime.Estimator, clk clock.Clock) *conn {
	cn := &conn{client: client, est: est, backend: lock.NewLeaseBackend(client, est, clk)}
	if d, err := records.ParseDriver(os.Getenv("HELM_DRIVER")); err == nil {
		cn.records = lock.NewReleaseBackend(client, est, clk, d)
	}
	cn.recs, cn.recsErr = helmx.NewRecords(client, os.Getenv("HELM_DRIVER"))
	return cn
}

// history reads the stored revisions of rel in ns, oldest first.
func (cn *conn) history(ctx context.Context, ns, rel string) ([]helmx.Summary, error) {
	if cn.recsErr != nil {
		return nil, exitError(guard.ExitUsage, "release %q in namespace %q: %v; reading and recovering the release history needs the secret or configmap driver", rel, ns, cn.recsErr)
	}
	return helmx.ReadHistory(ctx, cn.recs, ns, rel)
}

// stores are the locks an operation of this process takes, in order.
func (cn *conn) stores() []*lock.LeaseBackend {
	if cn.records == nil {
		return []*lock.LeaseBackend{cn.backend}
	}
	return []*lock.LeaseBackend{cn.records, cn.backend}
}

// inspect reads the lock of rel in both stores and returns the one that
// matters: a live one first (the record's before the Lease's), then an
// expired one, then one that names a last holder, else the Lease's.
//
// A lock that looks live only because this process's estimate of server
// time is still too wide to tell is read again once the estimate can tell
// (within about a second; lock.LeaseBackend.Settled), so that every command
// run after a lock expired sees it expired.
func (cn *conn) inspect(ctx context.Context, ns, rel string) (*lock.Status, error) {
	return settledRead(func() (*lock.Status, bool, error) {
		var sts []*lock.Status
		unsettled := false
		for _, b := range cn.stores() {
			st, err := b.Inspect(ctx, ns, rel)
			if err != nil {
				return nil, false, err
			}
			sts = append(sts, st)
			unsettled = b.Settled(ctx, st.State, st.LockedTill) || unsettled
		}
		return pickStatus(sts), unsettled, nil
	})
}

// settledRead calls read, and once more when read had to settle a lock
// judged live only for want of a narrow enough estimate of server time
// (lock.LeaseBackend.Settled): the second read judges it anew.
func settledRead[T any](read func() (T, bool, error)) (T, error) {
	v, unsettled, err := read()
	if err == nil && unsettled {
		v, _, err = read()
	}
	return v, err
}

func pickStatus(sts []*lock.Status) *lock.Status {
	for _, want := range []func(*lock.Status) bool{
		func(s *lock.Status) bool { return s.State == lock.Live },
		func(s *lock.Status) bool { return s.State == lock.Expired },
		func(s *lock.Status) bool { return s.Record != nil || s.RecordErr != nil },
	} {
		for _, s := range sts {
			if want(s) {
				return s
			}
		}
	}
	return sts[len(sts)-1]
}

// list reports the lock of every release in ns in either store, one status
// per release, chosen as inspect does.
func (cn *conn) list(ctx context.Context, ns string) ([]lock.Status, error) {
	return settledRead(func() ([]lock.Status, bool, error) { return cn.listOnce(ctx, ns) })
}

func (cn *conn) listOnce(ctx context.Context, ns string) ([]lock.Status, bool, error) {
	byRelease := map[string][]*lock.Status{}
	var order []string
	unsettled := false
	for _, b := range cn.stores() {
		sts, err := b.List(ctx, ns)
		if err != nil {
			return nil, false, err
		}
		for i := range sts {
			k := sts[i].Namespace + "/" + sts[i].Release
			if _, ok := byRelease[k]; !ok {
				order = append(order, k)
			}
			byRelease[k] = append(byRelease[k], &sts[i])
			// The estimate is shared: settling one lock takes at most the
			// estimate's width, and each later one less.
			unsettled = b.Settled(ctx, sts[i].State, sts[i].LockedTill) || unsettled
		}
	}
	out := make([]lock.Status, 0, len(order))
	for _, k := range order {
		out = append(out, *pickStatus(byRelease[k]))
	}
	return out, unsettled, nil
}

// forceRelease releases session's lock in every store it holds one in.
func (cn *conn) forceRelease(ctx context.Context, ns, rel, session, by string) (*lock.Record, error) {
	var rec *lock.Record
	var firstErr error
	for _, b := range cn.stores() {
		r, err := b.ForceRelease(ctx, ns, rel, session, by)
		switch {
		case err == nil:
			if rec == nil {
				rec = r
			}
		case firstErr == nil:
			firstErr = err
		}
	}
	if rec != nil {
		return rec, nil
	}
	return nil, firstErr
}

// addLockCommands adds locks, unlock and recover to root and --locks to
// helm's list.
func addLockCommands(root *cobra.Command, settings *helmcli.EnvSettings, out, errOut io.Writer) {
	c := &lockCmds{
		settings:   settings,
		out:        out,
		errOut:     errOut,
		in:         os.Stdin,
		isTerminal: func() bool { return term.IsTerminal(int(os.Stdin.Fd())) },
		who:        lock.DefaultWho,
		newSession: lock.NewSession,
	}
	c.connect = c.realConnect
	root.AddCommand(usageErrors(newLocksCmd(c)), usageErrors(newUnlockCmd(c)), usageErrors(newRecoverCmd(c)))
	wrapList(root, c)
}

func (c *lockCmds) realConnect() (*conn, error) {
	cfg, err := c.settings.RESTClientGetter().ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubernetes configuration: %w", err)
	}
	clk := clock.RealClock{}
	est := servertime.New(clk)
	client, err := kubernetes.NewForConfig(est.Instrument(cfg))
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return newConn(client, est, clk), nil
}

// serverNow returns bounds on the API server's clock, asking the server
// once if nothing has been observed yet.
func (cn *conn) serverNow(ctx context.Context) (servertime.Bounds, error) {
	if now, ok := cn.est.Now(); ok {
		return now, nil
	}
	if err := cn.est.Sync(ctx, cn.client.Discovery()); err != nil {
		return servertime.Bounds{}, fmt.Errorf("reading the API server's clock: %w", err)
	}
	now, _ := cn.est.Now()
	return now, nil
}

// exitError gives err a documented exit code.
func exitError(code int, format string, args ...any) error {
	return &guard.ExitError{Code: code, Err: fmt.Errorf(format, args...)}
}

// validRelease checks a release name argument (exit code 2).
func validRelease(name, ns string) error {
	if err := lock.ValidateReleaseName(name); err != nil {
		return exitError(guard.ExitUsage, "release in namespace %q: %w", ns, err)
	}
	return nil
}

// usageErrors gives cmd's flag errors exit code 2, as for the guard's flags.
func usageErrors(cmd *cobra.Command) *cobra.Command {
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &guard.ExitError{Code: guard.ExitUsage, Err: err}
	})
	return cmd
}

// oneRelease and atMostOneRelease check the arguments (exit code 2).
func oneRelease(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return exitError(guard.ExitUsage, "%s: needs exactly one argument, the release name; got %d (see %s --help)", cmd.Name(), len(args), cmd.Name())
	}
	return nil
}

func atMostOneRelease(cmd *cobra.Command, args []string) error {
	if len(args) > 1 {
		return exitError(guard.ExitUsage, "%s: takes at most one argument, a release name; got %d (see %s --help)", cmd.Name(), len(args), cmd.Name())
	}
	return nil
}

// legacyAfterFlag registers --recover-legacy-after with the guard's default
// and environment variable.
func legacyAfterFlag(fs *pflag.FlagSet, v *time.Duration, usage string) error {
	*v = guard.DefaultRecoverLegacyAfter
	if s := os.Getenv(guard.EnvRecoverLegacyAfter); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("bad helm-autorecover environment: %s=%q: %w", guard.EnvRecoverLegacyAfter, s, err)
		}
		*v = d
	}
	fs.DurationVar(v, "recover-legacy-after", *v, usage+" ["+guard.EnvRecoverLegacyAfter+"]")
	return nil
}

// outputFlag registers -o/--output.
func outputFlag(cmd *cobra.Command, v *string) {
	cmd.Flags().StringVarP(v, "output", "o", string(output.Table), "prints the output in the specified format. Allowed values: table, json, yaml")
	_ = cmd.RegisterFlagCompletionFunc("output", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return []string{"table\thuman-readable table", "json\tJSON", "yaml\tYAML"}, cobra.ShellCompDirectiveNoFileComp
	})
}

func parseOutput(s string) (output.Format, error) {
	f, err := output.ParseFormat(s)
	if err != nil {
		return "", exitError(guard.ExitUsage, "--output=%q: must be table, json or yaml", s)
	}
	return f, nil
}

const locksLong = `Show the lock of each release: who holds it (user@host, pid, session ID,
operation, CI job URL), its state, when it was acquired and last renewed,
LOCKED TILL and the time left before another client may take it over. Every
time is the API server's clock, read from its responses, never this machine's.

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

Reads Leases named helm-autorecover.v1.<release> and helm's release Secrets
(sh.helm.release.v1.<release>.v<revision>). Writes nothing.

Exit codes: 0; 2 for a bad flag or release name; 7 when RELEASE is unknown
(no stored revision and no lock). A Lease whose lock record cannot be read or
does not match it (edited by hand, foreign) is shown with a warning on stderr.
`

type locksOptions struct {
	output        string
	allNamespaces bool
	all           bool
	noHeaders     bool
	legacyAfter   time.Duration
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
	if err := legacyAfterFlag(f, &o.legacyAfter, "when a legacy pending revision counts as abandoned, to say when it becomes recoverable (0: never)"); err != nil {
		cmd.RunE = func(*cobra.Command, []string) error { return &guard.ExitError{Code: guard.ExitUsage, Err: err} }
	}
	return cmd
}

func (c *lockCmds) runLocks(ctx context.Context, o *locksOptions, args []string) error {
	format, err := parseOutput(o.output)
	if err != nil {
		return err
	}
	ns := c.settings.Namespace()
	if len(args) == 1 {
		if o.allNamespaces {
			return exitError(guard.ExitUsage, "--all-namespaces: cannot be used with a release name; use -n to name its namespace")
		}
		if err := validRelease(args[0], ns); err != nil {
			return err
		}
	}
	cn, err := c.connect()
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
	if !st.Exists && !ok {
		return inspect.Row{}, unknownRelease(ns, rel)
	}
	r.Name, r.Namespace = rel, ns
	now, err := cn.serverNow(ctx)
	if err != nil {
		return inspect.Row{}, fmt.Errorf("release %q in namespace %q: %w", rel, ns, err)
	}
	return inspect.NewRow(inspect.Input{Lock: st, Release: r, Now: now, Margin: cn.backend.Margin, LegacyAfter: legacyAfter}), nil
}

func unknownRelease(ns, rel string) error {
	return exitError(ExitNotFound, "release %q not found in namespace %q: it has no stored revision and no lock. Check the name and the namespace (-n), or list releases with: helm-autorecover list -A", rel, ns)
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
	locks := map[releaseKey]*lock.Status{}
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
		r := rels[k]
		r.Name, r.Namespace = k.name, k.namespace
		rowNow := now
		if st := locks[k]; st != nil && !st.Now.IsZero() {
			rowNow = st.Now
		}
		rows = append(rows, inspect.NewRow(inspect.Input{Lock: locks[k], Release: r, Now: rowNow, Margin: cn.backend.Margin, LegacyAfter: legacyAfter}))
	}
	inspect.SortRows(rows)
	return rows, nil
}

type releaseKey struct{ namespace, name string }

// latestRevisions reads the latest stored revision of every release in ns
// ("" for all namespaces), or of release alone when it is not empty.
// Only the latest revision of each release is decoded.
// With a driver that keeps no Kubernetes record (sql) it finds none: only
// the Leases are shown.
func (cn *conn) latestRevisions(ctx context.Context, ns, release string) (map[releaseKey]inspect.Release, error) {
	if cn.recsErr != nil {
		return map[releaseKey]inspect.Release{}, nil
	}
	recs := cn.recs
	selector := helmx.LabelOwner + "=" + helmx.OwnerHelm
	if release != "" {
		selector = helmx.HistorySelector(release)
	}
	list, _, err := recs.List(ctx, ns, selector)
	if err != nil {
		if release != "" {
			return nil, fmt.Errorf("release %q in namespace %q: reading its history: %w", release, ns, err)
		}
		return nil, fmt.Errorf("reading helm's release %ss in namespace %q: %w", recs.Kind(), ns, err)
	}
	latest := map[releaseKey]helmx.Record{}
	for _, s := range list {
		k := releaseKey{s.Meta.Namespace, s.Meta.Labels[helmx.LabelName]}
		if k.name == "" {
			continue
		}
		if cur, ok := latest[k]; !ok || s.Revision() > cur.Revision() {
			latest[k] = s
		}
	}
	out := make(map[releaseKey]inspect.Release, len(latest))
	for k, s := range latest {
		r := inspect.Release{Name: k.name, Namespace: k.namespace}
		sum, err := helmx.SummarizeRecord(s)
		if err != nil {
			r.Err = err
		} else {
			r.Latest = &sum
		}
		out[k] = r
	}
	return out, nil
}

// badLock refuses to write under a lock that cannot be trusted.
func badLock(st *lock.Status, rel, ns string) error {
	p := inspect.Problem(st)
	if p == "" {
		return nil
	}
	return exitError(ExitBadLock, "release %q in namespace %q: %s", rel, ns, inspect.BadLockAdvice(st, rel, ns, p, "; nothing was written."))
}

// errIsLocked reports whether err is a lock held by someone else.
func errIsLocked(err error) (*lock.LockedError, bool) {
	var le *lock.LockedError
	if errors.As(err, &le) {
		return le, true
	}
	return nil, false
}

func isPending(s *helmx.Summary) bool { return recovery.IsPending(s.Status) }

// observedLock maps a lock as read (not taken) onto the decision's input.
func observedLock(st *lock.Status) recovery.LockInfo {
	if st == nil || !st.Exists {
		return recovery.LockInfo{State: recovery.LockNone}
	}
	rec := st.Record
	if st.RecordErr != nil {
		rec = nil
	}
	switch {
	case st.HolderIdentity == "" && rec != nil:
		return guard.PreviousLock(lock.Found(rec, lock.Free))
	case st.HolderIdentity == "":
		return recovery.LockInfo{State: recovery.LockNone}
	case rec == nil || rec.Session != st.HolderIdentity:
		state := recovery.LockLive
		if st.State == lock.Expired {
			state = recovery.LockExpired
		}
		return recovery.LockInfo{State: state, Session: st.HolderIdentity, LockedTill: st.LockedTill}
	case st.State == lock.Expired:
		info := guard.LockInfo(rec, recovery.LockExpired)
		info.LockedTill = st.LockedTill
		return info
	}
	info := guard.LockInfo(rec, recovery.LockLive)
	info.LockedTill = st.LockedTill
	return info
}
