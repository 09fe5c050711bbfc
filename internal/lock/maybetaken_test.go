package lock

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

func TestMayHaveCommitted(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{apierrors.NewGenericServerResponse(http.StatusGatewayTimeout, "put", leaseGR, "x", "", 0, true), true},
		{apierrors.NewInternalError(errors.New("etcdserver: request timed out")), true},
		{apierrors.NewServiceUnavailable("down"), true},
		{apierrors.NewTimeoutError("slow", 1), true},
		{errors.New("connection reset by peer"), true},
		{context.DeadlineExceeded, true},
		{apierrors.NewConflict(leaseGR, "x", nil), false},
		{apierrors.NewAlreadyExists(leaseGR, "x"), false},
		{apierrors.NewForbidden(leaseGR, "x", nil), false},
		{apierrors.NewBadRequest("no"), false},
	} {
		if got := mayHaveCommitted(tc.err); got != tc.want {
			t.Errorf("mayHaveCommitted(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestLostAnswerAfterExpiryTakesAgain (issue 11 item 7): a waiter's create
// committed but its answer was lost, and the API server stayed out of reach
// until that lock of its own had expired. Its next look finds its own
// expired lock: it takes it again with a fresh write and a fresh deadline,
// and reports what its first write found (nothing), not its own record as
// an expired holder's (which would make recovery treat its own lock as an
// abandoned one).
func TestLostAnswerAfterExpiryTakesAgain(t *testing.T) {
	cs, store := newCASClient()
	var mu sync.Mutex
	creates, gets := 0, 0
	cs.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		switch a.GetVerb() {
		case "create":
			creates++
			if creates == 1 {
				_, _, _ = store.react(a) // committed; the answer is lost
				return true, nil, apierrors.NewGenericServerResponse(http.StatusGatewayTimeout, "create", leaseGR, LeaseName("web"), "", 0, true)
			}
		case "get":
			gets++
			if gets == 2 { // the re-read right after the lost answer
				return true, nil, apierrors.NewServiceUnavailable("the API server is restarting")
			}
		}
		return false, nil, nil
	})
	clk := clocktesting.NewFakeClock(t0)
	est := servertime.New(clk)
	est.Observe(clk.Now(), clk.Now(), t0)
	b := fakeClocked(NewLeaseBackend(cs, est, clk))
	const lease = 3 * time.Second

	got := make(chan *part, 1)
	go func() {
		h, err := b.Wait(context.Background(), req(OpUpgrade, lease), nil)
		if err != nil {
			t.Error(err)
		}
		got <- h
	}()
	// The waiter backs off for a second after the failed re-read; let the
	// lock it wrote expire meanwhile.
	eventually(t, "the waiter to back off", func() bool { return clk.Waiters() >= 1 })
	clk.Step(lease + 3*time.Second)
	var h *part
	select {
	case h = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not take its own expired lock")
	}
	if h == nil {
		t.FailNow()
	}
	if h.PreviousState != Free || h.Previous != nil {
		t.Errorf("previous = %v %+v, want free and none (what its first write found)", h.PreviousState, h.Previous)
	}
	l := store.get(ns, LeaseName("web"))
	rec, err := DecodeRecord(l.Annotations[AnnotationRecord])
	if err != nil || rec.Session != h.Session() || !rec.RenewedAt.After(t0.Add(lease)) {
		t.Errorf("lock on the server = %+v, %v; want a fresh take by %s", rec, err, h.Session())
	}
	if want := clk.Now().Add(lease - RenewMargin); !h.Deadline().Equal(want) {
		t.Errorf("deadline %v, want the fresh write's %v", h.Deadline(), want)
	}
}
