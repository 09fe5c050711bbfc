package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// AnnotationIgnore on a Namespace, or as a label or annotation of a
// release's pending record, set to "true", keeps the controller away from
// it. The label is the lasting way for a release: helm copies labels given
// with --labels to every revision, annotations it does not.
const AnnotationIgnore = "helm-autorecover.io/ignore"

// Options configure the controller (the flags of `helm-autorecover
// controller`).
type Options struct {
	// Namespaces to watch; empty watches all.
	Namespaces []string
	// HelmDriver is helm's storage driver: secret (""), configmap or sql
	// (its database is HELM_DRIVER_SQL_CONNECTION_STRING's, as for helm).
	HelmDriver string
	// SQLPollInterval is how often, with the sql driver, helm's database is
	// asked for pending releases (the records of the other drivers are
	// watched instead); 0 is DefaultSQLPollInterval.
	SQLPollInterval time.Duration
	// Selector narrows the release records considered (added to
	// owner=helm and the pending statuses).
	Selector string
	// LockBackend is the backend of the locks the controller takes to
	// recover (auto, lease or release), as the CLI's --lock-backend.
	LockBackend string
	// Policy is the recovery policy (legacy age, strategy).
	Policy recovery.Policy
	// DeleteData is --recover-delete-data.
	DeleteData bool
	// Rollback rolls a release back with helm's own action for the
	// rollback strategy; nil makes that strategy only mark the revision
	// failed. held is the release's own lock: every client of helm's the
	// rollback uses must be built through its fence (held.Fence().Getter),
	// and its storage be held.HelmConfig's. Rollbacks of different releases
	// may run at once.
	Rollback func(ctx context.Context, held *protocol.Lock, release string, revision int) error

	LeaderElect             bool
	LeaderElectionNamespace string
	LeaderElectionID        string
	MetricsBindAddress      string
	HealthProbeBindAddress  string
	// Workers is how many releases are recovered at once.
	Workers int
	// Who names this process in lock records, history descriptions and
	// Events.
	Who string
}

// pendingStatuses are the statuses of a revision an operation was writing.
// (recovery.IsPending: an uninstall killed mid-way leaves "uninstalling").
var pendingStatuses = []string{"pending-install", "pending-upgrade", "pending-rollback", "uninstalling"}

// recordSelector selects the pending release records the controller
// watches: helm's, pending, and matching the user's selector.
func recordSelector(user string) (labels.Selector, error) {
	sel := labels.NewSelector()
	if user != "" {
		s, err := labels.Parse(user)
		if err != nil {
			return nil, fmt.Errorf("--selector=%q: %w", user, err)
		}
		reqs, _ := s.Requirements()
		sel = sel.Add(reqs...)
	}
	owner, err := labels.NewRequirement(helmx.LabelOwner, selection.Equals, []string{helmx.OwnerHelm})
	if err != nil {
		return nil, err
	}
	status, err := labels.NewRequirement(helmx.LabelStatus, selection.In, pendingStatuses)
	if err != nil {
		return nil, err
	}
	return sel.Add(*owner, *status), nil
}

// ErrSQLSelector: --selector with the sql driver, whose rows carry no
// label but helm's own (name, owner, status, version): a selector on the
// others would select nothing, or everything if ignored.
var ErrSQLSelector = errors.New("--selector cannot be used with --helm-driver=sql: helm's sql rows carry no labels of their own; narrow with --namespaces, or opt a namespace out with the annotation " + AnnotationIgnore + "=true")

// connect is the controller's connection to the cluster cfg points at.
// Recovery's writes through it (converge's, marking revisions failed) are
// judged by the fence of the lock each is made under, which the recovery
// carries in its context (helmx.OwnWrites, Reconciler.recover).
func connect(cfg *rest.Config, helmDriver string) (*protocol.Conn, error) {
	return protocol.Connect(helmx.OwnWrites(cfg), clock.RealClock{}, helmDriver)
}

// Run runs the controller until ctx ends.
func Run(ctx context.Context, cfg *rest.Config, o Options) error {
	ctrl.SetLogger(logr.FromSlogHandler(slog.Default().Handler()))
	useSQL := o.HelmDriver == protocol.DriverSQL
	if useSQL && o.Selector != "" {
		return ErrSQLSelector
	}
	var recordObj client.Object = &corev1.Secret{}
	kind := "Secret"
	if !useSQL {
		driver, err := records.ParseDriver(o.HelmDriver)
		if err != nil {
			return fmt.Errorf("--helm-driver: %w", err)
		}
		if driver == records.DriverConfigMap {
			recordObj, kind = &corev1.ConfigMap{}, "ConfigMap"
		}
	}
	sel, err := recordSelector(o.Selector)
	if err != nil {
		return err
	}
	cacheOpts := cache.Options{}
	if !useSQL {
		// Metadata only, pending only: helm's release data is read,
		// uncached, only for a release being recovered.
		meta := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: kind}}
		cacheOpts.ByObject = map[client.Object]cache.ByObject{meta: {Label: sel}}
	}
	if len(o.Namespaces) > 0 {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range o.Namespaces {
			cacheOpts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	leaseDuration, renewDeadline, retryPeriod := 15*time.Second, 10*time.Second, 2*time.Second
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Cache:                         cacheOpts,
		Metrics:                       metricsserver.Options{BindAddress: o.MetricsBindAddress},
		HealthProbeBindAddress:        o.HealthProbeBindAddress,
		LeaderElection:                o.LeaderElect,
		LeaderElectionID:              o.LeaderElectionID,
		LeaderElectionNamespace:       o.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &leaseDuration,
		RenewDeadline:                 &renewDeadline,
		RetryPeriod:                   &retryPeriod,
	})
	if err != nil {
		return fmt.Errorf("controller manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	// Ready once the cache of pending records has synced: before that, a
	// replica would not see the releases it should judge.
	if err := mgr.AddReadyzCheck("cache-synced", func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("the cache of pending release records has not synced yet")
		}
		return nil
	}); err != nil {
		return err
	}
	conn, err := connect(cfg, o.HelmDriver)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	r := &Reconciler{
		Conn:    conn,
		Cache:   mgr.GetClient(),
		Options: o,
		metrics: newMetrics(crmetrics.Registry),
		kind:    kind,
		sql:     useSQL,
	}
	workers := max(o.Workers, 1)
	b := ctrl.NewControllerManagedBy(mgr).Named("helm-releases")
	if useSQL {
		// helm's rows are outside the cluster: the leader polls its
		// database for pending releases (pollSQL).
		found := make(chan event.TypedGenericEvent[types.NamespacedName], 64)
		if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
			pollSQL(ctx, conn, o, found)
			return nil
		})); err != nil {
			return err
		}
		b = b.WatchesRawSource(source.Channel(found, handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, n types.NamespacedName) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: n}}
		})))
	} else {
		b = b.WatchesMetadata(recordObj, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
			name := obj.GetLabels()[helmx.LabelName]
			if name == "" {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: name}}}
		}))
	}
	err = b.
		WithOptions(crcontroller.Options{
			MaxConcurrentReconciles: workers,
			// Failed recoveries (RBAC, conflicts) are retried from 1 s,
			// doubling to 5 minutes: never hot-looped.
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](time.Second, 5*time.Minute),
		}).
		Complete(r)
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	slog.Info("helm-autorecover controller starting", slog.String("who", o.Who), slog.Any("namespaces", o.Namespaces), slog.String("selector", sel.String()), slog.Bool("leader_elect", o.LeaderElect))
	go func() {
		select {
		case <-mgr.Elected():
			slog.Info("leading: this replica recovers stuck releases now", slog.Bool("leader_elect", o.LeaderElect))
		case <-ctx.Done():
		}
	}()
	return mgr.Start(ctx)
}

// DefaultSQLPollInterval is how often a controller of a sql-backed cluster
// asks helm's database for pending releases. A release is pending from the
// start of its operation; polled this often, it is seen long before a dead
// holder's lock (30 s by default) expires, and is then judged again at the
// lock's expiry (Next), as with the watched drivers.
const DefaultSQLPollInterval = 5 * time.Second

// sqlResync is how often a release that stays pending is handed to the
// queue again, as an informer's resync would: between, the reconciler's own
// requeue (at the lock's expiry) judges it again.
const sqlResync = time.Minute

// pollSQL asks helm's sql database for pending releases every
// o.SQLPollInterval until ctx ends, and hands to the controller's queue
// each release newly pending, and each still pending once a sqlResync. It
// runs on the leader only (a manager.RunnableFunc needs leader election).
func pollSQL(ctx context.Context, conn *protocol.Conn, o Options, found chan<- event.TypedGenericEvent[types.NamespacedName]) {
	every := o.SQLPollInterval
	if every <= 0 {
		every = DefaultSQLPollInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	handed := map[types.NamespacedName]time.Time{}
	for {
		qctx, cancel := context.WithTimeout(ctx, every+10*time.Second)
		pending, err := conn.PendingSQL(qctx, o.Namespaces, pendingStatuses)
		cancel()
		if err != nil {
			slog.Error("listing pending releases in helm's sql database failed; asking again at the next poll", slog.Any("error", err))
			pending = nil
		}
		now := time.Now()
		still := make(map[types.NamespacedName]time.Time, len(pending))
		for _, n := range pending {
			at, ok := handed[n]
			if ok && now.Sub(at) < sqlResync {
				still[n] = at
				continue
			}
			still[n] = now
			select {
			case found <- event.TypedGenericEvent[types.NamespacedName]{Object: n}:
			case <-ctx.Done():
				return
			}
		}
		if err == nil {
			handed = still
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}
