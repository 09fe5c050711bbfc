package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/inspect"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// conn is one connection to the cluster (the protocol's) and the lock
// backend the lock commands read and take locks with (--lock-backend).
type conn struct {
	*protocol.Conn
	// backend is --lock-backend.
	backend string
	locks   *protocol.Reader
}

func newConn(pc *protocol.Conn, backend string) *conn {
	return &conn{Conn: pc, backend: backend, locks: pc.Reader(backend)}
}

// history reads the stored revisions of rel in ns, oldest first.
func (cn *conn) history(ctx context.Context, ns, rel string) ([]helmx.Summary, error) {
	if _, err := cn.Records(); err != nil {
		return nil, exitError(exitcode.Usage, "release %q in namespace %q: %v; reading and recovering the release history needs the secret, configmap or sql driver (with HELM_DRIVER_SQL_CONNECTION_STRING)", rel, ns, err)
	}
	return cn.History(ctx, ns, rel)
}

// inspect reads the lock of rel (protocol.Reader.Inspect).
func (cn *conn) inspect(ctx context.Context, ns, rel string) (*protocol.Status, error) {
	return cn.locks.Inspect(ctx, ns, rel)
}

// inspectConfirmed reads the lock of rel in ns as a command about to act
// on it must (protocol.Reader.InspectConfirmed).
func (cn *conn) inspectConfirmed(ctx context.Context, ns, rel string) (*protocol.Status, error) {
	return cn.locks.InspectConfirmed(ctx, ns, rel)
}

// list reports the lock of every release in ns (protocol.Reader.List).
func (cn *conn) list(ctx context.Context, ns string) ([]protocol.Status, error) {
	return cn.locks.List(ctx, ns)
}

// forceRelease releases session's lock (protocol.Reader.ForceRelease).
func (cn *conn) forceRelease(ctx context.Context, ns, rel, session, by string) (*protocol.Record, string, error) {
	return cn.locks.ForceRelease(ctx, ns, rel, session, by)
}

// take takes the lock of a lock command (recover, unlock) as the guarded
// commands take theirs (protocol.Conn.Take): a backend that cannot be used
// is a usage error.
func (cn *conn) take(ctx context.Context, req protocol.Request) (*protocol.Lock, error) {
	req.Backend = cn.backend
	held, err := cn.Take(ctx, req)
	if _, ok := errors.AsType[*protocol.BackendError](err); ok {
		return nil, exitError(exitcode.Usage, "release %q in namespace %q: --lock-backend=%s: %v", req.Release, req.Namespace, cn.backend, err)
	}
	return held, err
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
		return nil, fmt.Errorf("reading helm's release %ss %s: %w", recs.Kind(), protocol.InNamespace(ns), err)
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
