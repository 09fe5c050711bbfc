package helmx

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// throttlingServer answers the first n requests with code and Retry-After
// retryAfter ("" for none), then 200 "ok"; it counts requests.
func throttlingServer(t *testing.T, n int32, code int, retryAfter string) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var count atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if count.Add(1) <= n {
			if retryAfter != "" {
				w.Header().Set("Retry-After", retryAfter)
			}
			http.Error(w, "throttled", code)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	return srv, &count
}

func getVia(t *testing.T, ctx context.Context, srv *httptest.Server) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/v1/namespaces/ns/secrets", nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &fenceRT{next: http.DefaultTransport, w: &WriteFence{}}
	resp, err := f.read(req)
	if resp != nil {
		t.Cleanup(func() { _ = resp.Body.Close() })
	}
	return resp, err
}

// TestFenceReadRetriesThrottling: the fence's own reads are sent again
// after a 429 (with or without Retry-After) and after a 5xx that carries
// Retry-After, as client-go does, instead of failing helm's write.
func TestFenceReadRetriesThrottling(t *testing.T) {
	for _, c := range []struct {
		name       string
		code       int
		retryAfter string
		wantCode   int
		wantSent   int32
	}{
		{"429 with Retry-After", http.StatusTooManyRequests, "0", http.StatusOK, 3},
		{"503 with Retry-After", http.StatusServiceUnavailable, "0", http.StatusOK, 3},
		{"500 without Retry-After is not retried", http.StatusInternalServerError, "", http.StatusInternalServerError, 1},
		{"409 is not retried", http.StatusConflict, "0", http.StatusConflict, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, sent := throttlingServer(t, 2, c.code, c.retryAfter)
			resp, err := getVia(t, context.Background(), srv)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != c.wantCode || sent.Load() != c.wantSent {
				t.Errorf("answer %d after %d requests; want %d after %d", resp.StatusCode, sent.Load(), c.wantCode, c.wantSent)
			}
		})
	}
}

// TestFenceReadGivesUpBeforeDeadline: a Retry-After that would end past the
// request's deadline (the lock's renew deadline) is not waited for: the
// throttled answer comes back at once, and helm's write fails rather than
// outliving the lock.
func TestFenceReadGivesUpBeforeDeadline(t *testing.T) {
	srv, sent := throttlingServer(t, 100, http.StatusTooManyRequests, "5")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := getVia(t, ctx, srv)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusTooManyRequests || sent.Load() != 1 {
		t.Errorf("answer %d after %d requests; want the 429 after 1", resp.StatusCode, sent.Load())
	}
	if ctx.Err() != nil {
		t.Errorf("read waited until its deadline passed")
	}
}

// TestFenceReadBoundsRetries: a server that keeps throttling is asked at
// most 1 + maxReadRetries times.
func TestFenceReadBoundsRetries(t *testing.T) {
	srv, sent := throttlingServer(t, 1000, http.StatusTooManyRequests, "0")
	resp, err := getVia(t, context.Background(), srv)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusTooManyRequests || sent.Load() != 1+maxReadRetries {
		t.Errorf("answer %d after %d requests; want the 429 after %d", resp.StatusCode, sent.Load(), 1+maxReadRetries)
	}
}

func TestRetryAfter(t *testing.T) {
	for _, c := range []struct {
		code      int
		header    string
		want      time.Duration
		wantRetry bool
	}{
		{429, "", time.Second, true},
		{429, "3", 3 * time.Second, true},
		{429, "3600", maxRetryWait, true},
		{429, "soon", time.Second, true},
		{500, "", 0, false},
		{504, "2", 2 * time.Second, true},
		{404, "2", 0, false},
	} {
		resp := &http.Response{StatusCode: c.code, Header: http.Header{}}
		if c.header != "" {
			resp.Header.Set("Retry-After", c.header)
		}
		got, retry := retryAfter(resp)
		if got != c.want || retry != c.wantRetry {
			t.Errorf("retryAfter(%d, Retry-After %q) = %s, %v; want %s, %v", c.code, c.header, got, retry, c.want, c.wantRetry)
		}
	}
}
