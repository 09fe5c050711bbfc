package protocol

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/lock/leasestore"
)

// Reader reads locks as the lock commands do (locks, list, recover,
// unlock) and releases a lock on a person's behalf: the stores it reads
// follow the lock backend chosen (release: the records alone; lease: the
// records and the Leases; auto: both, and the records alone once reading
// Leases is forbidden; with the sql driver, the lock rows and the Leases;
// with a driver that keeps no record, the Leases alone). Every client takes
// the lock on the release's records first, so those show every holder.
type Reader struct {
	conn    *Conn
	backend string
	// lease is the Lease store; records the release record store (nil when
	// the driver keeps no record).
	lease, records *lock.Backend
	// leaseDenied is set once the API server refused to show this caller a
	// Lease under the auto backend.
	leaseDenied atomic.Bool
}

// Reader returns a reader of locks for the lock backend chosen.
func (c *Conn) Reader(backend string) *Reader {
	r := &Reader{conn: c, backend: backend, lease: c.Backend(leasestore.NewBackend(c.client, c.est, c.clock))}
	if gate, err := c.GateBackend(); err == nil {
		r.records = gate
	}
	return r
}

// stores are the stores to read, in order.
func (r *Reader) stores() Stores {
	switch {
	case r.records == nil:
		return Stores{list: []*lock.Backend{r.lease}}
	case r.conn.SQL() != nil:
		return Stores{list: []*lock.Backend{r.records, r.lease}}
	case r.backend == BackendRelease || r.leaseDenied.Load():
		return Stores{list: []*lock.Backend{r.records}}
	}
	return Stores{list: []*lock.Backend{r.records, r.lease}}
}

// read calls read with the stores to read, and again with the records
// alone when the auto backend may not read Leases; a refusal says which
// rights reading needs.
func read[T any](r *Reader, read func(Stores) (T, error)) (T, error) {
	v, err := read(r.stores())
	if err != nil && r.backend == BackendAuto && r.records != nil && !r.leaseDenied.Load() && LeaseForbidden(err) {
		slog.Debug("helm-autorecover: reading Leases is forbidden; reading the locks on the release records alone", slog.Any("error", err))
		r.leaseDenied.Store(true)
		v, err = read(r.stores())
	}
	if err != nil && apierrors.IsForbidden(err) {
		need := "get and list on secrets (configmaps with HELM_DRIVER=configmap)"
		if LeaseForbidden(err) {
			need = "get and list on leases (coordination.k8s.io) with --lock-backend=lease (--lock-backend=release reads the release records alone)"
		}
		err = fmt.Errorf("%w; reading locks needs %s: see docs/rbac.md", err, need)
	}
	return v, err
}

// Inspect reads the lock of rel in ns (Conn.Inspect).
func (r *Reader) Inspect(ctx context.Context, ns, rel string) (*Status, error) {
	return read(r, func(s Stores) (*Status, error) { return r.conn.Inspect(ctx, ns, rel, s) })
}

// InspectConfirmed reads the lock of rel in ns as a command about to act on
// it must (Conn.InspectConfirmed).
func (r *Reader) InspectConfirmed(ctx context.Context, ns, rel string) (*Status, error) {
	return read(r, func(s Stores) (*Status, error) { return r.conn.InspectConfirmed(ctx, ns, rel, s) })
}

// List reports the lock of every release in ns (Conn.List).
func (r *Reader) List(ctx context.Context, ns string) ([]Status, error) {
	return read(r, func(s Stores) ([]Status, error) { return r.conn.List(ctx, ns, s) })
}

// ForceRelease releases session's lock in every store it holds one in, on
// behalf of by (unlock). A Lease this caller may read but not write is
// left to expire by itself (the record's lock, which every client takes
// first, is released): skipped names it.
func (r *Reader) ForceRelease(ctx context.Context, ns, rel, session, by string) (rec *Record, skipped string, err error) {
	var firstErr error
	for _, b := range r.stores().list {
		got, err := b.ForceRelease(ctx, ns, rel, session, by)
		switch {
		case err == nil:
			if rec == nil {
				rec = got
			}
		case b == r.lease && r.records != nil:
			// The record's lock (the lock row, with sql), taken first by
			// every client, decides; the Lease is said to be left
			// (unless there was none to release), and runs out by itself.
			if apierrors.ReasonForError(err) != metav1.StatusReasonUnknown && !apierrors.IsNotFound(err) {
				skipped = fmt.Sprintf("lease/%s (%v)", LeaseName(rel), err)
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

// Margin is what is added to a holder's LOCKED TILL before a lock read
// through this reader may be taken over (lock.TakeoverMargin, unless the
// connection set another).
func (r *Reader) Margin() time.Duration { return r.lease.Margin }
