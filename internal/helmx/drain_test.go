package helmx

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// drainLock is a HelmLock that stays valid, with a fixed renew deadline.
type drainLock struct{ deadline time.Time }

func (l drainLock) Valid() error                          { return nil }
func (l drainLock) Session() string                       { return "s-1" }
func (l drainLock) Record() lock.Record                   { return lock.Record{Session: "s-1"} }
func (l drainLock) Deadline() time.Time                   { return l.deadline }
func (l drainLock) Carry(w func(lock.Record) error) error { return w(l.Record()) }

// heldTransport holds every request until release is closed, then answers
// it 200, or with err when one is set; it counts the requests it got.
type heldTransport struct {
	got     atomic.Int32
	arrived chan struct{}
	release chan struct{}
	err     error
}

func (h *heldTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	h.got.Add(1)
	h.arrived <- struct{}{}
	<-h.release
	if h.err != nil {
		return nil, h.err
	}
	return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader("{}")), Request: req}, nil
}

// chartWrite sends a write of a chart object (not a release record)
// through f.
func chartWrite(f *fenceRT) (*http.Response, error) {
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPatch, "https://api/apis/apps/v1/namespaces/shop/deployments/web", strings.NewReader("{}"))
	return f.RoundTrip(req)
}

// TestFenceDrainWaitsForWritesInFlight (issue 31 item 2): after a signal,
// helm's rollback (which it does not cancel) may have a chart write on its
// way when the guard closes the fence. Drain returns only after that write
// has ended, so the lock, given back after Drain, is never free while it
// may still land; and once the fence is drained no write of helm's leaves
// at all. Before, the guard gave the lock back 3 s after the signal while
// such a write could still be committed.
func TestFenceDrainWaitsForWritesInFlight(t *testing.T) {
	next := &heldTransport{arrived: make(chan struct{}, 1), release: make(chan struct{})}
	w := &WriteFence{}
	stop := w.Guard(GuardedWrites{Namespace: "shop", Release: "web", Resource: "secrets", Lock: drainLock{deadline: time.Now().Add(time.Minute)}})
	defer stop()
	f := &fenceRT{next: next, w: w}

	var order []string
	wrote := make(chan error, 1)
	go func() {
		resp, err := chartWrite(f)
		if err == nil {
			_ = resp.Body.Close()
		}
		wrote <- err
	}()
	<-next.arrived // the write is on its way

	drained := make(chan struct{})
	go func() { w.Drain(); close(drained) }()
	// Drain must be waiting for the write: a write started after it is
	// refused without leaving (the fence is closed before Drain waits).
	waitClosed(t, w)
	if _, err := chartWrite(f); err == nil || !strings.Contains(err.Error(), "nothing more of it is written") {
		t.Fatalf("a write after Drain: err = %v; want it refused", err)
	}
	select {
	case <-drained:
		t.Fatal("Drain returned while a write it let through was still on its way")
	default:
	}
	close(next.release)
	if err := <-wrote; err != nil {
		t.Fatalf("the write in flight: %v", err)
	}
	order = append(order, "write ended")
	<-drained
	order = append(order, "drained")
	if got := next.got.Load(); got != 1 {
		t.Errorf("%d writes reached the API server; want only the one sent before Drain", got)
	}
	if strings.Join(order, ", ") != "write ended, drained" {
		t.Errorf("order: %v", order)
	}

	// Guard opens the fence again for the next operation.
	stop()
	next2 := &heldTransport{arrived: make(chan struct{}, 1), release: make(chan struct{})}
	close(next2.release)
	f2 := &fenceRT{next: next2, w: w}
	defer w.Guard(GuardedWrites{Namespace: "shop", Release: "web", Resource: "secrets", Lock: drainLock{deadline: time.Now().Add(time.Minute)}})()
	if resp, err := chartWrite(f2); err != nil {
		t.Fatalf("a write under the next guard: %v", err)
	} else {
		_ = resp.Body.Close()
	}
}

// TestFenceDrainWaitsOutAnUnansweredWrite: a write that left and ended with
// no answer (its connection lost) may still be committed by the API server
// until its deadline, the timeout it was sent with: Drain returns only once
// that deadline has passed.
func TestFenceDrainWaitsOutAnUnansweredWrite(t *testing.T) {
	next := &heldTransport{arrived: make(chan struct{}, 1), release: make(chan struct{}), err: errors.New("connection reset by peer")}
	close(next.release)
	deadline := time.Now().Add(1500 * time.Millisecond)
	w := &WriteFence{}
	defer w.Guard(GuardedWrites{Namespace: "shop", Release: "web", Resource: "secrets", Lock: drainLock{deadline: deadline}})()
	f := &fenceRT{next: next, w: w}
	if _, err := chartWrite(f); err == nil {
		t.Fatal("the write succeeded; the transport fails it")
	}
	<-next.arrived
	w.Drain()
	if now := time.Now(); now.Before(deadline) {
		t.Errorf("Drain returned %s before the deadline of a write that got no answer", deadline.Sub(now))
	}
}

// waitClosed waits until Drain has closed w.
func waitClosed(t *testing.T, w *WriteFence) {
	t.Helper()
	for range 1000 {
		w.mu.Lock()
		closed := w.closed
		w.mu.Unlock()
		if closed {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("Drain did not close the fence")
}
