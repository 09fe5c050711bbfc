package autorecover

import (
	"context"
	"fmt"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// LockState is how a release's lock was judged, in the API server's clock.
type LockState string

const (
	// LockFree: there is no lock, or its last holder released it.
	LockFree LockState = "free"
	// LockLive: a holder has the lock and its LOCKED TILL has not certainly
	// passed; its operation is protected.
	LockLive LockState = "live"
	// LockExpired: the holder's LOCKED TILL (plus a 250 ms margin) has
	// certainly passed; it has stopped writing, and the next client takes
	// the lock over and recovers what it abandoned.
	LockExpired LockState = "expired"
)

func stateFrom(s protocol.State, confirming bool) LockState {
	if confirming {
		// Expired by the API server's clock, not yet on this client's
		// (see ConfirmIn): live until then.
		return LockLive
	}
	switch s {
	case protocol.Live:
		return LockLive
	case protocol.Expired:
		return LockExpired
	case protocol.Free:
		return LockFree
	}
	return LockLive
}

// LockStatus is what Inspect reports about one release.
type LockStatus struct {
	Release   string
	Namespace string

	// State is the lock's state; LeaseExists is false when the release was
	// never locked (State is then LockFree).
	State       LockState
	LeaseExists bool
	// Holder is the record on the lock: the holder's while live or expired,
	// the last holder's once released; nil when there is none or it could
	// not be read.
	Holder *Holder
	// HolderSession is the session holding the lock; empty when free.
	HolderSession string
	// LockedTill is LOCKED TILL of the holder (zero when free).
	LockedTill time.Time
	// ConfirmIn is set when State is live although LockedTill has passed
	// in the API server's time: it passed too recently for the server's
	// Date header alone to show the holder stopped, and the lock is taken
	// over once this client has seen it unchanged for a lease, in
	// ConfirmIn unless the holder renews it (see docs/protocol.md).
	ConfirmIn time.Duration
	// Waiters counts the live clients queued for the lock.
	Waiters int
	// ServerTime is the API server's clock when the state was judged.
	ServerTime TimeBounds

	// Revisions counts the stored revisions of the release.
	Revisions int
	// LatestRevision and LatestStatus describe the newest stored revision
	// (0 and "" when the release has none).
	LatestRevision int
	LatestStatus   string
	// Pending reports whether the latest revision is pending-install,
	// pending-upgrade, pending-rollback or uninstalling: an operation was
	// under way, or was abandoned, when it was written. Stock helm refuses to
	// upgrade such a release.
	Pending bool
}

// Inspect reads a release's lock and history without changing anything.
func (c *Client) Inspect(ctx context.Context, namespace, release string) (*LockStatus, error) {
	if err := protocol.ValidateReleaseName(release); err != nil {
		return nil, fmt.Errorf("autorecover: inspect release in namespace %q: %w", namespace, err)
	}
	st, err := c.inspectLock(ctx, namespace, release)
	if err != nil {
		return nil, err
	}
	hist, err := c.history(ctx, namespace, release)
	if err != nil {
		return nil, err
	}
	out := &LockStatus{
		Release:       release,
		Namespace:     namespace,
		State:         stateFrom(st.State, st.Confirming),
		LeaseExists:   st.Exists,
		HolderSession: st.HolderIdentity,
		LockedTill:    st.LockedTill,
		Waiters:       len(st.Waiters),
		ServerTime:    TimeBounds{Earliest: st.Now.Earliest, Latest: st.Now.Latest},
		Revisions:     len(hist),
	}
	if st.Confirming {
		out.ConfirmIn = st.ConfirmIn
	}
	if st.RecordErr == nil && (st.HolderIdentity == "" || st.Record == nil || st.Record.Session == st.HolderIdentity) {
		// While held, only the holder's own record describes the holder.
		out.Holder = holderFrom(st.Record)
	}
	if b, ok := c.conn.Estimator().Now(); ok && out.ServerTime.Earliest.IsZero() {
		// No Lease: the history read is the first response that told the time.
		out.ServerTime = TimeBounds{Earliest: b.Earliest, Latest: b.Latest}
	}
	if n := len(hist); n > 0 {
		latest := hist[n-1]
		out.LatestRevision = latest.Revision
		out.LatestStatus = string(latest.Status)
		out.Pending = recovery.IsPending(latest.Status)
	}
	return out, nil
}

// inspectLock reads the release's lock in every store of the client's
// backend, as a client taking it would find it.
func (c *Client) inspectLock(ctx context.Context, namespace, release string) (*protocol.Status, error) {
	_, stores, err := c.conn.Stores(ctx, namespace, string(c.backend))
	if err != nil {
		return nil, fmt.Errorf("autorecover: release %q in namespace %q: %w", release, namespace, err)
	}
	st, err := c.conn.Inspect(ctx, namespace, release, stores)
	if err != nil {
		return nil, fmt.Errorf("autorecover: %w", err)
	}
	return st, nil
}

// history reads every stored revision of the release, oldest first, with
// their resourceVersions.
func (c *Client) history(ctx context.Context, namespace, release string) ([]helmx.Summary, error) {
	h, err := c.conn.History(ctx, namespace, release)
	if err != nil {
		return nil, fmt.Errorf("autorecover: %w", err)
	}
	return h, nil
}
