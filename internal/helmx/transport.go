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
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	_ "unsafe" // go:linkname reaches helm's command settings; see helmSettings.

	helmcli "helm.sh/helm/v4/pkg/cli"
	helmcmd "helm.sh/helm/v4/pkg/cmd"
	"helm.sh/helm/v4/pkg/release/common"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/helm-autorecover/helm-autorecover/internal/chaos"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
)

// helmSettings is the settings object of helm's command tree. Helm keeps it
// in an unexported package variable and builds every Kubernetes client of its
// commands from it; reaching it is the only way to see helm's own requests
// without forking helm. If helm renames it, the link fails at build time, not
// at run time.
//
//go:linkname helmSettings helm.sh/helm/v4/pkg/cmd.settings
var helmSettings *helmcli.EnvSettings

var _ = helmcmd.NewRootCmd // the variable above lives in this package

// HelmLock is the lock a guarded operation holds, as the transport needs it.
// *protocol.Lock implements it.
type HelmLock interface {
	Valid() error
	Session() string
	Record() lock.Record
	// Carry runs write, which copies the lock's record onto another
	// release record, with that record while no renewal of the lock is in
	// flight, and fails without calling it when the lock is not valid.
	Carry(write func(lock.Record) error) error
	// Deadline is the lock's renew deadline on this process's clock (as
	// time.Now reads it): unless a renewal succeeds first, the lock counts
	// as lost from then on. Zero means none.
	Deadline() time.Time
}

// ServerClockFeed is implemented by a HelmLock whose validity also depends
// on the API server's clock (lock.Held.Valid stops a holder once that
// clock has passed its LOCKED TILL, whatever its own clocks say). While the
// fence guards it, every answer that passes the fence (helm's reads and
// writes, the fence's own reads) goes through the RoundTripper
// FeedServerClock returns, which records its Date header: a holder whose
// clocks stood still (a virtual machine stopped and resumed) learns the
// server's time from the first answer it reads after it resumed, and helm
// reads before it writes (the object it is about to patch, the records the
// fence lists), so the write that follows is refused.
type ServerClockFeed interface {
	FeedServerClock(next http.RoundTripper) http.RoundTripper
}

// RecordWriteNoter is implemented by a HelmLock that wants the metadata
// of each record write of the guarded release the fence made and the
// server accepted, as the server returned it: a read of the records not
// older than its resourceVersion (records.WithNotOlderThan) sees that
// write without waiting for the API server's cache to confirm it is
// current, and the lock's release can be written where that write left the
// lock. RecordWriteUnsure is called for every record write the fence was
// asked to make that did not end in an accepted answer (refused, failed,
// or its answer lost: it may have committed): from then on the lock does
// not know where its last copy is.
type RecordWriteNoter interface {
	RecordWritten(meta metav1.ObjectMeta)
	RecordWriteUnsure()
}

// noteWrite tells the lock the resourceVersion an accepted record write
// returned (RecordWriteNoter). The answer's body is read and put back for
// helm.
func (f *fenceRT) noteWrite(g *GuardedWrites, resp *http.Response, err error) {
	n, ok := g.Lock.(RecordWriteNoter)
	if !ok {
		return
	}
	if !accepted(resp, err) || resp.Body == nil {
		n.RecordWriteUnsure()
		return
	}
	body, rerr := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if rerr != nil {
		// helm reads what arrived, then the same error.
		resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{rerr}))
		return
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if d, derr := decode(body); derr == nil && d.meta.ResourceVersion != "" {
		n.RecordWritten(*d.meta)
		return
	}
	n.RecordWriteUnsure()
}

// noteDelete tells the lock (RecordWriteNoter) of a record delete the fence
// was asked to make that did not end in an accepted answer.
func (f *fenceRT) noteDelete(g *GuardedWrites, resp *http.Response, err error) {
	if n, ok := g.Lock.(RecordWriteNoter); ok && !accepted(resp, err) {
		n.RecordWriteUnsure()
	}
}

// accepted reports whether a write's answer says the API server accepted it.
func accepted(resp *http.Response, err error) bool {
	return err == nil && resp != nil && resp.StatusCode/100 == 2
}

// errReader fails every read with err.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// OwnRecordReporter is implemented by a HelmLock that wants to know how
// helm's writes of the holder's own revision records ended: the revision
// the lock record names, and every revision the fence created under it.
// helm's actions often only log a failed write of a release's final status
// and report success, so the operation's error cannot tell that a revision
// was left pending; the fence sees every such write and its answer.
type OwnRecordReporter interface {
	// OwnRecordWrite reports one write of revision rev's record: settled is
	// true when the server accepted it and it left the record not pending
	// (deployed, failed, superseded, uninstalled...) or deleted it; false
	// when it failed (the record stays as it was, or its fate is unknown)
	// or wrote a pending status. The last report of a revision holds.
	OwnRecordWrite(rev int, settled bool)
}

// RevisionNoter is implemented by a HelmLock whose record names the newest
// revision its holder wrote: the fence tells it of each create of a
// revision record of the guarded release that may have committed (not
// refused), inside Carry, before any later write of the lock. helm's
// upgrade --rollback-on-failure creates a second revision under one lock.
type RevisionNoter interface {
	Wrote(rev int)
}

// GuardedWrites describes one guarded operation for the transport.
type GuardedWrites struct {
	Namespace string
	Release   string
	// Resource is "secrets" or "configmaps": where helm keeps the records.
	Resource string
	Lock     HelmLock
}

// WriteFence sits between helm's clients and the API server while a
// guarded operation runs:
//
//   - Every write (POST, PUT, PATCH, DELETE) first asks the lock; when it is
//     no longer valid the request is not sent and fails with an error
//     wrapping lock.ErrLost. helm cannot write after its lock was lost.
//   - Every write goes out with a deadline no later than the lock's renew
//     deadline, on its context and as the API server's own request timeout
//     (the timeout parameter), so a write held up in the server (API
//     priority and fairness queues, a slow admission webhook) or on the way
//     cannot land after another client may have taken over. A write cut
//     off by it fails with an error wrapping lock.ErrLost.
//   - helm's create of the release's next revision record carries the lock
//     record (annotation lock.AnnotationRecord): the pending revision and its
//     lock are one atomic write.
//   - helm's update of a release record (a blind overwrite in helm's driver,
//     which also drops annotations) becomes conditional: the record is read,
//     refused if another session's live lock is on it, and written with the
//     resourceVersion read and the lock annotations kept (ours refreshed).
//   - How each write of the holder's own revision records ended is told to
//     the lock when it implements OwnRecordReporter.
//   - The fence's own reads retry throttling (429, and 5xx with
//     Retry-After) as client-go does, within the write's deadline.
type WriteFence struct {
	cur atomic.Pointer[GuardedWrites]
	// createConflict is set when helm's create of a revision record failed
	// because another client had created it: the lock was never ours.
	createConflict atomic.Bool
	// cut is the error of the first write the renew deadline cut off since
	// Guard was called: every later write fails with it. helm goes on after
	// some failed writes (the one marking the previous revision
	// superseded), and a renewal may land after the cut: without this, helm
	// would write its revision deployed next to the one it failed to
	// supersede (found by internal/sim, seed 435).
	cut atomic.Pointer[error]

	// created lists the revisions whose records the fence created (or
	// tried to) since Guard was called: the holder's own.
	mu      sync.Mutex
	created map[int]bool

	// updates counts helm's record updates in the fence (update), whose
	// failures it sends again; draining is closed by Drain, after which
	// none is sent again.
	updates  int
	ended    *sync.Cond // on mu, broadcast when a write in the fence ends
	draining chan struct{}
	// inflight counts helm's writes in the fence (past its refusal of a
	// closed fence, not yet ended); closed is set by Drain, after which
	// every write of helm's is refused. unanswered is the latest deadline
	// of a write that left and ended with no answer (cut off, its
	// connection lost): the API server may still commit it until then.
	inflight   int
	closed     bool
	unanswered time.Time
}

// errClosed refuses helm's writes once the fence is drained.
var errClosed = errors.New("the operation is ending and its lock is being given back: nothing more of it is written")

// Drain closes the fence: from now on it refuses every write of helm's,
// stops sending any record update again after a failure, and it returns
// only once no write of helm's it let through can still land: each has
// ended (by its deadline at the latest, the lock's renew deadline when it
// left), and the deadline of each that ended with no answer from the API
// server (which may still be committing it; the write's timeout parameter
// is that deadline) has passed. Call it before the lock is released and
// before the holder marks its own revision failed: helm does not cancel
// its rollback or uninstall on a signal (nor the rollback an upgrade's
// --rollback-on-failure runs), and helm 4 leaves the write that marks the
// previous revision superseded running when it is interrupted; none of
// their writes may land once the lock is free. On the happy path nothing
// is in flight and it returns at once. Guard opens the fence again.
func (w *WriteFence) Drain() {
	w.mu.Lock()
	w.closed = true
	if w.draining != nil {
		select {
		case <-w.draining:
		default:
			close(w.draining)
		}
	}
	for w.updates > 0 || w.inflight > 0 {
		w.endedCond().Wait()
	}
	until := w.unanswered
	w.mu.Unlock()
	if d := time.Until(until); d > 0 {
		time.Sleep(d)
	}
}

// writeStarted counts one of helm's writes into the fence, unless Drain
// closed it, and returns the function that counts it out.
func (w *WriteFence) writeStarted() (ended func(), err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, errClosed
	}
	w.inflight++
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.inflight--
		w.endedCond().Broadcast()
	}, nil
}

// unansweredUntil notes a write that left and ended with no answer: it may
// land until its deadline (see Drain).
func (w *WriteFence) unansweredUntil(deadline time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if deadline.After(w.unanswered) {
		w.unanswered = deadline
	}
}

// endedCond is w.ended, made on first use; w.mu is held.
func (w *WriteFence) endedCond() *sync.Cond {
	if w.ended == nil {
		w.ended = sync.NewCond(&w.mu)
	}
	return w.ended
}

// updateStarted counts one of helm's record updates into the fence and
// returns the channel Drain closes and the function that counts it out.
func (w *WriteFence) updateStarted() (<-chan struct{}, func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.updates++
	return w.draining, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.updates--
		w.endedCond().Broadcast()
	}
}

// DefaultWriteFence is the fence on helm's command tree (InstallOnHelm):
// the CLI runs one guarded operation at a time. A process that holds
// several locks at once (the controller) gives each lock a WriteFence of
// its own and carries it to the writes made under it: in their context for
// its own clients (WithFence, OwnWrites), in the clients it builds for
// helm's actions (Wrap, Getter).
var DefaultWriteFence = &WriteFence{}

// fenceKey carries, in a context, the fence that judges the writes made
// under it (WithFence).
type fenceKey struct{}

// WithFence returns ctx for requests made under w's lock: on clients built
// from OwnWrites, their writes are judged by w.
func WithFence(ctx context.Context, w *WriteFence) context.Context {
	return context.WithValue(ctx, fenceKey{}, w)
}

// FenceOf returns the fence WithFence put in ctx, nil when none.
func FenceOf(ctx context.Context) *WriteFence {
	w, _ := ctx.Value(fenceKey{}).(*WriteFence)
	return w
}

// OwnWrites returns a copy of cfg for this tool's own clients in a process
// that holds several locks at once (the controller: its recovery's record
// and object writes). A write whose context carries a fence (WithFence)
// that guards a lock is judged by it as helm's writes are by theirs: it is
// refused once the lock is no longer valid or once an earlier write under
// it was cut off, and it is sent with the lock's renew deadline on its
// context and as the API server's own request timeout; every answer read
// under such a context feeds the lock's clock (ServerClockFeed). Unlike
// helm's, these writes are sent as they are: they are conditional on the
// resourceVersion they read and keep the lock annotations they read, which
// the fence's rewrite of helm's record writes would undo. Requests whose
// context carries no fence go out untouched.
func OwnWrites(cfg *rest.Config) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &fenceRT{next: rt, ownWrites: true} })
	return out
}

// Guard makes w fence the writes of g until the returned function is called.
func (w *WriteFence) Guard(g GuardedWrites) (stop func()) {
	w.createConflict.Store(false)
	w.cut.Store(nil)
	w.mu.Lock()
	w.created = map[int]bool{}
	w.draining = make(chan struct{})
	w.closed, w.unanswered = false, time.Time{}
	w.mu.Unlock()
	w.cur.Store(&g)
	return func() { w.cur.CompareAndSwap(&g, nil) }
}

// CreateConflict reports whether helm's create of a revision record was
// refused with AlreadyExists since Guard was called.
func (w *WriteFence) CreateConflict() bool { return w.createConflict.Load() }

var installOnce sync.Once

// InstallOnHelm wraps every Kubernetes client helm's command tree builds
// with DefaultWriteFence. Call it once, after helmx.NewHelmRootCmd.
func InstallOnHelm() error {
	var err error
	installOnce.Do(func() {
		if helmSettings == nil {
			err = errors.New("helm's command settings are not initialised")
			return
		}
		err = WrapGetter(helmSettings.RESTClientGetter(), DefaultWriteFence)
	})
	return err
}

// WrapGetter makes every REST configuration getter hands out go through w.
// getter must be helm's (a *genericclioptions.ConfigFlags).
func WrapGetter(getter genericclioptions.RESTClientGetter, w *WriteFence) error {
	cf, ok := getter.(*genericclioptions.ConfigFlags)
	if !ok {
		return fmt.Errorf("helm's REST client getter is a %T, not *genericclioptions.ConfigFlags; this helm version is not supported", getter)
	}
	inner := cf.WrapConfigFn
	cf.WrapConfigFn = func(c *rest.Config) *rest.Config {
		if inner != nil {
			c = inner(c)
		}
		c.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &fenceRT{next: rt, w: w} })
		return c
	}
	return nil
}

// Wrap returns a copy of cfg whose requests go through w, for clients built
// outside helm's command tree (an embedder's helm actions).
func (w *WriteFence) Wrap(cfg *rest.Config) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &fenceRT{next: rt, w: w} })
	return out
}

// Getter returns a REST client getter for helm's actions run under w's
// lock beside others (the controller's rollbacks, each under its release's
// lock): every client helm builds from it goes through w (Wrap), while
// discovery and the REST mapper, which only read, are base's and shared.
func (w *WriteFence) Getter(base genericclioptions.RESTClientGetter) genericclioptions.RESTClientGetter {
	return fencedGetter{RESTClientGetter: base, w: w}
}

type fencedGetter struct {
	genericclioptions.RESTClientGetter
	w *WriteFence
}

func (g fencedGetter) ToRESTConfig() (*rest.Config, error) {
	cfg, err := g.RESTClientGetter.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	return g.w.Wrap(cfg), nil
}

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

// maxPutRetries bounds how often an update of a record is read and sent
// again because the lock's own renewal changed the record in between.
const maxPutRetries = 8

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
		return f.next.RoundTrip(req)
	}
	f = f.judgedBy(w, g)
	if !isWrite(req.Method) {
		return f.next.RoundTrip(req)
	}
	ended, err := f.w.writeStarted()
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
		return resp, err
	case req.Method == http.MethodDelete && rev > 0:
		resp, err := f.deleteRecord(req, g, m[3])
		f.noteDelete(g, resp, err)
		f.report(g, rev, resp, err, "")
		return resp, err
	}
	return f.send(req)
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

// report tells the lock how a write of revision rev's record ended, when
// the revision is the holder's own and the lock wants to know (see
// OwnRecordReporter). status is the status label the write carried ("" for
// a delete).
func (f *fenceRT) report(g *GuardedWrites, rev int, resp *http.Response, err error, status string) {
	r, ok := g.Lock.(OwnRecordReporter)
	if !ok || !f.own(g, rev) {
		return
	}
	settled := false
	switch {
	case err != nil || resp == nil:
	case status == "": // a delete
		settled = resp.StatusCode/100 == 2 || resp.StatusCode == http.StatusNotFound
	default:
		settled = resp.StatusCode/100 == 2 && !isPendingStatus(status)
	}
	r.OwnRecordWrite(rev, settled)
}

// own reports whether revision rev is the holder's: the one its lock record
// names, or one the fence created under it.
func (f *fenceRT) own(g *GuardedWrites, rev int) bool {
	if rev > 0 && g.Lock.Record().Revision == rev {
		return true
	}
	f.w.mu.Lock()
	defer f.w.mu.Unlock()
	return f.w.created[rev]
}

// isPendingStatus reports whether a record's status label says an operation
// is in progress (as recovery.IsPending, which this package cannot import).
func isPendingStatus(s string) bool {
	switch common.Status(s) {
	case common.StatusPendingInstall, common.StatusPendingUpgrade, common.StatusPendingRollback, common.StatusUninstalling,
		common.StatusUnknown: // as good as pending
		return true
	case common.StatusDeployed, common.StatusUninstalled, common.StatusSuperseded, common.StatusFailed:
		return false
	}
	return true // no status label, or one this helm does not know
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

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// decoded is a request or response body as an object.
type decoded struct {
	obj  runtime.Object
	meta *metav1.ObjectMeta
}

func decode(body []byte) (decoded, error) {
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
	if err != nil {
		return decoded{}, err
	}
	switch o := obj.(type) {
	case *corev1.Secret:
		return decoded{obj: o, meta: &o.ObjectMeta}, nil
	case *corev1.ConfigMap:
		return decoded{obj: o, meta: &o.ObjectMeta}, nil
	}
	return decoded{}, fmt.Errorf("unexpected %T", obj)
}

// encodeJSON turns obj into the JSON body of a request to the API server.
func encodeJSON(d decoded) ([]byte, error) {
	var gvk string
	switch d.obj.(type) {
	case *corev1.Secret:
		gvk = "Secret"
	default:
		gvk = "ConfigMap"
	}
	var buf bytes.Buffer
	d.obj.GetObjectKind().SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind(gvk))
	if err := json.NewEncoder(&buf).Encode(d.obj); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil {
		return nil, nil
	}
	defer req.Body.Close()
	return io.ReadAll(req.Body)
}

func withBody(req *http.Request, body []byte) *http.Request {
	r := req.Clone(req.Context())
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.Header.Set("Content-Type", "application/json")
	return r
}

// recordFor is rec, the lock's record, for revision rev's record.
func recordFor(rec lock.Record, rev int) (string, error) {
	rec.Revision = rev
	return rec.Encode()
}

// create adds the lock record to helm's create of a revision record of the
// guarded release.
func (f *fenceRT) create(req *http.Request, g *GuardedWrites) (*http.Response, error) {
	body, err := readBody(req)
	if err != nil {
		return nil, fmt.Errorf("helm-autorecover: reading helm's request body: %w", err)
	}
	d, err := decode(body)
	rev := 0
	if err == nil {
		rev = revisionOf(d.meta.Name, g.Release)
	} else if bytes.Contains(body, []byte(recordPrefix(g.Release))) {
		// Most likely helm's record, in a form this tool cannot read: it
		// would go out without the lock, so it does not go out at all.
		return nil, fmt.Errorf("helm-autorecover: refused helm's create of a record of release %q in namespace %q: cannot read its body to add the lock: %w", g.Release, g.Namespace, err)
	}
	if rev == 0 {
		return f.send(withRawBody(req, body))
	}
	metas, err := f.listRecords(req, g)
	if err != nil {
		return nil, err
	}
	for _, m := range metas {
		if m.Name == d.meta.Name {
			// Another client wrote this revision first (a first install, or
			// an upgrade racing ours on a virtual lock): it holds the
			// release, as an AlreadyExists answer would have said.
			f.w.createConflict.Store(true)
			return nil, fmt.Errorf("helm-autorecover: refused helm's create of %s of release %q in namespace %q: another client wrote it first: %w", m.Name, g.Release, g.Namespace, lock.ErrLocked)
		}
	}
	if err := newestAllows(metas, g); err != nil {
		f.w.createConflict.Store(true) // another session holds the release
		return nil, err
	}
	// The lock's record goes into the new revision while no renewal is in
	// flight (HelmLock.Carry): the copy must not be older than the renewal
	// the holder's deadline counts from.
	var resp *http.Response
	sent := false
	err = g.Lock.Carry(func(rec lock.Record) error {
		s, err := recordFor(rec, rev)
		if err != nil {
			return err
		}
		if d.meta.Annotations == nil {
			d.meta.Annotations = map[string]string{}
		}
		d.meta.Annotations[lock.AnnotationRecord] = s
		out, err := encodeJSON(d)
		if err != nil {
			return fmt.Errorf("helm-autorecover: encoding revision %d of release %q: %w", rev, g.Release, err)
		}
		f.w.mu.Lock()
		f.w.created[rev] = true
		f.w.mu.Unlock()
		sent = true
		resp, err = f.send(withBody(req, out))
		// Told while no release of the lock can run (Carry): a release
		// must not find the lock's last copy where it was before this
		// create.
		f.noteWrite(g, resp, err)
		if n, ok := g.Lock.(RevisionNoter); ok && (err != nil || resp.StatusCode < 400 || resp.StatusCode >= 500) {
			// It may have committed: whoever finds the lock expired
			// must find it naming this revision (Carry holds the record
			// lock's renewals off until it does).
			n.Wrote(rev)
		}
		return err
	})
	if !sent {
		// Refused before it was sent (the lock is no longer valid):
		// nothing of the revision was written.
		return nil, fmt.Errorf("helm-autorecover: refused helm's create of revision %d of release %q in namespace %q: %w", rev, g.Release, g.Namespace, err)
	}
	if err == nil && resp.StatusCode == http.StatusConflict {
		// Another client created it: not ours after all.
		f.w.createConflict.Store(true)
		f.w.mu.Lock()
		delete(f.w.created, rev)
		f.w.mu.Unlock()
		return resp, err
	}
	f.report(g, rev, resp, err, d.meta.Labels[LabelStatus])
	return resp, err
}

func withRawBody(req *http.Request, body []byte) *http.Request {
	r := req.Clone(req.Context())
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return r
}

// update makes helm's overwrite of a release record conditional and keeps
// the lock on it. status is the status label helm's write carries.
func (f *fenceRT) update(req *http.Request, g *GuardedWrites, name string) (_ *http.Response, status string, _ error) {
	body, err := readBody(req)
	if err != nil {
		return nil, "", fmt.Errorf("helm-autorecover: reading helm's request body: %w", err)
	}
	d, err := decode(body)
	if err != nil {
		return nil, "", fmt.Errorf("helm-autorecover: refused helm's update of %s of release %q in namespace %q: cannot read its body to keep the lock: %w", name, g.Release, g.Namespace, err)
	}
	status = d.meta.Labels[LabelStatus]
	rev := revisionOf(name, g.Release)
	drained, ended := f.w.updateStarted()
	defer ended()
	var failed *http.Response // the last transient failure's answer
	for attempt := 0; ; attempt++ {
		metas, err := f.listRecords(req, g)
		if err != nil {
			if attempt < maxPutRetries && transientListFailure(req, err) {
				// The fence's own read failed for a moment: helm's
				// update is not sent, and may be ignored if it fails
				// (see below), so read again.
				if werr := sleepCtx(req.Context(), drained, writeBackoff(attempt)); werr == nil {
					continue
				}
			}
			if failed != nil {
				// Helm sees the write's own failure, not the retry's.
				return failed, status, nil
			}
			return nil, status, err
		}
		if err := newestAllows(metas, g); err != nil {
			return nil, status, err
		}
		// The record's metadata (its resourceVersion, the lock on it) comes
		// with the list, which is as current as a read of the record: only
		// a record the list does not name (deleted meanwhile) is read, so
		// that helm sees why.
		cur := metaNamed(metas, name)
		if cur == nil {
			d, resp, err := f.get(req)
			if err != nil || resp != nil {
				return resp, status, err // the read failed: helm sees why
			}
			cur = d.meta
		}
		isNewest := len(metas) > 0 && metas[len(metas)-1].Name == name
		own, curRec, err := checkLock(cur, g, isNewest)
		if err != nil {
			return nil, status, err
		}
		if err := g.Lock.Valid(); err != nil {
			return nil, status, fmt.Errorf("helm-autorecover: refused helm's update of revision %d of release %q in namespace %q: %w", rev, g.Release, g.Namespace, err)
		}
		d.meta.ResourceVersion = cur.ResourceVersion
		d.meta.Annotations = map[string]string{}
		for _, k := range []string{lock.AnnotationRecord, lock.AnnotationQueue} {
			if v, ok := cur.Annotations[k]; ok {
				d.meta.Annotations[k] = v
			}
		}
		if own {
			s, err := g.ownRecord(rev, curRec)
			if err != nil {
				return nil, status, err
			}
			d.meta.Annotations[lock.AnnotationRecord] = s
		}
		out, err := encodeJSON(d)
		if err != nil {
			return nil, status, fmt.Errorf("helm-autorecover: encoding revision %d of release %q: %w", rev, g.Release, err)
		}
		resp, err := f.send(withBody(req, out))
		retry := transientFailure(req, resp, err)
		if !retry && (err != nil || resp.StatusCode != http.StatusConflict) || attempt >= maxPutRetries {
			return resp, status, err
		}
		if resp != nil {
			// Our own renewal (or a waiter queueing) changed the record
			// since it was read, or the server failed for a moment: read
			// it and check the lock again.
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		if retry {
			// helm does not send a failed update again, and ignores the
			// failure of some (marking the previous revision superseded:
			// two revisions would then read deployed). The write may have
			// landed: the next one is conditional on a fresh list, and
			// sent only while the lock is valid (its deadline bounds the
			// request's context).
			failed = nil
			if err == nil {
				// Its headers stay behind: a Retry-After would make
				// client-go send helm's whole write again.
				failed = &http.Response{Status: resp.Status, StatusCode: resp.StatusCode, Header: http.Header{}, Body: http.NoBody, Request: resp.Request}
			}
			if werr := sleepCtx(req.Context(), drained, writeBackoff(attempt)); werr != nil {
				// The lock's renew deadline (or helm's own) ended the
				// retries: an error, which the deadline's check in
				// roundTrip reports as the lock's.
				return nil, status, fmt.Errorf("helm-autorecover: helm's update of %s of release %q in namespace %q failed (%s) and could not be sent again in time: %w", name, g.Release, g.Namespace, failureOf(resp, err), werr)
			}
		}
	}
}

// transientFailure tells a failed write that sending again may cure: the
// connection failed, or the server answered 429 or 5xx. A write whose
// context ended (its caller's, or the lock's renew deadline) is not one.
func transientFailure(req *http.Request, resp *http.Response, err error) bool {
	if req.Context().Err() != nil {
		return false
	}
	if err != nil {
		return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, lock.ErrLost)
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// failureOf says how a write failed: its error, or the server's answer.
func failureOf(resp *http.Response, err error) string {
	if err != nil {
		return err.Error()
	}
	return resp.Status
}

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

// writeBackoff is the pause before sending a write again after its
// attempt'th try failed for a moment: 100 ms, doubling, at most 2 s.
func writeBackoff(attempt int) time.Duration {
	return min(100*time.Millisecond<<min(attempt, 5), 2*time.Second)
}

// errDrained ends the retries of an update once the fence is drained.
var errDrained = errors.New("the operation is ending and its lock is being released")

// sleepCtx waits d, or until ctx ends or drained is closed.
func sleepCtx(ctx context.Context, drained <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-drained:
		return errDrained
	case <-t.C:
		return nil
	}
}

// checkLock reads the lock record on m: own reports whether it is ours,
// and err refuses helm's write when m is the release's newest record (where
// the lock lives) and the lock on it is no longer ours. The lock is taken by
// writing the taker's record onto the newest record, and moves with every
// new revision its holder creates, so while we hold it the newest record
// carries our unreleased record: another session's record there (held or
// since released) means ours was taken over or released after we took it,
// and our own record marked released means a person released it
// (unlock --force). No clock is compared. An older record's lock record is
// stale (the lock moved on) and decides nothing. A newest record with no
// lock record at all was rewritten or written after we took the lock by a
// client that takes none (stock helm's rollback, uninstall or upgrade): our
// lock vanished with it, so the write is refused too, and the lock is never
// carried back onto the release (the holder stops at its next renewal as
// well, lock.Held).
func checkLock(m *metav1.ObjectMeta, g *GuardedWrites, newest bool) (own bool, cur *lock.Record, err error) {
	s, ok := m.Annotations[lock.AnnotationRecord]
	if !ok {
		if !newest {
			return false, nil, nil
		}
		return false, nil, fmt.Errorf("helm-autorecover: refused helm's write of release %q in namespace %q: its newest record %s no longer carries our lock: a client that takes no lock (stock helm) wrote it after we took ours: %w",
			g.Release, g.Namespace, m.Name, lock.ErrLost)
	}
	rec, _ := lock.DecodeRecord(s)
	switch {
	case rec == nil:
		if !newest {
			return false, nil, nil
		}
		return false, nil, fmt.Errorf("helm-autorecover: refused helm's write of %s: the lock record on the release's newest record is unreadable: %w", m.Name, lock.ErrLost)
	case !newest:
		return rec.Session == g.Lock.Session(), rec, nil
	case rec.Session == g.Lock.Session() && !rec.ReleasedAt.IsZero():
		return false, rec, fmt.Errorf("helm-autorecover: refused helm's write of %s of release %q in namespace %q: its lock was released%s: %w",
			m.Name, g.Release, g.Namespace, releasedBy(rec), lock.ErrLost)
	case rec.Session == g.Lock.Session():
		return true, rec, nil
	}
	state := "holds"
	if !rec.ReleasedAt.IsZero() {
		state = "took and released"
	}
	return false, rec, fmt.Errorf("helm-autorecover: refused helm's write of %s of release %q in namespace %q: session %s of %s %s its lock after we took it: %w",
		m.Name, g.Release, g.Namespace, rec.Session, rec.Who, state, lock.ErrLost)
}

func releasedBy(rec *lock.Record) string {
	if rec.ReleasedBy == "" {
		return ""
	}
	return " by " + rec.ReleasedBy
}

// ownRecord is our lock record for revision rev's record, which already
// carries our lock as cur: the newer renewal stamp of the two is kept, so a
// write that read the record between a renewal's commit and its response
// never moves LOCKED TILL back.
func (g *GuardedWrites) ownRecord(rev int, cur *lock.Record) (string, error) {
	rec := g.Lock.Record()
	if cur != nil && cur.Session == rec.Session && cur.RenewedAt.After(rec.RenewedAt) {
		rec.RenewedAt, rec.LockedTill = cur.RenewedAt, cur.LockedTill
	}
	rec.Revision = rev
	rec = lock.GateRecord(rec)
	return rec.Encode()
}

func recordPrefix(release string) string { return "sh.helm.release.v1." + release + ".v" }

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

// newestAllows refuses a write of helm's when the lock on the release's
// newest record (metas are listed oldest first) is no longer ours; see
// checkLock.
func newestAllows(metas []metav1.ObjectMeta, g *GuardedWrites) error {
	if len(metas) == 0 {
		return nil
	}
	_, _, err := checkLock(&metas[len(metas)-1], g, true)
	return err
}

// deleteRecord sends helm's delete of record name of the guarded release,
// refused as any write is when the lock on the newest record is no longer
// ours. When name is the newest record (helm prunes history beyond
// --history-max, and may prune the newest record when it is not the last
// deployed one), the lock is kept: its annotations are first written onto
// the next newest record, conditional on that record's resourceVersion, so
// that nobody finds the release unlocked in between. The move and the
// delete are sent under one HelmLock.Carry: a renewal landing between them
// would extend the lock only on the record being deleted, leaving the copy
// that then counts older than the deadline the holder goes by.
func (f *fenceRT) deleteRecord(req *http.Request, g *GuardedWrites, name string) (*http.Response, error) {
	metas, err := f.listRecords(req, g)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	if err := newestAllows(metas, g); err != nil {
		closeBody(req)
		return nil, err
	}
	n := len(metas)
	if n < 2 || metas[n-1].Name != name {
		return f.send(req) // not the newest, or the last one (uninstall): nothing to move
	}
	next := metas[n-2].Name
	failed := func(what string) error {
		return fmt.Errorf("helm-autorecover: moving the lock of release %q in namespace %q to %s before helm deletes %s: %s", g.Release, g.Namespace, next, name, what)
	}
	getReq := req.Clone(req.Context())
	getReq.URL = withLastSegment(req.URL, next)
	for attempt := 0; attempt < maxPutRetries; attempt++ {
		cur, resp, err := f.get(getReq)
		if err != nil {
			closeBody(req)
			return nil, err
		}
		if resp != nil {
			_ = resp.Body.Close()
			closeBody(req)
			return nil, failed(resp.Status)
		}
		if cur.meta.Annotations == nil {
			cur.meta.Annotations = map[string]string{}
		}
		for _, k := range []string{lock.AnnotationRecord, lock.AnnotationQueue} {
			if v, ok := metas[n-1].Annotations[k]; ok {
				cur.meta.Annotations[k] = v
			} else {
				delete(cur.meta.Annotations, k)
			}
		}
		var del *http.Response
		moved := false
		err = g.Lock.Carry(func(rec lock.Record) error {
			s, err := recordFor(rec, revisionOf(next, g.Release))
			if err != nil {
				return err
			}
			cur.meta.Annotations[lock.AnnotationRecord] = s
			body, err := encodeJSON(cur)
			if err != nil {
				return err
			}
			put := withBody(getReq, body)
			put.Method = http.MethodPut
			resp, err := f.send(put)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusConflict:
				return nil // read next again and retry
			case resp.StatusCode/100 != 2:
				return failed(resp.Status)
			}
			moved = true
			del, err = f.send(req)
			return err
		})
		switch {
		case moved:
			return del, err
		case err != nil:
			closeBody(req)
			return nil, err
		}
	}
	closeBody(req)
	return nil, failed("it kept changing")
}

// withLastSegment returns u with its last path segment replaced by name.
func withLastSegment(u *url.URL, name string) *url.URL {
	out := *u
	out.Path = u.Path[:strings.LastIndex(u.Path, "/")+1] + name
	out.RawPath = ""
	out.RawQuery = ""
	return &out
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

// HelmRESTClientGetter is the getter of helm's command tree, whose clients
// InstallOnHelm fenced; use it for helm actions run on the guard's behalf.
func HelmRESTClientGetter() genericclioptions.RESTClientGetter {
	return helmSettings.RESTClientGetter()
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
