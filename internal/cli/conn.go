package cli

import (
	"context"
	"fmt"

	"github.com/helm-autorecover/helm-autorecover/internal/guard"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/inspect"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// conn is one connection to the cluster (the protocol's) and the lock
// stores the lock commands read and take: the release record's lock and the
// Lease (the Lease alone with a driver that keeps no record).
type conn struct {
	*protocol.Conn
	// lease is the Lease store; records the release record store (nil when
	// the driver keeps no record, as with sql).
	lease   *lock.Backend
	records *lock.Backend
}

func newConn(pc *protocol.Conn) *conn {
	cn := &conn{Conn: pc, lease: lock.NewLeaseBackend(pc.Client(), pc.Estimator(), pc.Clock())}
	if d, err := records.ParseDriver(pc.Driver()); err == nil {
		cn.records = lock.NewReleaseBackend(pc.Client(), pc.Estimator(), pc.Clock(), d)
	}
	return cn
}

// history reads the stored revisions of rel in ns, oldest first.
func (cn *conn) history(ctx context.Context, ns, rel string) ([]helmx.Summary, error) {
	if _, err := cn.Records(); err != nil {
		return nil, exitError(guard.ExitUsage, "release %q in namespace %q: %v; reading and recovering the release history needs the secret or configmap driver", rel, ns, err)
	}
	return cn.History(ctx, ns, rel)
}

// stores are the locks an operation of this process takes, in order.
func (cn *conn) stores() []*lock.Backend {
	if cn.records == nil {
		return []*lock.Backend{cn.lease}
	}
	return []*lock.Backend{cn.records, cn.lease}
}

// inspect reads the lock of rel in both stores and returns the one that
// matters: a live one first (the record's before the Lease's), then an
// expired one, then one that names a last holder, else the Lease's.
//
// A lock that looks live only because this process's estimate of server
// time is still too wide to tell is read again once the estimate can tell
// (within about a second; lock.Backend.Settled), so that every command
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
// (lock.Backend.Settled): the second read judges it anew.
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

// serverNow returns bounds on the API server's clock.
func (cn *conn) serverNow(ctx context.Context) (servertime.Bounds, error) { return cn.ServerNow(ctx) }

type releaseKey struct{ namespace, name string }

// latestRevisions reads the latest stored revision of every release in ns
// ("" for all namespaces), or of release alone when it is not empty.
// Only the latest revision of each release is decoded.
// With a driver that keeps no Kubernetes record (sql) it finds none: only
// the Leases are shown.
func (cn *conn) latestRevisions(ctx context.Context, ns, release string) (map[releaseKey]inspect.Release, error) {
	recs, err := cn.Records()
	if err != nil {
		return map[releaseKey]inspect.Release{}, nil
	}
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
