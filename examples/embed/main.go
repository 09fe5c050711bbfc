// Command embed shows how a program that drives Helm through its Go SDK
// takes part in helm-autorecover's protocol with pkg/autorecover: it
// upgrades (or installs) one release under the release's lock, recovering
// what a dead holder left, with every write fenced by the lock.
//
//	go run ./examples/embed --release R --namespace NS --chart PATH \
//	    [--set k=v ...] [--wait --timeout D] [--lease-duration D] [--lock-timeout D]
//
// The kubeconfig is found as helm finds it (KUBECONFIG, --kubeconfig,
// --kube-context). Exit codes: 0 done; 1 the upgrade failed; 2 bad flags; 3
// a live holder has the lock (and --lock-timeout, if any, ran out); 4 the
// lock was lost and the upgrade stopped; 5 the release is pending and not
// recoverable yet; 130 interrupted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	helmcli "helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/kube"
	"helm.sh/helm/v4/pkg/storage/driver"
	"helm.sh/helm/v4/pkg/strvals"

	"github.com/helm-autorecover/helm-autorecover/pkg/autorecover"
)

// Exit codes, the same as the helm-autorecover CLI's.
const (
	exitFailed      = 1
	exitUsage       = 2
	exitLocked      = 3
	exitLost        = 4
	exitPending     = 5
	exitInterrupted = 130
)

type setFlags []string

func (s *setFlags) String() string     { return strings.Join(*s, ",") }
func (s *setFlags) Set(v string) error { *s = append(*s, v); return nil }

type options struct {
	release, namespace, chart string
	kubeconfig, kubeContext   string
	sets                      setFlags
	wait                      bool
	timeout                   time.Duration
	leaseDuration             time.Duration
	lockTimeout               time.Duration
	legacyAfter               time.Duration
	backend                   string
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	var o options
	fs := flag.NewFlagSet("embed", flag.ContinueOnError)
	fs.StringVar(&o.release, "release", "", "release name (required)")
	fs.StringVar(&o.namespace, "namespace", "", "release namespace (default: the kubeconfig's)")
	fs.StringVar(&o.chart, "chart", "", "path of the chart (required)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "path of the kubeconfig (default: as helm finds it)")
	fs.StringVar(&o.kubeContext, "kube-context", "", "kubeconfig context to use")
	fs.Var(&o.sets, "set", "set a value, as helm's --set (repeatable)")
	fs.BoolVar(&o.wait, "wait", false, "wait until the release's resources are ready")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "helm's timeout for each wait and hook")
	fs.DurationVar(&o.leaseDuration, "lease-duration", autorecover.DefaultLeaseDuration, "how long the lock stays valid without renewal")
	fs.DurationVar(&o.lockTimeout, "lock-timeout", 0, "wait this long for a live holder (0: fail at once, exit 3)")
	fs.DurationVar(&o.legacyAfter, "recover-legacy-after", autorecover.DefaultLegacyAfter, "recover a revision stock helm left pending once it is this old in server time")
	fs.StringVar(&o.backend, "lock-backend", string(autorecover.BackendAuto), "auto, lease or release")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if o.release == "" || o.chart == "" {
		fmt.Fprintln(os.Stderr, "embed: --release and --chart are required")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := upgrade(ctx, o)
	if err == nil {
		return 0
	}
	fmt.Fprintf(os.Stderr, "embed: %v\n", err)
	switch {
	case errors.Is(err, autorecover.ErrLocked):
		return exitLocked
	case errors.Is(err, autorecover.ErrLost), errors.Is(err, autorecover.ErrMaxHold):
		return exitLost
	case errors.Is(err, autorecover.ErrBlocked):
		return exitPending
	case ctx.Err() != nil:
		return exitInterrupted
	}
	return exitFailed
}

// upgrade is what an embedder writes: a client, then one Run around helm's
// own upgrade action.
func upgrade(ctx context.Context, o options) error {
	// The kubeconfig, context and namespace, as helm finds them.
	settings := helmcli.New()
	if o.kubeconfig != "" {
		settings.KubeConfig = o.kubeconfig
	}
	if o.kubeContext != "" {
		settings.KubeContext = o.kubeContext
	}
	if o.namespace != "" {
		settings.SetNamespace(o.namespace)
	}
	ns := settings.Namespace()
	restConfig, err := settings.RESTClientGetter().ToRESTConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	chrt, err := loader.Load(o.chart)
	if err != nil {
		return fmt.Errorf("chart %s: %w", o.chart, err)
	}
	values := map[string]any{}
	for _, s := range o.sets {
		if err := strvals.ParseInto(s, values); err != nil {
			return fmt.Errorf("--set %s: %w", s, err)
		}
	}

	client, err := autorecover.NewClient(restConfig, autorecover.WithLockBackend(autorecover.Backend(o.backend)))
	if err != nil {
		return err
	}
	rc := autorecover.RunConfig{
		Lock: autorecover.LockRequest{
			Release:       o.release,
			Namespace:     ns,
			Operation:     autorecover.OpUpgrade,
			Timeout:       o.timeout,
			LeaseDuration: o.leaseDuration,
			Wait:          o.lockTimeout,
			OnWait: func(h *autorecover.Holder, left time.Duration) {
				if h != nil {
					fmt.Fprintf(os.Stderr, "embed: waiting for %s (session %s, %s left)\n", h.Who, h.Session, left.Round(time.Second))
				}
			},
		},
		Policy: autorecover.Policy{LegacyAfter: o.legacyAfter},
	}
	return client.Run(ctx, rc, func(ctx context.Context, cfg *action.Configuration) error {
		// Stock helm's field manager, so the helm CLI and this program do
		// not fight over field ownership.
		kube.ManagedFieldsManager = "helm"
		// helm upgrade --install: install when the release has no history.
		hist := action.NewHistory(cfg)
		hist.Max = 1
		if _, err := hist.Run(o.release); errors.Is(err, driver.ErrReleaseNotFound) {
			in := action.NewInstall(cfg)
			in.ReleaseName, in.Namespace, in.Timeout = o.release, ns, o.timeout
			in.WaitStrategy = waitStrategy(o.wait)
			if _, err := in.RunWithContext(ctx, chrt, values); err != nil {
				return err
			}
			fmt.Printf("release %q in namespace %q installed\n", o.release, ns)
			return nil
		}
		up := action.NewUpgrade(cfg)
		up.Namespace, up.Timeout = ns, o.timeout
		up.WaitStrategy = waitStrategy(o.wait)
		if _, err := up.RunWithContext(ctx, o.release, chrt, values); err != nil {
			return err
		}
		fmt.Printf("release %q in namespace %q upgraded\n", o.release, ns)
		return nil
	})
}

func waitStrategy(wait bool) kube.WaitStrategy {
	if wait {
		return kube.StatusWatcherStrategy
	}
	return kube.HookOnlyStrategy
}
