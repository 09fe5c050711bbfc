package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"helm.sh/helm/v4/pkg/action"
	helmcli "helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/kube"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/guard"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// guardedCommands are helm's mutating commands and the lock operation each
// one takes.
var guardedCommands = map[string]protocol.Operation{
	"install":   protocol.OpInstall,
	"upgrade":   protocol.OpUpgrade,
	"rollback":  protocol.OpRollback,
	"uninstall": protocol.OpUninstall,
}

// helmSettings reads helm's global settings (kubeconfig, context,
// namespace, ...) from args and the environment exactly as helm does; helm
// keeps its own copy private.
func helmSettings(args []string) *helmcli.EnvSettings {
	settings := helmcli.New()
	fs := pflag.NewFlagSet("helm-settings", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	settings.AddFlags(fs)
	fs.ParseErrorsAllowlist.UnknownFlags = true
	_ = fs.Parse(args) // helm reports bad flags itself when the command runs
	return settings
}

// guardMutating adds the lock and recovery flags to install, upgrade,
// rollback and uninstall and wraps each command's run with the guard. Every
// stock flag keeps working: the command, its flags and its output are
// helm's own.
//
// session is the lock session the guard takes its lock as (chosen before
// helm's storage was initialised: sqlSession); empty chooses a fresh one.
func guardMutating(root *cobra.Command, settings *helmcli.EnvSettings, errOut io.Writer, session string) error {
	for name, op := range guardedCommands {
		cmd := findCommand(root, name)
		if cmd == nil || cmd.RunE == nil {
			return fmt.Errorf("helm command %q not found in the embedded helm", name)
		}
		opts := &guard.Options{}
		if err := opts.AddFlags(cmd.Flags()); err != nil {
			return err
		}
		opts.AddPreemptFlag(cmd.Flags())
		if err := registerGuardCompletions(cmd); err != nil {
			return err
		}
		inner := cmd.RunE
		cmd.RunE = func(c *cobra.Command, args []string) error {
			return runGuarded(c, args, op, opts, settings, errOut, session, inner)
		}
	}
	return nil
}

// guardFlagValues are the values of the guard's enumerated flags, with the
// descriptions shell completion shows.
var guardFlagValues = map[string][]string{
	"lock-backend": {
		protocol.BackendAuto + "\tlease when the caller may use Leases, release otherwise",
		protocol.BackendLease + "\ton the release's newest record and in a Lease",
		protocol.BackendRelease + "\ton the release's newest record only",
	},
	"recover-strategy": {
		string(recovery.StrategyFail) + "\tonly mark the abandoned revision failed",
		string(recovery.StrategyRollback) + "\tthen roll back to the last deployed revision",
	},
}

// registerGuardCompletions completes the values of the guard's enumerated
// flags that cmd has.
func registerGuardCompletions(cmd *cobra.Command) error {
	for flag, values := range guardFlagValues {
		if cmd.Flags().Lookup(flag) == nil {
			continue
		}
		err := cmd.RegisterFlagCompletionFunc(flag, func(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			var out []string
			for _, v := range values {
				if strings.HasPrefix(v, toComplete) {
					out = append(out, v)
				}
			}
			return out, cobra.ShellCompDirectiveNoFileComp
		})
		if err != nil {
			return fmt.Errorf("completion of --%s on %s: %w", flag, cmd.Name(), err)
		}
	}
	return nil
}

func runGuarded(c *cobra.Command, args []string, op protocol.Operation, opts *guard.Options,
	settings *helmcli.EnvSettings, errOut io.Writer, session string, inner func(*cobra.Command, []string) error,
) error {
	if op == protocol.OpInstall {
		var err error
		if args, err = chooseName(c, args); err != nil {
			return err
		}
	}
	releases := guardedReleases(c, op, args)
	// The memory driver keeps releases inside this process: nothing to lock.
	if len(releases) == 0 || isDryRun(c) || os.Getenv("HELM_DRIVER") == "memory" {
		return inner(c, args)
	}
	for _, rel := range releases {
		if err := validRelease(rel, settings.Namespace()); err != nil {
			return err
		}
	}
	cfg, err := settings.RESTClientGetter().ToRESTConfig()
	if err != nil {
		return fmt.Errorf("release %q: loading the kubernetes configuration: %w", releases[0], err)
	}
	timeout, _ := c.Flags().GetDuration("timeout")
	createNS, _ := c.Flags().GetBool("create-namespace")
	keepHistory, _ := c.Flags().GetBool("keep-history")
	g := &guard.Guard{
		Options:    *opts,
		Config:     cfg,
		Stderr:     errOut,
		Clock:      clock.RealClock{},
		Exit:       os.Exit,
		Rollback:   lockRollback(helmGetter),
		HelmDriver: os.Getenv("HELM_DRIVER"),
		Fence:      helmx.DefaultWriteFence,
		AutoMemory: protocol.DefaultAutoMemory(),
		Session:    session,
	}
	ctx := context.Background()
	if op != protocol.OpUninstall {
		t := guard.Target{Op: op, Release: releases[0], Namespace: settings.Namespace(), Timeout: timeout, CreateNamespace: createNS}
		return g.Run(ctx, t, func() error { return inner(c, args) })
	}
	// uninstall takes several releases: each one under its own lock, in turn.
	for _, rel := range releases {
		t := guard.Target{Op: op, Release: rel, Namespace: settings.Namespace(), Timeout: timeout, DeleteLock: !keepHistory}
		if err := g.Run(ctx, t, func() error { return inner(c, []string{rel}) }); err != nil {
			return err
		}
	}
	return nil
}

// chooseName names the release of `install --generate-name` or
// `install --name-template` before helm does, the way helm would (its own
// Install.NameAndChart), so that the install is locked like any other: the
// command goes on as `install NAME CHART`. Other arguments are left for
// helm to judge.
func chooseName(c *cobra.Command, args []string) ([]string, error) {
	gen, _ := c.Flags().GetBool("generate-name")
	tmpl, _ := c.Flags().GetString("name-template")
	if len(args) != 1 || (!gen && tmpl == "") {
		return args, nil
	}
	name, chart, err := (&action.Install{GenerateName: gen, NameTemplate: tmpl}).NameAndChart(args)
	if err != nil {
		return nil, err
	}
	for flag, v := range map[string]string{"generate-name": "false", "name-template": ""} {
		if c.Flags().Lookup(flag) == nil {
			continue
		}
		if err := c.Flags().Set(flag, v); err != nil {
			return nil, fmt.Errorf("release %q: naming it before helm does: %w", name, err)
		}
	}
	return []string{name, chart}, nil
}

// guardedReleases returns the releases an invocation mutates; none when
// helm will reject the arguments anyway.
func guardedReleases(c *cobra.Command, op protocol.Operation, args []string) []string {
	switch op {
	case protocol.OpInstall:
		if gen, _ := c.Flags().GetBool("generate-name"); gen || len(args) < 2 {
			return nil
		}
		return args[:1]
	case protocol.OpUpgrade, protocol.OpRollback:
		if len(args) < 1 {
			return nil
		}
		return args[:1]
	case protocol.OpUninstall:
		return args
	case protocol.OpRecover:
		// Not a helm command: the recover command takes its own lock.
	}
	return nil
}

// isDryRun reports whether the command only simulates: nothing is written,
// so nothing is locked.
func isDryRun(c *cobra.Command) bool {
	f := c.Flags().Lookup("dry-run")
	if f == nil || !f.Changed {
		return false
	}
	switch f.Value.String() {
	case "", "none", "false":
		return false
	}
	return true
}

// lockRollback rolls a release back with helm's own action under held, for
// --recover-strategy=rollback: on the clients getter makes for held (the
// guarded commands and recover use helm's own getter, whose writes the
// fence judges; the controller one built through held's fence), storing
// releases as protocol.Lock.HelmConfig does (with the sql driver, through
// helm's driver opened for held's session).
func lockRollback(getter func(held *protocol.Lock) genericclioptions.RESTClientGetter) func(ctx context.Context, held *protocol.Lock, release string, revision int) error {
	return func(ctx context.Context, held *protocol.Lock, release string, revision int) error {
		cfg, err := held.HelmConfig(ctx, getter(held))
		if err != nil {
			return err
		}
		return helmRollback(cfg, release, revision)
	}
}

// helmGetter is helm's own getter, whatever the lock.
func helmGetter(*protocol.Lock) genericclioptions.RESTClientGetter {
	return helmx.HelmRESTClientGetter()
}

// helmRollback rolls release back to revision with helm's own action on
// cfg.
func helmRollback(cfg *action.Configuration, release string, revision int) error {
	rb := action.NewRollback(cfg)
	rb.Version = revision
	rb.Timeout = 5 * time.Minute
	// As helm's rollback without --wait: wait for hooks only; the
	// requested operation that follows does its own waiting.
	rb.WaitStrategy = kube.HookOnlyStrategy
	return rb.Run(release)
}
