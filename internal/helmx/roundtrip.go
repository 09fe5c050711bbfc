// The fence's RoundTripper: it judges each request (the lock valid, no
// earlier write cut off, the renew deadline on the request) and routes
// helm's writes of the guarded release's records to create, update or
// delete.

package helmx

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/chaos"
)

// fenceRT is the fence's transport. w is the fence it serves; nil (own)
// takes it from each request's context (WithFence).
type fenceRT struct {
	next http.RoundTripper
	w    *WriteFence
	// ownWrites marks this tool's own writes (OwnWrites): judged, and
	// sent as they are.
	ownWrites bool
}

// recordPath matches a namespaced core collection or object path. It is not
// anchored at the start: an API server behind a proxy (Rancher, a connect
// gateway) is addressed with a path prefix such as /k8s/clusters/ID.
var recordPath = regexp.MustCompile(`/api/v1/namespaces/([^/]+)/(secrets|configmaps)(?:/([^/]+))?$`)

func isWrite(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

func (f *fenceRT) RoundTrip(req *http.Request) (*http.Response, error) {
	if chaos.Enabled {
		point := chaos.Classify(req)
		resp, err := f.roundTrip(req)
		chaos.Answered(point, resp, err)
		return resp, err
	}
	return f.roundTrip(req)
}

func (f *fenceRT) roundTrip(req *http.Request) (*http.Response, error) {
	w := f.w
	if w == nil {
		w = FenceOf(req.Context())
	}
	var g *GuardedWrites
	if w != nil {
		g = w.cur.Load()
	}
	if g == nil {
		if w != nil && isWrite(req.Method) && w.isClosed() {
			// The lock was given back: an operation that has not ended
			// (helm 4's upgrade goes on in the background after its
			// context is cancelled) writes nothing more until Guard
			// opens the fence for the next one.
			closeBody(req)
			return nil, fmt.Errorf("helm-autorecover: refused %s %s %s: %w", f.whose(), req.Method, req.URL.Path, errClosed)
		}
		return f.next.RoundTrip(req)
	}
	f = f.judgedBy(w, g)
	if !isWrite(req.Method) {
		return f.next.RoundTrip(req)
	}
	ph := phaseOf{unchanged: true}
	if !f.ownWrites {
		var err error
		if req, ph, err = f.phaseOfWrite(req, g); err != nil {
			return nil, err
		}
	}
	ended, err := f.w.writeStarted(ph)
	if err != nil {
		closeBody(req)
		return nil, fmt.Errorf("helm-autorecover: refused helm's %s %s for release %q in namespace %q: %w", req.Method, req.URL.Path, g.Release, g.Namespace, err)
	}
	defer ended()
	if err := g.Lock.Valid(); err != nil {
		closeBody(req)
		return nil, fmt.Errorf("helm-autorecover: refused %s %s %s for release %q in namespace %q: %w", f.whose(), req.Method, req.URL.Path, g.Release, g.Namespace, err)
	}
	if cut := f.w.cut.Load(); cut != nil {
		closeBody(req)
		return nil, fmt.Errorf("helm-autorecover: refused %s %s %s for release %q in namespace %q: an earlier write of this operation was cut off: %w", f.whose(), req.Method, req.URL.Path, g.Release, g.Namespace, *cut)
	}
	parent := req.Context()
	deadline := g.Lock.Deadline()
	if deadline.IsZero() {
		return f.dispatch(req, g)
	}
	if !time.Now().Before(deadline) {
		closeBody(req)
		return nil, f.cutOff(req, g, context.DeadlineExceeded)
	}
	ctx, cancel := context.WithDeadline(parent, deadline)
	resp, err := f.dispatch(req.WithContext(ctx), g)
	if parent.Err() == nil && !time.Now().Before(deadline) && (err != nil || resp.StatusCode >= http.StatusBadRequest) {
		// Our deadline, not the caller's, ended the request: it did not
		// complete in time, and may not land later (the server's own
		// timeout was set to the same deadline). Any failure past the
		// deadline counts, not only a timeout: update's retries may end
		// with an earlier 5xx after the deadline ran out in their re-read,
		// and helm must not go on from it (see cut).
		if resp != nil {
			_ = resp.Body.Close()
		}
		cancel()
		if err == nil {
			err = errors.New(resp.Status)
		}
		return nil, f.cutOff(req, g, err)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// judgedBy is f for one request judged by w, which guards g: its answers
// feed the lock's clock when the lock wants them (ServerClockFeed).
func (f *fenceRT) judgedBy(w *WriteFence, g *GuardedWrites) *fenceRT {
	next := f.next
	if feed, ok := g.Lock.(ServerClockFeed); ok {
		next = feed.FeedServerClock(next)
	}
	return &fenceRT{next: next, w: w, ownWrites: f.ownWrites}
}

// whose names the writer of the requests f fences, for errors.
func (f *fenceRT) whose() string {
	if f.ownWrites {
		return "the recovery's"
	}
	return "helm's"
}

// dispatch sends a write the lock allowed: this tool's own as it is, helm's
// fenced as its target requires (route).
func (f *fenceRT) dispatch(req *http.Request, g *GuardedWrites) (*http.Response, error) {
	if f.ownWrites {
		return f.send(req)
	}
	return f.route(req, g)
}

// route sends helm's write req, fenced as its target requires.
func (f *fenceRT) route(req *http.Request, g *GuardedWrites) (*http.Response, error) {
	m := recordPath.FindStringSubmatch(req.URL.Path)
	if m == nil || m[1] != g.Namespace || m[2] != g.Resource {
		return f.send(req)
	}
	rev := revisionOf(m[3], g.Release)
	switch {
	case req.Method == http.MethodPost && m[3] == "":
		return f.create(req, g)
	case req.Method == http.MethodPut && rev > 0:
		resp, status, err := f.update(req, g, m[3])
		f.noteWrite(g, resp, err)
		f.report(g, rev, resp, err, status)
		f.supersedeFailed(req, g, rev, status, resp, err)
		return resp, err
	case req.Method == http.MethodDelete && rev > 0:
		resp, err := f.deleteRecord(req, g, m[3])
		f.noteDelete(g, resp, err)
		f.report(g, rev, resp, err, "")
		return resp, err
	}
	return f.send(req)
}

// revisionOf returns N when name is the record of revision N of release.
func revisionOf(name, release string) int {
	rest, ok := strings.CutPrefix(name, "sh.helm.release.v1."+release+".v")
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

func recordPrefix(release string) string { return "sh.helm.release.v1." + release + ".v" }

// supersedeFailed stops the operation after helm's write marking an
// earlier revision superseded failed (after the fence's own retries):
// helm only logs that failure and goes on to write its own revision
// deployed, and two revisions would then read deployed (the simulation,
// seeds 35818 and 36433). Every later write of the operation is refused,
// as after a write cut off at the renew deadline (cut); the holder's own
// revision, left pending, is marked failed when the lock is given back.
func (f *fenceRT) supersedeFailed(req *http.Request, g *GuardedWrites, rev int, status string, resp *http.Response, err error) {
	if status != "superseded" || f.own(g, rev) || (err == nil && resp.StatusCode/100 == 2) || req.Context().Err() != nil {
		// (A write its deadline or helm ended is cut off by roundTrip.)
		return
	}
	cause := fmt.Errorf("helm-autorecover: helm's write marking revision %d of release %q in namespace %q superseded failed (%s): nothing more of the operation is written, so that its own revision is not written deployed beside revision %d; it is marked failed when the lock is given back, and the next operation can run",
		rev, g.Release, g.Namespace, failureOf(resp, err), rev)
	f.w.cut.CompareAndSwap(nil, &cause)
}
