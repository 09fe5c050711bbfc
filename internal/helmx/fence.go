// The write fence helm's requests go through while a guarded operation
// runs: what it needs of the lock (HelmLock, and what a lock may also
// implement to be told more), the operation it guards (GuardedWrites), the
// WriteFence itself, and arming it (Guard). The transport that judges each
// request is in roundtrip.go; how the fence is put on clients, in
// getter.go and ownwrites.go.

package helmx

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

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

	// phase is what helm is doing, for a holder asked to stop (Busy,
	// CloseUnlessBusy).
	phase phase
}

// DefaultWriteFence is the fence on helm's command tree (InstallOnHelm):
// the CLI runs one guarded operation at a time. A process that holds
// several locks at once (the controller) gives each lock a WriteFence of
// its own and carries it to the writes made under it: in their context for
// its own clients (WithFence, OwnWrites), in the clients it builds for
// helm's actions (Wrap, Getter).
var DefaultWriteFence = &WriteFence{}

// Guard makes w fence the writes of g until the returned function is called.
func (w *WriteFence) Guard(g GuardedWrites) (stop func()) {
	w.createConflict.Store(false)
	w.cut.Store(nil)
	w.mu.Lock()
	w.created = map[int]bool{}
	w.draining = make(chan struct{})
	w.closed, w.unanswered = false, time.Time{}
	w.phase = phase{}
	w.mu.Unlock()
	w.cur.Store(&g)
	return func() { w.cur.CompareAndSwap(&g, nil) }
}

// CreateConflict reports whether helm's create of a revision record was
// refused with AlreadyExists since Guard was called.
func (w *WriteFence) CreateConflict() bool { return w.createConflict.Load() }
