// Writes bounded by the lock's renew deadline: sent with the API server's
// own timeout set to it (send), cut off when it passes (cutOff), and the
// request's deadline released once its answer is read.

package helmx

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// cutOff is the error of helm's write that the lock's renew deadline ended.
func (f *fenceRT) cutOff(req *http.Request, g *GuardedWrites, cause error) error {
	err := fmt.Errorf("helm-autorecover: %s %s %s for release %q in namespace %q did not complete before the lock's renew deadline and was cut off (%w), so it cannot land after another client may have taken the release over; the operation stops, and the next one recovers the release: %w",
		f.whose(), req.Method, req.URL.Path, g.Release, g.Namespace, cause, lock.ErrLost)
	f.w.cut.CompareAndSwap(nil, &err)
	return err
}

// cancelOnClose releases a request's deadline once its response is read.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// send sends a write with the API server's own request timeout set to what
// is left of its context's deadline (the lock's renew deadline, or the
// caller's when earlier): the server then stops working on it by the same
// time, even when this process is stopped and cannot cancel it.
func (f *fenceRT) send(req *http.Request) (*http.Response, error) {
	if dl, ok := req.Context().Deadline(); ok && isWrite(req.Method) {
		left := time.Until(dl).Truncate(time.Millisecond)
		if left <= 0 {
			closeBody(req)
			return nil, context.DeadlineExceeded
		}
		q := req.URL.Query()
		if cur, err := time.ParseDuration(q.Get("timeout")); err != nil || cur <= 0 || cur > left {
			q.Set("timeout", left.String())
			req = req.WithContext(req.Context())
			u := *req.URL
			u.RawQuery = q.Encode()
			req.URL = &u
		}
	}
	resp, err := f.next.RoundTrip(req)
	if dl, ok := req.Context().Deadline(); ok && isWrite(req.Method) && (err != nil || resp.StatusCode >= http.StatusInternalServerError) {
		// No answer, or a 5xx (the API server's timeout filter answers 504
		// while the handler goes on): it may still commit until its
		// deadline, the timeout it was sent with (see Drain).
		f.w.unansweredUntil(dl)
	}
	return resp, err
}
