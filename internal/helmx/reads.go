// The fence's own reads: the guarded release's records (metadata only) and
// one record, retrying throttling as client-go does within the write's
// deadline.

package helmx

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
)

// answerError is an API server's answer other than 2xx to a read of the
// fence's own.
type answerError struct {
	code int
	text string
}

func (e *answerError) Error() string { return e.text }

// transientListFailure tells a failed read of the fence's own that reading
// again may cure: a failed connection, or an answer 429 or 5xx.
func transientListFailure(req *http.Request, err error) bool {
	if req.Context().Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, lock.ErrLost) {
		return false
	}
	if a, ok := errors.AsType[*answerError](err); ok {
		return transientFailure(req, &http.Response{StatusCode: a.code}, nil)
	}
	return true
}

// listRecords reads the metadata of every record of the guarded release,
// from the collection req addresses (or contains).
func (f *fenceRT) listRecords(req *http.Request, g *GuardedWrites) ([]metav1.ObjectMeta, error) {
	r := req.Clone(req.Context())
	r.Method = http.MethodGet
	r.Body, r.GetBody, r.ContentLength = nil, nil, 0
	r.Header.Del("Content-Type")
	r.Header.Set("Accept", records.MetadataAccept)
	u := *req.URL
	if m := recordPath.FindStringSubmatch(u.Path); m != nil && m[3] != "" {
		u.Path = strings.TrimSuffix(u.Path, "/"+m[3])
	}
	u.RawPath = ""
	u.RawQuery = url.Values{"labelSelector": {HistorySelector(g.Release)}}.Encode()
	r.URL = &u
	resp, err := f.read(r)
	if err != nil {
		return nil, fmt.Errorf("helm-autorecover: listing the records of release %q in namespace %q: %w", g.Release, g.Namespace, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("helm-autorecover: listing the records of release %q in namespace %q: %w", g.Release, g.Namespace, err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("helm-autorecover: listing the records of release %q in namespace %q: %w", g.Release, g.Namespace, &answerError{code: resp.StatusCode, text: resp.Status + ": " + string(bytes.TrimSpace(b))})
	}
	var l records.MetadataList
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("helm-autorecover: listing the records of release %q in namespace %q: %w", g.Release, g.Namespace, err)
	}
	out := make([]metav1.ObjectMeta, 0, len(l.Items))
	for _, it := range l.Items {
		out = append(out, it.Metadata)
	}
	// The lock's store orders them the same way (records.Compare), so both
	// take the same record for the newest.
	slices.SortFunc(out, func(a, b metav1.ObjectMeta) int { return records.Compare(a.Name, a.Labels, b.Name, b.Labels) })
	return out, nil
}

// metaNamed returns the metadata of record name in metas, nil when absent.
func metaNamed(metas []metav1.ObjectMeta, name string) *metav1.ObjectMeta {
	for i := range metas {
		if metas[i].Name == name {
			return &metas[i]
		}
	}
	return nil
}

// get reads the object req addresses. A non-2xx answer is returned as resp
// for helm to see.
func (f *fenceRT) get(req *http.Request) (decoded, *http.Response, error) {
	r := req.Clone(req.Context())
	r.Method = http.MethodGet
	r.Body = nil
	r.GetBody = nil
	r.ContentLength = 0
	r.Header.Del("Content-Type")
	r.Header.Set("Accept", "application/json")
	resp, err := f.read(r)
	if err != nil {
		return decoded{}, nil, err
	}
	if resp.StatusCode/100 != 2 {
		return decoded{}, resp, nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return decoded{}, nil, fmt.Errorf("helm-autorecover: reading %s: %w", req.URL.Path, err)
	}
	d, err := decode(b)
	if err != nil {
		return decoded{}, nil, fmt.Errorf("helm-autorecover: decoding %s: %w", req.URL.Path, err)
	}
	return d, nil, nil
}

// maxReadRetries bounds how often the fence's own reads are sent again
// after a throttling answer, as client-go's default (rest.Config has 10).
const maxReadRetries = 10

// maxRetryWait bounds one wait between the fence's reads, whatever
// Retry-After asks.
const maxRetryWait = 10 * time.Second

// read sends the fence's own read req (no body), retrying throttling as
// client-go does: a 429, or a 5xx with Retry-After, is sent again after the
// time Retry-After asks (a second when a 429 names none), up to
// maxReadRetries times. When that wait would pass req's deadline (the lock's
// renew deadline), or its context ends, the last answer is returned as it
// is: helm's write then fails instead of waiting past the lock.
func (f *fenceRT) read(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	for attempt := 0; ; attempt++ {
		resp, err := f.next.RoundTrip(req.Clone(ctx))
		if err != nil {
			return nil, err
		}
		wait, retry := retryAfter(resp)
		if !retry || attempt >= maxReadRetries {
			return resp, nil
		}
		if dl, ok := ctx.Deadline(); ok && !time.Now().Add(wait).Before(dl) {
			return resp, nil
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("throttled by the API server (%s) and stopped waiting to retry: %w", resp.Status, ctx.Err())
		case <-t.C:
		}
	}
}

// retryAfter says whether and after how long client-go would send a request
// again that got resp: a 429 always (client-go needs Retry-After; the fence
// waits a second without it), a 5xx when it carries Retry-After.
func retryAfter(resp *http.Response) (time.Duration, bool) {
	code := resp.StatusCode
	if code != http.StatusTooManyRequests && code < 500 {
		return 0, false
	}
	secs, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After")))
	switch {
	case err == nil && secs >= 0:
		return min(time.Duration(secs)*time.Second, maxRetryWait), true
	case code == http.StatusTooManyRequests:
		return time.Second, true
	}
	return 0, false
}
