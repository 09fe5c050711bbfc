package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	helmcli "helm.sh/helm/v4/pkg/cli"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/helm-autorecover/helm-autorecover/internal/controller"
	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/guard"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
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
--recover-legacy-after old and none of its hook Jobs or Pods is running; a
live holder, and a young lock-less revision, are never touched. Recovery takes the release's own lock, undoes what the
abandoned revision applied, marks it failed with a description naming the
controller's session, and records an Event (Recovered).

Opt out with the annotation helm-autorecover.io/ignore: "true" on a
Namespace (all its releases), or the label helm-autorecover.io/ignore=true
on a release's records (helm upgrade --labels helm-autorecover.io/ignore=true:
helm copies it to every later revision; an annotation put by hand on one
record covers that revision only), or narrow with -n, --namespaces or
--selector.
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
	sqlPoll        time.Duration
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
			nsFlag := cmd.Flag("namespace")
			scope, err := controllerScope(o.namespaces, nsFlag != nil && nsFlag.Changed, settings.Namespace())
			if err != nil {
				return &exitcode.Error{Code: exitcode.Usage, Err: err}
			}
			o.namespaces = scope
			return runController(cmd.Context(), o, settings, errOut)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.namespaces, "namespaces", nil, "watch only these namespaces (comma-separated; default: helm's -n/--namespace when given, else all)")
	f.StringVar(&o.selector, "selector", "", "only releases whose records match this label selector (added to owner=helm and the pending statuses)")
	f.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "where to serve Prometheus metrics (/metrics); 0 disables")
	f.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "where to serve /healthz and /readyz; 0 disables")
	f.BoolVar(&o.leaderElect, "leader-elect", true, "elect a leader on a Lease, so that replicas can run")
	f.StringVar(&o.leaderNS, "leader-election-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the leader-election Lease (default: $POD_NAMESPACE; required with --leader-elect outside a cluster)")
	f.StringVar(&o.leaderID, "leader-election-id", "helm-autorecover-controller", "name of the leader-election Lease")
	f.IntVar(&o.workers, "workers", 4, "releases recovered at once")
	f.StringVar(&o.helmDriver, "helm-driver", os.Getenv("HELM_DRIVER"), "where helm keeps its release records: secret (the default), configmap or sql (its database in $HELM_DRIVER_SQL_CONNECTION_STRING, as for helm) [HELM_DRIVER]")
	f.DurationVar(&o.sqlPoll, "sql-poll-interval", controller.DefaultSQLPollInterval, "with --helm-driver=sql: how often helm's database is asked for pending releases")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	// The guard's own flags, defaults and environment variables.
	guardFlags := pflag.NewFlagSet("guard", pflag.ContinueOnError)
	_ = o.guard.AddFlags(guardFlags)
	guard.UseWithoutOperation(guardFlags)
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
	case protocol.DriverSQL:
		if os.Getenv(protocol.EnvSQLConnectionString) == "" {
			return &exitcode.Error{Code: exitcode.Usage, Err: fmt.Errorf("--helm-driver=sql needs %s, the PostgreSQL connection string helm uses", protocol.EnvSQLConnectionString)}
		}
		if o.selector != "" {
			return &exitcode.Error{Code: exitcode.Usage, Err: controller.ErrSQLSelector}
		}
		if o.sqlPoll <= 0 {
			return &exitcode.Error{Code: exitcode.Usage, Err: fmt.Errorf("--sql-poll-interval=%s: must be positive", o.sqlPoll)}
		}
	default:
		return &exitcode.Error{Code: exitcode.Usage, Err: fmt.Errorf("--helm-driver=%q: must be secret, configmap or sql (memory keeps releases inside one helm process, out of the controller's reach)", driver)}
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
	rollback := controllerRollback(settings)
	if ctx == nil {
		ctx = context.Background()
	}
	if len(o.namespaces) == 0 {
		slog.Info("serving every namespace (narrow with -n or --namespaces)")
	} else {
		slog.Info("serving only these namespaces", slog.Any("namespaces", o.namespaces))
		warnMissingNamespaces(ctx, cfg, o.namespaces)
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
		SQLPollInterval:         o.sqlPoll,
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
func controllerRollback(settings *helmcli.EnvSettings) func(ctx context.Context, held *protocol.Lock, release string, revision int) error {
	getter := settings.RESTClientGetter()
	return lockRollback(func(held *protocol.Lock) genericclioptions.RESTClientGetter { return held.Fence().Getter(getter) })
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

// controllerScope is the namespaces the controller serves: --namespaces
// when given, else helm's own -n/--namespace when the user gave it (a helm
// user types -n), else none (every namespace). Both, naming different
// namespaces, is refused: the controller runs in exactly the scope the user
// named, or not at all.
func controllerScope(namespaces []string, nsGiven bool, ns string) ([]string, error) {
	var clean []string
	for _, n := range namespaces {
		if n = strings.TrimSpace(n); n != "" {
			clean = append(clean, n)
		}
	}
	if len(namespaces) > 0 && len(clean) == 0 {
		return nil, fmt.Errorf("--namespaces names no namespace; leave it out to serve every namespace")
	}
	if !nsGiven {
		return clean, nil
	}
	if len(clean) == 0 {
		return []string{ns}, nil
	}
	if len(clean) == 1 && clean[0] == ns {
		return clean, nil
	}
	return nil, fmt.Errorf("-n/--namespace %q and --namespaces %q name different scopes; give one of them (--namespaces a,b for several namespaces)", ns, strings.Join(clean, ","))
}

// warnMissingNamespaces logs a warning for each namespace of the scope that
// does not exist (a typo serves nothing, silently otherwise); the
// controller still serves it once it is created. A namespace it may not
// read is not judged.
func warnMissingNamespaces(ctx context.Context, cfg *rest.Config, namespaces []string) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return
	}
	for _, ns := range missingNamespaces(ctx, cs, namespaces) {
		slog.Warn("namespace does not exist: nothing to serve there until it is created; check -n/--namespaces for a typo", slog.String("namespace", ns))
	}
}

// missingNamespaces are those of namespaces the API server says do not exist.
func missingNamespaces(ctx context.Context, cs kubernetes.Interface, namespaces []string) []string {
	var out []string
	for _, ns := range namespaces {
		if _, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			out = append(out, ns)
		}
	}
	return out
}
