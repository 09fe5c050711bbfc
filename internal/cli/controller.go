package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	helmcli "helm.sh/helm/v4/pkg/cli"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/helm-autorecover/helm-autorecover/internal/controller"
	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/guard"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
	"github.com/helm-autorecover/helm-autorecover/internal/version"
)

const controllerLong = `Run the in-cluster controller: recover every stuck release of the cluster
(or of --namespaces) at the moment it becomes recoverable, whoever left it.

It watches helm's pending release records (metadata only, label-selected:
owner=helm and a pending status) and judges each pending release exactly as
"helm-autorecover recover" does, in the API server's time: a release whose
lock expired (its holder stopped renewing) is recovered when LOCKED TILL has
passed; a pending revision no lock covers (stock helm wrote it) once it is
--recover-legacy-after old; a live holder, and a young lock-less revision,
are never touched. Recovery takes the release's own lock, undoes what the
abandoned revision applied, marks it failed with a description naming the
controller's session, and records an Event (Recovered).

Opt out with the annotation helm-autorecover.io/ignore: "true" on a
Namespace or on a release's newest record, or narrow with --selector.
Replicas elect a leader on a Lease (--leader-elect); recoveries are safe
under any number of replicas anyway, since each takes the release's lock.

Sets no client-side rate limit on its requests unless helm's --qps (or
HELM_QPS) asks for one; --workers bounds the requests in flight.

Serves Prometheus metrics on --metrics-bind-address (/metrics) and
/healthz and /readyz (ready once its cache synced) on
--health-probe-bind-address. Logs are JSON lines
with release, namespace and session. See docs/controller.md and the chart
in charts/helm-autorecover.
`

type controllerFlags struct {
	namespaces     []string
	selector       string
	metricsAddr    string
	probeAddr      string
	leaderElect    bool
	leaderNS       string
	leaderID       string
	workers        int
	logLevel       string
	helmDriver     string
	guard          guard.Options
	guardFlagNames []string
}

func newControllerCmd(settings *helmcli.EnvSettings, errOut io.Writer) *cobra.Command {
	o := &controllerFlags{}
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "run the in-cluster controller that recovers every stuck release",
		Long:  controllerLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runController(cmd.Context(), o, settings, errOut)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.namespaces, "namespaces", nil, "watch only these namespaces (comma-separated; default: all)")
	f.StringVar(&o.selector, "selector", "", "only releases whose records match this label selector (added to owner=helm and the pending statuses)")
	f.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "where to serve Prometheus metrics (/metrics); 0 disables")
	f.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "where to serve /healthz and /readyz; 0 disables")
	f.BoolVar(&o.leaderElect, "leader-elect", true, "elect a leader on a Lease, so that replicas can run")
	f.StringVar(&o.leaderNS, "leader-election-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the leader-election Lease (default: $POD_NAMESPACE; required with --leader-elect outside a cluster)")
	f.StringVar(&o.leaderID, "leader-election-id", "helm-autorecover-controller", "name of the leader-election Lease")
	f.IntVar(&o.workers, "workers", 4, "releases recovered at once")
	f.StringVar(&o.helmDriver, "helm-driver", os.Getenv("HELM_DRIVER"), "where helm keeps its release records: secret (the default) or configmap [HELM_DRIVER]")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	// The guard's own flags, defaults and environment variables.
	guardFlags := pflag.NewFlagSet("guard", pflag.ContinueOnError)
	_ = o.guard.AddFlags(guardFlags)
	o.guardFlagNames = []string{"lock-backend", "recover-legacy-after", "recover-strategy", "recover-delete-data"}
	for _, name := range o.guardFlagNames {
		f.AddFlag(guardFlags.Lookup(name))
	}
	_ = registerGuardCompletions(cmd)
	return cmd
}

func runController(ctx context.Context, o *controllerFlags, settings *helmcli.EnvSettings, errOut io.Writer) error {
	if err := o.guard.ValidateFlags(o.guardFlagNames...); err != nil {
		return &exitcode.Error{Code: exitcode.Usage, Err: err}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return &exitcode.Error{Code: exitcode.Usage, Err: fmt.Errorf("--log-level=%q: must be debug, info, warn or error", o.logLevel)}
	}
	slog.SetDefault(slog.New(slog.NewJSONHandler(errOut, &slog.HandlerOptions{Level: level})))
	if o.leaderElect && o.leaderNS == "" {
		return &exitcode.Error{Code: exitcode.Usage, Err: fmt.Errorf("--leader-election-namespace is required with --leader-elect when $POD_NAMESPACE is not set")}
	}
	driver := o.helmDriver
	switch driver {
	case "", "secret", "secrets", "configmap", "configmaps":
	default:
		return &exitcode.Error{Code: exitcode.Usage, Err: fmt.Errorf("--helm-driver=%q: must be secret or configmap (the controller reads helm's records in the cluster)", driver)}
	}
	if !qpsSet(settings) {
		// No client-side rate limit unless --qps or HELM_QPS asks for one:
		// client-go's default of 5 requests a second would delay recoveries
		// by minutes when many locks expire together. --workers bounds the
		// requests in flight, and the API server's priority and fairness
		// limits the rest.
		settings.QPS = -1
	}
	cfg, err := settings.RESTClientGetter().ToRESTConfig()
	if err != nil {
		return fmt.Errorf("loading the kubernetes configuration: %w", err)
	}
	cfg.UserAgent = "helm-autorecover-controller/" + version.Version
	// helm's rollback (--recover-strategy rollback) runs on helm's clients
	// built from the same settings, each through the fence of the lock of
	// the release it rolls back.
	rollback := controllerRollback(settings, driver)
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctrl.SetupSignalHandler().Done()
		cancel()
	}()
	return controller.Run(ctx, cfg, controller.Options{
		Namespaces:              o.namespaces,
		HelmDriver:              driver,
		Selector:                o.selector,
		LockBackend:             o.guard.LockBackend,
		Policy:                  recovery.Policy{Autorecover: true, LegacyAfter: o.guard.RecoverLegacyAfter, Strategy: recovery.Strategy(o.guard.RecoverStrategy), Hints: recovery.CLIHints},
		DeleteData:              o.guard.RecoverDeleteData,
		Rollback:                rollback,
		LeaderElect:             o.leaderElect,
		LeaderElectionNamespace: o.leaderNS,
		LeaderElectionID:        o.leaderID,
		MetricsBindAddress:      o.metricsAddr,
		HealthProbeBindAddress:  o.probeAddr,
		Workers:                 o.workers,
		Who:                     "controller@" + hostnameOr("unknown"),
	})
}

// controllerRollback rolls a release back with helm's own action on the
// command line's settings (kubeconfig, context, credentials), through
// clients built for that rollback alone, whose writes go through fence,
// the one of the release's own lock: rollbacks of several releases may run
// at once, each judged by its own lock.
func controllerRollback(settings *helmcli.EnvSettings, driver string) func(ctx context.Context, fence *helmx.WriteFence, namespace, release string, revision int) error {
	getter := settings.RESTClientGetter()
	return func(_ context.Context, fence *helmx.WriteFence, namespace, release string, revision int) error {
		return helmRollback(fence.Getter(getter), namespace, driver, release, revision)
	}
}

// qpsSet reports whether the user chose a client-side rate limit (helm's
// --qps flag or HELM_QPS, as helm parsed them: 0, empty or unparsable
// leave none chosen, as they leave helm's client-go default).
func qpsSet(settings *helmcli.EnvSettings) bool {
	return settings.QPS != 0
}

func hostnameOr(def string) string {
	h, err := os.Hostname()
	if err != nil || strings.TrimSpace(h) == "" {
		return def
	}
	return h
}
