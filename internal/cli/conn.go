package cli

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
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
	// backend is --lock-backend: which stores are read (release: the
	// records alone; lease: the records and the Leases; auto: both, and the
	// records alone once reading Leases is forbidden) and taken (as the
	// guarded commands take them: protocol.Conn.Stores).
	backend string
	// lease is the Lease store; records the release record store (nil when
	// the driver keeps no record, as with sql).
	lease   *lock.Backend
	records *lock.Backend
	// leaseDenied is set once the API server refused to show this caller a
	// Lease under the auto backend.
	leaseDenied atomic.Bool
}

func newConn(pc *protocol.Conn, backend string) *conn {
	cn := &conn{Conn: pc, backend: backend, lease: pc.Backend(lock.NewLeaseBackend(pc.Client(), pc.Estimator(), pc.Clock()))}
	if gate, err := pc.GateBackend(); err == nil {
		cn.records = gate
	}
	return cn
}

// history reads the stored revisions of rel in ns, oldest first.
func (cn *conn) history(ctx context.Context, ns, rel string) ([]helmx.Summary, error) {
	if _, err := cn.Records(); err != nil {
		return nil, exitError(exitcode.Usage, "release %q in namespace %q: %v; reading and recovering the release history needs the secret, configmap or sql driver (with HELM_DRIVER_SQL_CONNECTION_STRING)", rel, ns, err)
	}
	return cn.History(ctx, ns, rel)
}

// readStores are the stores the lock commands read, in order.
func (cn *conn) readStores() []*lock.Backend {
	switch {
	case cn.records == nil:
		return []*lock.Backend{cn.lease}
	case cn.SQL() != nil:
		// With the sql driver every client takes the lock row and the
		// Lease (earlier versions the Lease alone): both are read.
		return []*lock.Backend{cn.records, cn.lease}
	case cn.backend == protocol.BackendRelease || cn.leaseDenied.Load():
		return []*lock.Backend{cn.records}
	}
	return []*lock.Backend{cn.records, cn.lease}
}

// takeStores are the stores a lock command takes a lock in, chosen as the
// guarded commands choose them.
func (cn *conn) takeStores(ctx context.Context, ns, rel string) ([]*lock.Backend, error) {
	_, stores, err := cn.Stores(ctx, ns, cn.backend)
	if err != nil {
		return nil, exitError(exitcode.Usage, "release %q in namespace %q: --lock-backend=%s: %v", rel, ns, cn.backend, err)
	}
	return stores, nil
}

// readLocks calls read with the stores to read. Under the auto backend, a
// caller the API server does not let read Leases (the release backend's
// Role, docs/rbac.md) reads the release records alone: every client takes
// the record's lock first, so it shows every holder.
func readLocks[T any](cn *conn, read func([]*lock.Backend) (T, error)) (T, error) {
	v, err := read(cn.readStores())
	if err != nil && cn.backend == protocol.BackendAuto && cn.records != nil && !cn.leaseDenied.Load() && protocol.LeaseForbidden(err) {
		slog.Debug("helm-autorecover: reading Leases is forbidden; reading the locks on the release records alone", slog.Any("error", err))
		cn.leaseDenied.Store(true)
		v, err = read(cn.readStores())
	}
	if err != nil && apierrors.IsForbidden(err) {
		need := "get and list on secrets (configmaps with HELM_DRIVER=configmap)"
		if protocol.LeaseForbidden(err) {
			need = "get and list on leases (coordination.k8s.io) with --lock-backend=lease (--lock-backend=release reads the release records alone)"
		}
		err = fmt.Errorf("%w; reading locks needs %s: see docs/rbac.md", err, need)
	}
	return v, err
}

// inspect reads the lock of rel in every store (protocol.Conn.Inspect).
func (cn *conn) inspect(ctx context.Context, ns, rel string) (*lock.Status, error) {
	return readLocks(cn, func(stores []*lock.Backend) (*lock.Status, error) { return cn.Inspect(ctx, ns, rel, stores) })
}

// inspectConfirmed reads the lock of rel in ns as a command about to act
// on it must (protocol.Conn.InspectConfirmed).
func (cn *conn) inspectConfirmed(ctx context.Context, ns, rel string) (*lock.Status, error) {
	return readLocks(cn, func(stores []*lock.Backend) (*lock.Status, error) {
		return cn.InspectConfirmed(ctx, ns, rel, stores)
	})
}

// list reports the lock of every release in ns (protocol.Conn.List).
func (cn *conn) list(ctx context.Context, ns string) ([]lock.Status, error) {
	return readLocks(cn, func(stores []*lock.Backend) ([]lock.Status, error) { return cn.List(ctx, ns, stores) })
}

// forceRelease releases session's lock in every store it holds one in. A
// Lease this caller may read but not write is left to expire by itself
// (the record's lock, which every client takes first, is released):
// skipped names it.
func (cn *conn) forceRelease(ctx context.Context, ns, rel, session, by string) (rec *lock.Record, skipped string, err error) {
	var firstErr error
	for _, b := range cn.readStores() {
		r, err := b.ForceRelease(ctx, ns, rel, session, by)
		switch {
		case err == nil:
			if rec == nil {
				rec = r
			}
		case b == cn.lease && cn.records != nil:
			// The record's lock (the lock row, with sql), taken first by
			// every client, decides; the Lease is said to be left
			// (unless there was none to release), and runs out by itself.
			if apierrors.ReasonForError(err) != metav1.StatusReasonUnknown && !apierrors.IsNotFound(err) {
				skipped = fmt.Sprintf("lease/%s (%v)", lock.LeaseName(rel), err)
			}
			if firstErr == nil {
				firstErr = err
			}
		case firstErr == nil:
			firstErr = err
		}
	}
	if rec != nil {
		return rec, skipped, nil
	}
	return nil, "", firstErr
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
	// Metadata only: the answer needs labels, annotations and server-set
	// times, and a release's records can be near 1 MiB each.
	list, _, err := recs.ListMeta(ctx, ns, selector)
	if err != nil {
		if release != "" {
			return nil, fmt.Errorf("release %q in namespace %q: reading its history: %w", release, ns, err)
		}
		return nil, fmt.Errorf("reading helm's release %ss %s: %w", recs.Kind(), lock.InNamespace(ns), err)
	}
	latest := map[releaseKey]helmx.Record{}
	for _, s := range list {
		k := releaseKey{s.Meta.Namespace, s.Meta.Labels[helmx.LabelName]}
		if k.name == "" {
			continue
		}
		if cur, ok := latest[k]; !ok || records.Compare(s.Meta.Name, s.Meta.Labels, cur.Meta.Name, cur.Meta.Labels) > 0 {
			latest[k] = s
		}
	}
	out := make(map[releaseKey]inspect.Release, len(latest))
	for k, s := range latest {
		r := inspect.Release{Name: k.name, Namespace: k.namespace}
		sum, ok := helmx.SummarizeMeta(s)
		if ok {
			r.Latest = &sum
			out[k] = r
			continue
		}
		// Labels that do not say: read the whole record.
		full, err := recs.Get(ctx, s.Meta.Namespace, s.Meta.Name)
		if err == nil {
			sum, err = helmx.SummarizeRecord(full)
		}
		if err != nil {
			r.Err = err
		} else {
			r.Latest = &sum
		}
		out[k] = r
	}
	return out, nil
}
