package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"helm.sh/helm/v4/pkg/action"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"

	"github.com/helm-autorecover/helm-autorecover/pkg/autorecover"
)

// Plan is one simulated client: the operation it runs and what goes wrong
// for it.
type Plan struct {
	ID        string
	Op        autorecover.Operation
	Backend   autorecover.Backend
	Lease     time.Duration
	Wait      time.Duration // Run's LockRequest.Wait: 0 refuses a live holder at once
	Start     time.Duration // after the schedule starts
	Work      time.Duration // how long the operation applies, between its writes
	Offset    time.Duration // of its wall clock
	DateShift time.Duration // of the Date headers on its path
	CrashAt   int           // its request the process dies at (0: never)
	// CrashCommits: the request it dies at reaches the server.
	CrashCommits bool
	PauseAt      int // SIGSTOP at this request, for PauseFor
	PauseFor     time.Duration
	SleepAt      int // system sleep at this request, for SleepFor
	SleepFor     time.Duration
	// Clean: no network faults for this client (the final client).
	Clean bool
	// Preempt: while it waits, it asks the holder to stop (issue 34,
	// LockRequest.Preempt).
	Preempt bool
	// Hook: an install or upgrade runs a hook of the chart this long
	// after it created its revision (helm writes the hook's resource, then
	// the chart's once the hook has run): its holder, asked to stop,
	// declines meanwhile.
	Hook time.Duration
}

// Result is what happened to one client.
type Result struct {
	Plan    Plan
	Err     error
	Started time.Time // bubble time
	Ended   time.Time
	Crashed bool
	CrashAt time.Time
	Counts  Counts
	Notes   []string // what the client's helm logged
}

// release and namespace every schedule works on.
const (
	Release   = "app"
	Namespace = "sim"
)

// runClient runs one plan to its end (or its crash) and returns its result.
func runClient(ctx context.Context, m *Model, p Plan, faults Faults, seed int64) Result {
	if err := sleepCtx(ctx, p.Start); err != nil {
		return Result{Plan: p, Err: err}
	}
	res := Result{Plan: p, Started: time.Now()}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	clk := NewClock(p.Offset)
	link := NewLink(m, p.ID, seed)
	if !p.Clean {
		link.Faults = faults
	}
	link.DateShift, link.Clock = p.DateShift, clk
	link.CrashAt, link.CrashCommits = p.CrashAt, p.CrashCommits
	link.PauseAt, link.PauseFor = p.PauseAt, p.PauseFor
	link.SleepAt, link.SleepFor = p.SleepAt, p.SleepFor
	link.OnCrash = cancel
	cfg := &rest.Config{
		Host: "http://sim.invalid", Transport: link, QPS: -1, Timeout: time.Minute,
		ContentConfig: rest.ContentConfig{ContentType: "application/json", AcceptContentTypes: "application/json"},
	}
	c, err := autorecover.NewClient(cfg, autorecover.WithClock(clk), autorecover.WithLockBackend(p.Backend))
	if err != nil {
		res.Err = err
		return res
	}
	req := autorecover.RunConfig{Lock: autorecover.LockRequest{
		Release: Release, Namespace: Namespace, Operation: p.Op, LeaseDuration: p.Lease, Wait: p.Wait,
		Session: p.ID, Who: p.ID, PID: 1, ToolVersion: "sim", Preempt: p.Preempt,
	}}
	res.Err = c.Run(ctx, req, func(ctx context.Context, cfg *action.Configuration) error {
		objs, err := simStorage(cfg)
		if err != nil {
			return err
		}
		return helm(ctx, cfg, objs, p, clk, func(f string, a ...any) { res.Notes = append(res.Notes, fmt.Sprintf(f, a...)) })
	})
	res.Ended = time.Now()
	res.CrashAt, res.Crashed = link.Crashed()
	link.mu.Lock()
	res.Counts = link.Counts
	link.mu.Unlock()
	return res
}

// quiet drops helm's storage warnings (recordRelease's).
var quiet = slog.New(slog.DiscardHandler)

// helm writes the release records of p.Op in the order helm 4's action
// does, through cfg's (fenced) storage, working p.Work between writes; an
// install or upgrade with a hook (p.Hook) writes the hook's resource and
// then the chart's through objs, the same fenced client. An install or
// upgrade whose context ends (the lock lost, or its holder asked to stop)
// marks its revision failed and returns the context's error, writing
// nothing else, as helm 4's do.
func helm(ctx context.Context, cfg *action.Configuration, objs typedcorev1.ConfigMapInterface, p Plan, clk *Clock, note func(string, ...any)) error {
	cfg.SetLogger(quiet.Handler())
	st := cfg.Releases
	hist, err := history(cfg)
	if err != nil {
		return err
	}
	var latest, deployed *rspb.Release
	for _, r := range hist {
		latest = r
		if r.Info.Status == common.StatusDeployed {
			deployed = r
		}
	}
	work := func() error { return sleepCtx(ctx, p.Work) }
	now := clk.Now()
	next := 1
	if latest != nil {
		next = latest.Version + 1
	}
	// finish runs the hook, applies the chart and waits (p.Work), then
	// writes rel as deployed after marking the previous deployed revision
	// superseded; helm only logs the latter's failure.
	finish := func(rel *rspb.Release) error {
		if p.Hook > 0 {
			kind := "pre-upgrade"
			if p.Op == autorecover.OpInstall {
				kind = "pre-install"
			}
			if err := ctx.Err(); err != nil {
				return failed(st, rel, err)
			}
			if err := apply(objs, Release+"-hook", kind); err != nil {
				return failed(st, rel, err)
			}
			if err := sleepCtx(ctx, p.Hook); err != nil {
				return failed(st, rel, err)
			}
			if err := ctx.Err(); err != nil {
				return failed(st, rel, err)
			}
			if err := apply(objs, Release, ""); err != nil {
				return failed(st, rel, err)
			}
		}
		if err := work(); err != nil {
			return failed(st, rel, err)
		}
		if deployed != nil {
			deployed.Info.Status = common.StatusSuperseded
			if err := st.Update(deployed); err != nil {
				note("helm: marking revision %d superseded failed (helm only logs it): %v", deployed.Version, err)
			}
		}
		if err := ctx.Err(); err != nil {
			return failed(st, rel, err)
		}
		rel.Info.Status = common.StatusDeployed
		rel.Info.Description = string(p.Op) + " complete"
		return st.Update(rel)
	}
	switch p.Op {
	case autorecover.OpInstall:
		if latest != nil && latest.Info.Status != common.StatusUninstalled && latest.Info.Status != common.StatusFailed {
			return refusal("cannot re-use a name that is still in use")
		}
		rel := newRelease(next, common.StatusPendingInstall, now)
		if err := st.Create(rel); err != nil {
			return err
		}
		return finish(rel)
	case autorecover.OpUpgrade, autorecover.OpRollback:
		if latest == nil || latest.Info.Status == common.StatusUninstalled {
			return refusal(fmt.Sprintf("%q has no deployed releases", Release))
		}
		if latest.Info.Status.IsPending() {
			return errPending
		}
		status := common.StatusPendingUpgrade
		if p.Op == autorecover.OpRollback {
			status = common.StatusPendingRollback
		}
		rel := newRelease(next, status, now)
		if err := st.Create(rel); err != nil {
			return err
		}
		return finish(rel)
	case autorecover.OpUninstall:
		if latest == nil {
			return refusal("uninstall: Release not loaded: " + Release + ": release: not found")
		}
		if latest.Info.Status == common.StatusUninstalled {
			return refusal(fmt.Sprintf("uninstall: release %q is already uninstalled", Release))
		}
		latest.Info.Status = common.StatusUninstalling
		latest.Info.Deleted = now
		if err := st.Update(latest); err != nil {
			return err
		}
		if err := work(); err != nil {
			return err
		}
		for _, r := range hist {
			if _, err := st.Delete(r.Name, r.Version); err != nil {
				return err
			}
		}
		return nil
	case autorecover.OpRecover:
	}
	return fmt.Errorf("sim: the simulated helm does not run %q", p.Op)
}

// apply writes the ConfigMap name of the chart, as a hook's resource of
// kind hook when hook is set: created, or replaced when it exists (helm's
// apply is no conditional write either).
func apply(objs typedcorev1.ConfigMapInterface, name, hook string) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/instance": Release}}}
	if hook != "" {
		cm.Annotations = map[string]string{helmx.HookAnnotation: hook}
	}
	_, err := objs.Create(context.Background(), cm, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = objs.Update(context.Background(), cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("sim: applying configmap %q: %w", name, err)
	}
	return nil
}

// refusal is the simulated helm's refusal to run its operation on the
// history it read (no release to upgrade, a name still in use): an
// outcome the history explains, which Check does not hold against
// recovery (S2).
type refusal string

func (r refusal) Error() string { return string(r) }

// errPending is helm's refusal of a release whose latest revision is
// pending. It is not a refusal: a client that took over the lock of a dead
// holder must have recovered what the holder left pending (S2).
var errPending = errors.New("another operation (install/upgrade/rollback) is in progress")

// failed marks rel failed when its operation was interrupted, as helm's
// install and upgrade do when their context ends.
func failed(st *storage.Storage, rel *rspb.Release, cause error) error {
	rel.Info.Status = common.StatusFailed
	rel.Info.Description = "sim: " + cause.Error()
	if err := st.Update(rel); err != nil {
		return errors.Join(cause, err)
	}
	return cause
}

func isNotFound(err error) bool { return errors.Is(err, driver.ErrReleaseNotFound) }

func newRelease(version int, status common.Status, now time.Time) *rspb.Release {
	return &rspb.Release{
		Name: Release, Namespace: Namespace, Version: version,
		Info:  &rspb.Info{Status: status, FirstDeployed: now, LastDeployed: now, Description: "sim"},
		Chart: &chart.Chart{Metadata: &chart.Metadata{Name: "app", Version: "1.0.0", APIVersion: "v2"}},
	}
}

// history reads the release's records, oldest first.
func history(cfg *action.Configuration) ([]*rspb.Release, error) {
	hs, err := cfg.Releases.History(Release)
	if err != nil && !isNotFound(err) {
		return nil, err
	}
	var out []*rspb.Release
	for _, h := range hs {
		r, ok := h.(*rspb.Release)
		if !ok {
			return nil, fmt.Errorf("sim: a release record of type %T", h)
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}
