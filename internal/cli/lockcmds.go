package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
	helmcli "helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/cli/output"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/guard"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/inspect"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
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
	connect func() (*protocol.Conn, error)
	// backend is the command's --lock-backend (open checks it).
	backend string
	// who names the person running the command (user@host).
	who func() string
	// newSession returns the session ID of a lock this process takes.
	newSession func() string
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
		who:        protocol.DefaultWho,
		newSession: protocol.NewSession,
	}
	c.connect = c.realConnect
	for _, cmd := range []*cobra.Command{newLocksCmd(c), newUnlockCmd(c), newRecoverCmd(c)} {
		_ = registerGuardCompletions(cmd) // --lock-backend, --recover-strategy
		root.AddCommand(usageErrors(cmd))
	}
	root.AddCommand(usageErrors(newControllerCmd(settings, errOut)))
	wrapList(root, c)
}

func (c *lockCmds) realConnect() (*protocol.Conn, error) {
	cfg, err := c.settings.RESTClientGetter().ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubernetes configuration: %w", err)
	}
	return protocol.Connect(cfg, clock.RealClock{}, os.Getenv("HELM_DRIVER"))
}

// open connects to the cluster with the command's --lock-backend.
func (c *lockCmds) open() (*conn, error) {
	if c.backend == "" {
		c.backend = guard.DefaultLockBackend
	}
	if err := guard.ValidateLockBackend(c.backend); err != nil {
		return nil, &exitcode.Error{Code: exitcode.Usage, Err: err}
	}
	pc, err := c.connect()
	if err != nil {
		return nil, err
	}
	return newConn(pc, c.backend), nil
}

// exitError gives err a documented exit code.
func exitError(code int, format string, args ...any) error {
	return &exitcode.Error{Code: code, Err: fmt.Errorf(format, args...)}
}

// validRelease checks a release name argument (exit code 2).
func validRelease(name, ns string) error {
	if err := protocol.ValidateReleaseName(name); err != nil {
		return exitError(exitcode.Usage, "release %q in namespace %q: %w", name, ns, err)
	}
	return nil
}

// usageErrors gives cmd's flag errors exit code 2, as for the guard's flags.
func usageErrors(cmd *cobra.Command) *cobra.Command {
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &exitcode.Error{Code: exitcode.Usage, Err: err}
	})
	return cmd
}

// oneRelease and atMostOneRelease check the arguments (exit code 2).
func oneRelease(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return exitError(exitcode.Usage, "%s: needs exactly one argument, the release name; got %d (see %s --help)", cmd.Name(), len(args), cmd.Name())
	}
	return nil
}

func atMostOneRelease(cmd *cobra.Command, args []string) error {
	if len(args) > 1 {
		return exitError(exitcode.Usage, "%s: takes at most one argument, a release name; got %d (see %s --help)", cmd.Name(), len(args), cmd.Name())
	}
	return nil
}

// legacyAfterFlag registers --recover-legacy-after with the guard's default
// and environment variable. The check it returns reports a variable that
// does not parse, unless the flag was given.
func legacyAfterFlag(fs *pflag.FlagSet, v *time.Duration, usage string) (check func() error) {
	d, envErr := guard.DurationEnv(guard.EnvRecoverLegacyAfter, guard.DefaultRecoverLegacyAfter)
	*v = d
	fs.DurationVar(v, "recover-legacy-after", *v, usage+" ["+guard.EnvRecoverLegacyAfter+"]")
	return func() error {
		if envErr == nil || fs.Changed("recover-legacy-after") {
			return nil
		}
		return &exitcode.Error{Code: exitcode.Usage, Err: fmt.Errorf("%w: %s", envErr, guard.EnvAdvice)}
	}
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
		return "", exitError(exitcode.Usage, "--output=%q: must be table, json or yaml", s)
	}
	return f, nil
}

func unknownRelease(ns, rel string) error {
	return exitError(exitcode.NotFound, "release %q not found in namespace %q: it has no stored revision and no lock. Check the name and the namespace (-n), or list releases with: helm-autorecover list -A", rel, ns)
}

// badLock refuses to write under a lock that cannot be trusted.
func badLock(st *protocol.Status, rel, ns string) error {
	p := inspect.Problem(st)
	if p == "" {
		return nil
	}
	return exitError(exitcode.BadLock, "release %q in namespace %q: %s", rel, ns, inspect.BadLockAdvice(st, rel, ns, p, "; nothing was written."))
}

func isPending(s *helmx.Summary) bool { return recovery.IsPending(s.Status) }

// keep renews held while a lock command works under it; the function it
// returns stops renewing and releases the lock (a lock already lost is left
// to run out by itself).
func (c *lockCmds) keep(ctx context.Context, held *protocol.Lock, rel, ns string) (release func()) {
	done := held.Hold(ctx)
	return func() {
		if err := done(); err != nil {
			fmt.Fprintf(c.errOut, "Warning: releasing the lock of release %q in namespace %q: %v (it expires by itself)\n", rel, ns, err)
		}
	}
}
