package cli

import (
	"context"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
)

func acquireRequest(release, backend string, op protocol.Operation) protocol.Request {
	return protocol.Request{
		Release: release, Namespace: "prod", Operation: op, Backend: backend, Session: protocol.NewSession(),
		Timeout: 5 * time.Minute, LeaseDuration: 15 * time.Second, MaxHold: 10 * time.Minute,
	}
}

// TestFailedTakeHandsOnExpiredHolder: a take that claimed the record's lock
// from an expired holder and then failed on the Lease (a remembered lease
// choice whose rights were taken away) gives the record's lock back naming
// that holder, so the retry with the release backend still recovers what it
// abandoned at once (found Expired, that session), rather than judging the
// pending revision stock helm's.
func TestFailedTakeHandsOnExpiredHolder(t *testing.T) {
	e := newFakeEnv(t, fixture(t)...)
	e.denyLeases()
	conn, err := e.c.connect()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := conn.Take(ctx, acquireRequest("api", "lease", protocol.OpUpgrade)); err == nil {
		t.Fatal("took the Lease although Leases are denied")
	}
	l, err := conn.Take(ctx, acquireRequest("api", "release", protocol.OpUpgrade))
	if err != nil {
		t.Fatal(err)
	}
	if p := l.Previous(); p.Session != sessAPI {
		t.Errorf("after the failed take, recovery sees %+v, not the expired holder %s", p, sessAPI)
	}
}

// TestVirtualLockLostWhileTakingLease: a release with no record has a
// virtual record lock (taking it writes nothing); if another client
// installs revision 1 and holds its gate while the Lease is being taken,
// the take is refused as locked by that client, even without waiting.
func TestVirtualLockLostWhileTakingLease(t *testing.T) {
	e := newFakeEnv(t)
	installed := false
	e.client.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !installed {
			installed = true
			c := record("new", "prod", "cccc0000-3333-4a5b-9c8d-000000000003", lock.OpInstall, 1, at(0), at(0))
			c.LockedTill = at(time.Hour)
			if err := e.client.Tracker().Add(carrying(t, revision(t, "new", "prod", 1, common.StatusPendingInstall, at(0)), c)); err != nil {
				t.Error(err)
			}
		}
		return false, nil, nil
	})
	conn, err := e.c.connect()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err = conn.Take(ctx, acquireRequest("new", "lease", protocol.OpInstall))
	le, locked := protocol.IsLocked(err)
	if !locked || le.HolderIdentity != "cccc0000-3333-4a5b-9c8d-000000000003" {
		t.Fatalf("take = %v; want locked by the client that installed revision 1", err)
	}
}
