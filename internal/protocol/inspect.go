package protocol

import (
	"context"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// Inspect reads the lock of rel in every store and returns the one that
// matters: a live one first (the record's before the Lease's), then an
// expired one, then one that names a last holder, else the Lease's.
//
// A lock that looks live only because this process's estimate of server
// time is still too wide to tell is read again once the estimate can tell
// (within about a second; lock.Backend.Settled), so that every command
// run after a lock expired sees it expired.
func (c *Conn) Inspect(ctx context.Context, ns, rel string, stores Stores) (*lock.Status, error) {
	return settledRead(func() (*lock.Status, bool, error) {
		var sts []*lock.Status
		unsettled := false
		for _, b := range stores.list {
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

// InspectConfirmed is Inspect for a command about to act on what it reads
// (unlock, recover): a lock expired in server time but not yet confirmed on
// this process's clock (lock.Status.Confirming) is read again once it could
// be, a lease at most, so that a dead holder's lock reads expired and one
// whose holder renews meanwhile reads live, as a take would judge them.
func (c *Conn) InspectConfirmed(ctx context.Context, ns, rel string, stores Stores) (*lock.Status, error) {
	st, err := c.Inspect(ctx, ns, rel, stores)
	// Twice at most: a holder that renewed during the first wait is
	// judged again once; one still confirming after that is live.
	for range 2 {
		if err != nil || !st.Confirming {
			break
		}
		t := c.clock.NewTimer(st.ConfirmIn + time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return st, nil
		case <-t.C():
		}
		st, err = c.Inspect(ctx, ns, rel, stores)
	}
	return st, err
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
		func(s *lock.Status) bool { return s.State == lock.Live || s.Confirming },
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

// List reports the lock of every release in ns ("" for all namespaces) in
// any store, one status per release, chosen as Inspect does.
func (c *Conn) List(ctx context.Context, ns string, stores Stores) ([]lock.Status, error) {
	return settledRead(func() ([]lock.Status, bool, error) { return listOnce(ctx, ns, stores) })
}

func listOnce(ctx context.Context, ns string, stores Stores) ([]lock.Status, bool, error) {
	byRelease := map[string][]*lock.Status{}
	var order []string
	unsettled := false
	for _, b := range stores.list {
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

// InspectParts reads the lock of rel in each of stores, in order, with no
// settling: what each part says now (a benchmark's view of the locks it
// took).
func (c *Conn) InspectParts(ctx context.Context, ns, rel string, stores Stores) ([]*lock.Status, error) {
	out := make([]*lock.Status, 0, len(stores.list))
	for _, b := range stores.list {
		st, err := b.Inspect(ctx, ns, rel)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}
