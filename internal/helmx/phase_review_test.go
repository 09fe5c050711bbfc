package helmx

// Findings of the adversarial review of preemption's core (issue 34), kept
// as regression tests: each failed at 9eee41b.

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// countingTransport answers every request 200 and counts them.
type countingTransport struct{ got atomic.Int32 }

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.got.Add(1)
	return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader("{}")), Request: req}, nil
}

// TestFenceStaysClosedAfterUnfence (review finding F1): once the
// fence is drained for a preemption and the lock given back (Lock.End
// calls the function Guard returned), helm's operation may still be
// running: in the CLI helm is not told at all (guard.run.preempted; the
// process exits only after End and its stderr writes), and with the Go
// package helm v4's Upgrade.RunWithContext returns on the cancelled context
// while its releasingUpgrade goroutine goes on (post-upgrade hooks, the
// previous revision marked superseded, blind record updates). Every write
// of it must still be refused, until Guard opens the fence again.
func TestFenceStaysClosedAfterUnfence(t *testing.T) {
	next := &countingTransport{}
	w := &WriteFence{}
	stop := w.Guard(GuardedWrites{Namespace: "shop", Release: "web", Resource: "secrets", Lock: drainLock{deadline: time.Now().Add(time.Minute)}})
	w.Drain() // watchAsks' l.drain(), then End's
	stop()    // End's l.unfence(), before the process exits / while helm's goroutine runs
	f := &fenceRT{next: next, w: w}

	// helm's post-upgrade hook Job, created after the lock is free.
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "https://api/apis/batch/v1/namespaces/shop/jobs",
		strings.NewReader(`{"metadata":{"name":"migrate","annotations":{"helm.sh/hook":"post-upgrade"}}}`))
	resp, err := f.RoundTrip(req)
	if err == nil {
		_ = resp.Body.Close()
	}
	// helm's blind update of its revision record (recordRelease).
	req2, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, "https://api/api/v1/namespaces/shop/secrets/sh.helm.release.v1.web.v2",
		strings.NewReader(`{"metadata":{"name":"sh.helm.release.v1.web.v2"}}`))
	resp2, err2 := f.RoundTrip(req2)
	if err2 == nil {
		_ = resp2.Body.Close()
	}
	if n := next.got.Load(); n != 0 {
		t.Fatalf("%d write(s) of the preempted operation reached the API server after its fence was drained and the lock given back (errors: %v, %v); want every one refused", n, err, err2)
	}
}

// TestCloseUnlessBusyIsOneStep (review finding F2): the holder asked to
// stop judges helm stoppable and closes the fence in one step
// (CloseUnlessBusy), so a hook's resource that helm starts to write right
// after is refused rather than let through and left running; and while a
// hook runs, the fence stays open and says why.
func TestCloseUnlessBusyIsOneStep(t *testing.T) {
	next := &countingTransport{}
	w := &WriteFence{}
	stop := w.Guard(GuardedWrites{Namespace: "shop", Release: "web", Resource: "secrets", Lock: drainLock{deadline: time.Now().Add(time.Minute)}})
	defer stop()
	f := &fenceRT{next: next, w: w}
	hook := func() error {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "https://api/apis/batch/v1/namespaces/shop/jobs",
			strings.NewReader(`{"metadata":{"name":"migrate","annotations":{"helm.sh/hook":"post-upgrade"}}}`))
		resp, err := f.RoundTrip(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		return err
	}
	if err := hook(); err != nil {
		t.Fatalf("a hook's write before any request to stop: %v", err)
	}
	why, changed := w.CloseUnlessBusy(nil)
	if why == "" || changed == nil {
		t.Fatalf("CloseUnlessBusy while a hook runs = %q, %v; want busy, with a channel", why, changed)
	}
	// helm's next write (the manifests applied) ends the hook: the holder
	// may stop, and once it closed the fence, helm's next hook is refused.
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPatch, "https://api/apis/apps/v1/namespaces/shop/deployments/web",
		strings.NewReader(`{"metadata":{"name":"web"}}`))
	if resp, err := f.RoundTrip(req); err != nil {
		t.Fatal(err)
	} else {
		_ = resp.Body.Close()
	}
	select {
	case <-changed:
	default:
		t.Fatal("the end of the hook did not close the channel CloseUnlessBusy returned")
	}
	if why, _ := w.CloseUnlessBusy(nil); why != "" {
		t.Fatalf("CloseUnlessBusy after the hook = %q, want the fence closed", why)
	}
	sent := next.got.Load()
	if err := hook(); err == nil || next.got.Load() != sent {
		t.Fatalf("a hook started after the fence was closed for a stop reached the server (err %v)", err)
	}
}

// TestInstallRollbackOnFailureUninstallIsBusy (review finding F6): helm's install --rollback-on-failure (--atomic) undoes a failed
// install with an uninstall: it rewrites the revision uninstalling (a PUT)
// and deletes the release's objects one by one. A holder asked to stop
// must not stop half-way through helm's deletes: some objects gone and
// others not, the very outcome Preemptible refuses to stop an uninstall
// for.
func TestInstallRollbackOnFailureUninstallIsBusy(t *testing.T) {
	next := &countingTransport{}
	w := &WriteFence{}
	stop := w.Guard(GuardedWrites{Namespace: "shop", Release: "web", Resource: "secrets", Lock: drainLock{deadline: time.Now().Add(time.Minute)}})
	defer stop()
	f := &fenceRT{next: next, w: w}
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, "https://api/api/v1/namespaces/shop/secrets/sh.helm.release.v1.web.v1",
		strings.NewReader(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"sh.helm.release.v1.web.v1","namespace":"shop","labels":{"name":"web","owner":"helm","status":"uninstalling","version":"1"}},"type":"helm.sh/release.v1","data":{"release":""}}`))
	if resp, err := f.RoundTrip(req); err == nil {
		_ = resp.Body.Close()
	}
	if why, _ := w.Busy(); why == "" {
		t.Fatal("Busy says helm may be stopped while it uninstalls the release after a failed install (--rollback-on-failure)")
	}
}

// revLock is drainLock holding revision rev.
type revLock struct {
	drainLock
	rev int
}

func (l revLock) Record() lock.Record { return lock.Record{Session: "s-1", Revision: l.rev} }

// TestFailedOperationIsBusy (third review, F2): once helm wrote the
// operation's own revision failed, it ends, or rolls back next
// (--rollback-on-failure: its failed write comes before the rollback's
// pending-rollback create): a request to stop must not cut that short.
// And once helm's operation returned (OperationEnded), a request finds
// nothing to stop (F3).
func TestFailedOperationIsBusy(t *testing.T) {
	w := &WriteFence{}
	stop := w.Guard(GuardedWrites{Namespace: "shop", Release: "web", Resource: "secrets", Lock: revLock{drainLock{deadline: time.Now().Add(time.Minute)}, 2}})
	defer stop()
	f := &fenceRT{next: &countingTransport{}, w: w}
	put := func(rev int, status string) {
		t.Helper()
		name := ReleaseSecretName("web", rev)
		body := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"` + name + `","namespace":"shop","labels":{"name":"web","owner":"helm","status":"` + status + `","version":"2"}},"type":"helm.sh/release.v1","data":{"release":""}}`
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, "https://api/api/v1/namespaces/shop/secrets/"+name, strings.NewReader(body))
		if resp, err := f.RoundTrip(req); err == nil {
			_ = resp.Body.Close()
		}
	}
	put(1, "superseded") // another revision's status: nothing
	if why, _ := w.Busy(); why != "" {
		t.Fatalf("Busy after helm superseded an earlier revision = %q; want \"\"", why)
	}
	put(2, "failed")
	if why, _ := w.Busy(); !strings.Contains(why, "failed") {
		t.Fatalf("Busy after helm wrote its own revision failed = %q; want it busy", why)
	}
	w2 := &WriteFence{}
	stop2 := w2.Guard(GuardedWrites{Namespace: "shop", Release: "web", Resource: "secrets", Lock: revLock{drainLock{deadline: time.Now().Add(time.Minute)}, 2}})
	defer stop2()
	w2.OperationEnded()
	if why, _ := w2.CloseUnlessBusy(nil); why != Ended {
		t.Fatalf("CloseUnlessBusy after the operation ended = %q; want %q", why, Ended)
	}
	w2.ResetPhase()
	if why, _ := w2.CloseUnlessBusy(nil); why != "" {
		t.Fatalf("CloseUnlessBusy after ResetPhase = %q; want the fence closed", why)
	}
}
