package helmx

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// seenRequests records what reached a test server: method, path and query.
type seenRequests struct {
	mu   sync.Mutex
	reqs []string
}

func (s *seenRequests) add(r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery)
}

func (s *seenRequests) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.reqs...)
}

// datedServer answers every request 200 with a Date header of date.
func datedServer(t *testing.T, date time.Time) (*httptest.Server, *seenRequests) {
	t.Helper()
	seen := &seenRequests{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.add(r)
		w.Header().Set("Date", date.UTC().Format(http.TimeFormat))
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(srv.Close)
	return srv, seen
}

// clockedLock is a lock that stops by the server's clock, as lock.Held
// does: Valid fails once an answer fed to it (ServerClockFeed) is dated at
// or past till.
type clockedLock struct {
	heldLock
	till time.Time

	mu   sync.Mutex
	seen time.Time // the latest Date fed
}

func (c *clockedLock) FeedServerClock(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		if err == nil {
			if d, perr := http.ParseTime(resp.Header.Get("Date")); perr == nil {
				c.mu.Lock()
				if d.After(c.seen) {
					c.seen = d
				}
				c.mu.Unlock()
			}
		}
		return resp, err
	})
}

func (c *clockedLock) Valid() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.seen.Before(c.till) {
		return fmt.Errorf("the server's clock reads %s, past the lock's LOCKED TILL: %w", c.seen, lock.ErrLost)
	}
	return c.heldLock.Valid()
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

func send(t *testing.T, rt http.RoundTripper, ctx context.Context, method, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(`{"metadata":{"resourceVersion":"7"}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if resp != nil {
		_ = resp.Body.Close()
	}
	return resp, err
}

// TestFenceFeedsTheLockServerTime: an answer helm reads through the fence
// (the object it is about to patch) feeds the lock's clock, so that a
// holder whose own clocks stood still is stopped before the write that
// follows: the write is refused and never sent.
func TestFenceFeedsTheLockServerTime(t *testing.T) {
	past := time.Date(2026, 3, 14, 15, 10, 0, 0, time.UTC)
	srv, seen := datedServer(t, past)
	l := &clockedLock{heldLock: *newHeld("frozen", past.Add(-time.Minute)), till: past.Add(-30 * time.Second)}
	w := &WriteFence{}
	defer w.Guard(GuardedWrites{Namespace: "ns", Release: "web", Resource: "secrets", Lock: l})()
	rt := &fenceRT{next: http.DefaultTransport, w: w}

	obj := srv.URL + "/apis/apps/v1/namespaces/ns/deployments/web"
	if _, err := send(t, rt, context.Background(), http.MethodGet, obj); err != nil {
		t.Fatalf("helm's read: %v", err)
	}
	_, err := send(t, rt, context.Background(), http.MethodPatch, obj)
	if !errors.Is(err, lock.ErrLost) {
		t.Fatalf("helm's patch after a read dated past LOCKED TILL: %v; want refused with ErrLost", err)
	}
	for _, r := range seen.list() {
		if strings.HasPrefix(r, http.MethodPatch) {
			t.Fatalf("the refused patch reached the server: %v", seen.list())
		}
	}
}

// TestOwnWritesJudgedByTheirContextsFence: on OwnWrites' transport, each
// write is judged by the fence its context carries (one per lock): under a
// valid lock it is sent as it is, a record update included (not rewritten
// as helm's are), with the lock's deadline as the server's timeout; under
// a lost lock it is refused and never sent; with no fence it goes out
// untouched.
func TestOwnWritesJudgedByTheirContextsFence(t *testing.T) {
	now := time.Date(2026, 3, 14, 15, 10, 0, 0, time.UTC)
	srv, seen := datedServer(t, now)
	fenceOf := func(rel string, l HelmLock) *WriteFence {
		w := &WriteFence{}
		t.Cleanup(w.Guard(GuardedWrites{Namespace: "ns", Release: rel, Resource: "secrets", Lock: l}))
		return w
	}
	live := newHeld("a-session", now)
	live.deadline = time.Now().Add(time.Minute)
	lost := newHeld("b-session", now)
	lost.valid = fmt.Errorf("taken over: %w", lock.ErrLost)
	a, b := fenceOf("a", live), fenceOf("b", lost)

	rt := OwnWrites(&rest.Config{Host: srv.URL}).WrapTransport(http.DefaultTransport)
	recordA := srv.URL + "/api/v1/namespaces/ns/secrets/" + ReleaseSecretName("a", 2)
	recordB := srv.URL + "/api/v1/namespaces/ns/secrets/" + ReleaseSecretName("b", 2)

	if _, err := send(t, rt, WithFence(context.Background(), a), http.MethodPut, recordA); err != nil {
		t.Fatalf("a write under a's valid lock: %v", err)
	}
	if _, err := send(t, rt, WithFence(context.Background(), b), http.MethodPut, recordB); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("a write under b's lost lock: %v; want refused with ErrLost", err)
	}
	if _, err := send(t, rt, context.Background(), http.MethodPut, recordB); err != nil {
		t.Fatalf("a write with no fence: %v", err)
	}
	got := seen.list()
	if len(got) != 2 {
		t.Fatalf("the server saw %v; want a's write and the unfenced one alone (nothing read by the fence, b's refused)", got)
	}
	if !strings.HasPrefix(got[0], "PUT ") || !strings.Contains(got[0], ReleaseSecretName("a", 2)+"?timeout=") {
		t.Errorf("a's write reached the server as %q; want its PUT with the lock's deadline as timeout", got[0])
	}
	if got[1] != "PUT /api/v1/namespaces/ns/secrets/"+ReleaseSecretName("b", 2)+"?" {
		t.Errorf("the unfenced write reached the server as %q; want it untouched", got[1])
	}
}
