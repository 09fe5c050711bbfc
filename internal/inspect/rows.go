package inspect

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
	"github.com/helm-autorecover/helm-autorecover/internal/sqlstore"
)

// State is a release's lock as the locks command shows it.
type State string

const (
	// StateLive: a holder has the lock and may still be renewing it.
	StateLive State = "live"
	// StateExpired: a holder had the lock and let it expire; the next
	// operation takes it over and recovers what it abandoned.
	StateExpired State = "expired"
	// StateLegacyPending: the latest revision is pending and no held lock
	// covers it; it is recovered only after --recover-legacy-after.
	StateLegacyPending State = "legacy-pending"
	// StateNone: nobody holds the lock and nothing is pending.
	StateNone State = "none"
)

// Release is what was read of a release's stored history.
type Release struct {
	Name      string
	Namespace string
	// Latest is the latest stored revision; nil when the release has none.
	Latest *helmx.Summary
	// Err is set when the latest revision could not be read.
	Err error
}

// Input is everything one row is built from.
type Input struct {
	// Lock is the release's lock; nil when there is no Lease.
	Lock *lock.Status
	// Release is the release's history; Release.Latest nil when it has none.
	Release Release
	// Now is the API server's clock at the moment the lock was judged.
	Now servertime.Bounds
	// Margin is the lock backend's margin: a lock may be taken over at
	// LOCKED TILL + Margin.
	Margin time.Duration
	// LegacyAfter is --recover-legacy-after, to say when a legacy pending
	// revision becomes recoverable (0: never).
	LegacyAfter time.Duration
}

// Row is one release's lock, as locks prints it. Times are API-server time.
// Its JSON keys are snake_case, as helm's own list output and list --locks;
// durations are whole seconds.
type Row struct {
	Namespace string `json:"namespace"`
	Release   string `json:"release"`
	State     State  `json:"lock_state"`
	// Revision and Status are the release's latest stored revision.
	Revision int    `json:"revision,omitempty"`
	Status   string `json:"status,omitempty"`

	// The holder, while the lock is held (live or expired).
	Session      string    `json:"session_id,omitempty"`
	Who          string    `json:"who,omitempty"`
	PID          int       `json:"pid,omitempty"`
	Operation    string    `json:"operation,omitempty"`
	LockRevision int       `json:"lock_revision,omitempty"`
	CIJobURL     string    `json:"ci_job_url,omitempty"`
	ToolVersion  string    `json:"tool_version,omitempty"`
	AcquiredAt   time.Time `json:"acquired_at,omitzero"`
	RenewedAt    time.Time `json:"renewed_at,omitzero"`
	LockedTill   time.Time `json:"locked_till,omitzero"`
	// TimeLeft is, for a live lock, how long until another client may take
	// it over unless the holder renews it (LOCKED TILL + margin - now).
	TimeLeft        string `json:"-"`
	TimeLeftSeconds *int64 `json:"time_left_seconds,omitempty"`
	// ExpiredFor is, for an expired lock, how long ago it could first be
	// taken over.
	ExpiredFor        string      `json:"-"`
	ExpiredForSeconds *int64      `json:"expired_for_seconds,omitempty"`
	Waiters           []WaiterRow `json:"waiters,omitempty"`
	// PreemptRequestedBy is the live waiter that asked the holder to stop
	// (--preempt), nil when none did (PreemptRequestOf).
	PreemptRequestedBy *PreemptRequest `json:"preempt_requested_by,omitempty"`

	// PendingSince and PendingFor describe a pending latest revision, from
	// its last server-side write; RecoverableIn says, for a legacy pending
	// one, how long until automatic recovery may take it
	// (--recover-legacy-after): "never" when it is 0 (RecoverableNever).
	PendingSince         time.Time `json:"pending_since,omitzero"`
	PendingFor           string    `json:"-"`
	PendingForSeconds    *int64    `json:"pending_for_seconds,omitempty"`
	RecoverableIn        string    `json:"-"`
	RecoverableInSeconds *int64    `json:"recoverable_in_seconds,omitempty"`
	RecoverableNever     bool      `json:"recoverable_never,omitempty"`

	// The last holder, once the lock was released.
	LastSession string    `json:"last_session_id,omitempty"`
	ReleasedAt  time.Time `json:"released_at,omitzero"`
	ReleasedBy  string    `json:"released_by,omitempty"`

	// Problem says what is wrong with the Lease or the release's records
	// (unreadable, foreign, edited by hand) and what to do.
	Problem string `json:"problem,omitempty"`
}

// Classify returns the state of a release whose lock is st (nil: no Lease)
// and whose latest revision is latest (nil: none).
func Classify(st *lock.Status, latest *helmx.Summary) State {
	if st != nil && st.Exists && st.HolderIdentity != "" {
		if st.State == lock.Expired {
			return StateExpired
		}
		return StateLive
	}
	if latest != nil && recovery.IsPending(latest.Status) {
		return StateLegacyPending
	}
	return StateNone
}

// BadLockAdvice says where the untrustworthy lock of rel in ns is (st;
// problem is Problem(st)), how to look at it and how to clear it; sep
// follows the problem.
func BadLockAdvice(st *lock.Status, rel, ns, problem, sep string) string {
	if st != nil && st.Store == lock.StoreRelease && st.Object != "" {
		return fmt.Sprintf("%s (its newest release record, lock annotation %s): %s%s Inspect it with: kubectl get -n %s %s -o yaml. If no helm-autorecover process is working on the release, remove the annotation (kubectl annotate -n %s %s %s-) and run: helm-autorecover recover %s -n %s --recover-legacy-after=1s",
			st.Object, lock.AnnotationRecord, problem, sep, ns, st.Object, ns, st.Object, lock.AnnotationRecord, rel, ns)
	}
	// The lock row, or else the Lease (a release-records lock with no
	// record to name is advised on as one).
	kept := &lock.Status{Store: lock.StoreLease}
	if st != nil && st.Store == lock.StoreSQL {
		kept.Store = lock.StoreSQL
	}
	where, look := LockObject(kept, rel), fmt.Sprintf("kubectl get lease -n %s %s -o yaml", ns, lock.LeaseName(rel))
	if kept.Store == lock.StoreSQL {
		where += " (table " + sqlstore.TableLocks + " of helm's sql database)"
		look = fmt.Sprintf("SELECT * FROM %s WHERE namespace = '%s' AND name = '%s'", sqlstore.TableLocks, ns, lock.LeaseName(rel))
	}
	return fmt.Sprintf("%s: %s%s Inspect it with: %s. If no helm-autorecover process is working on the release, delete it (%s) and run: helm-autorecover recover %s -n %s --recover-legacy-after=1s",
		where, problem, sep, look, DeleteLockObject(kept, rel, ns), rel, ns)
}

// recordWhere says where a lock's record is kept, for a message.
func recordWhere(st *lock.Status) string {
	if st.Store == lock.StoreSQL {
		return "its lock row's record"
	}
	return "its lock record (annotation " + lock.AnnotationRecord + ")"
}

// LockObject names the object the lock of rel is kept on, as st's store
// keeps it: its Lease, its lock row of helm's sql database, or its beat
// (with the lock on the release's newest record).
func LockObject(st *lock.Status, rel string) string {
	name := lock.LeaseName(rel)
	switch st.Store {
	case lock.StoreSQL:
		return "lock row " + name
	case lock.StoreRelease:
		return "beat " + name
	case lock.StoreLease:
	}
	return "Lease " + name
}

// DeleteLockObject is the command that deletes the object LockObject names,
// in namespace ns.
func DeleteLockObject(st *lock.Status, rel, ns string) string {
	name := lock.LeaseName(rel)
	switch st.Store {
	case lock.StoreSQL:
		return fmt.Sprintf("DELETE FROM %s WHERE namespace = '%s' AND name = '%s'", sqlstore.TableLocks, ns, name)
	case lock.StoreRelease:
		return fmt.Sprintf("kubectl delete secret,configmap -n %s %s", ns, name)
	case lock.StoreLease:
	}
	return fmt.Sprintf("kubectl delete lease -n %s %s", ns, name)
}

// Problem describes what is wrong with a lock, or returns "" when its
// Lease and record agree. Anything it reports means the Lease was written by
// a newer or foreign tool, or edited by hand.
func Problem(st *lock.Status) string {
	if st == nil || !st.Exists {
		return ""
	}
	rec := st.Record
	switch {
	case st.RecordErr != nil:
		return fmt.Sprintf("%s cannot be read: %v", recordWhere(st), st.RecordErr)
	case rec == nil && st.HolderIdentity != "" && st.Store == lock.StoreSQL:
		return fmt.Sprintf("it is held by session %s but its lock row has no lock record: it was created or edited by hand", st.HolderIdentity)
	case rec == nil && st.HolderIdentity != "":
		return fmt.Sprintf("it is held by session %s but carries no lock record (annotation %s): it was created or edited by hand", st.HolderIdentity, lock.AnnotationRecord)
	case rec == nil:
		return ""
	case st.HolderIdentity != "" && rec.Session != st.HolderIdentity:
		return fmt.Sprintf("its holderIdentity %q does not match the session %q of its lock record: it was edited by hand", st.HolderIdentity, rec.Session)
	case rec.Release != "" && st.Release != "" && rec.Release != st.Release:
		return fmt.Sprintf("its lock record names release %q, not %q: it was copied or edited by hand", rec.Release, st.Release)
	case rec.Namespace != "" && rec.Namespace != st.Namespace:
		return fmt.Sprintf("its lock record names namespace %q, not %q: it was copied or edited by hand", rec.Namespace, st.Namespace)
	}
	return ""
}

// NewRow builds the row of one release.
func NewRow(in Input) Row {
	st := in.Lock
	r := Row{Namespace: in.Release.Namespace, Release: in.Release.Name}
	if st != nil {
		r.Namespace = cmp.Or(r.Namespace, st.Namespace)
		r.Release = cmp.Or(r.Release, st.Release)
	}
	latest := in.Release.Latest
	r.State = Classify(st, latest)
	if latest != nil {
		r.Revision = latest.Revision
		r.Status = string(latest.Status)
	}
	var problems []string
	if p := Problem(st); p != "" {
		problems = append(problems, BadLockAdvice(st, r.Release, r.Namespace, p, "."))
	}
	if in.Release.Err != nil {
		problems = append(problems, fmt.Sprintf("the latest revision cannot be read: %v", in.Release.Err))
	}

	if st != nil && st.Exists {
		rec := st.Record
		if st.RecordErr != nil {
			rec = nil
		}
		switch {
		case st.HolderIdentity != "":
			r.Session = st.HolderIdentity
			r.LockedTill = st.LockedTill
			if rec != nil && rec.Session == st.HolderIdentity {
				r.Who, r.PID, r.Operation = rec.Who, rec.PID, string(rec.Operation)
				r.LockRevision, r.CIJobURL, r.ToolVersion = rec.Revision, rec.CIJobURL, rec.ToolVersion
				r.AcquiredAt, r.RenewedAt = rec.AcquiredAt, rec.RenewedAt
			}
			if !st.LockedTill.IsZero() && !in.Now.IsZero() {
				takeover := st.LockedTill.Add(in.Margin)
				if r.State == StateLive {
					// A lock waiting to be confirmed expired (lock.Confirm)
					// is live for as long as that takes.
					r.TimeLeft, r.TimeLeftSeconds = durations(max(0, takeover.Sub(in.Now.Earliest)))
				} else {
					r.ExpiredFor, r.ExpiredForSeconds = durations(max(0, in.Now.Earliest.Sub(takeover)))
				}
			}
			for _, w := range st.Waiters {
				r.Waiters = append(r.Waiters, WaiterRow(w))
			}
			r.PreemptRequestedBy = PreemptRequestOf(st.Waiters, st.HolderIdentity, lock.Operation(r.Operation))
		case rec != nil:
			r.LastSession, r.ReleasedAt, r.ReleasedBy = rec.Session, rec.ReleasedAt, rec.ReleasedBy
		}
	}

	if latest != nil && recovery.IsPending(latest.Status) {
		// The decision's own arithmetic gives the pending revision's age in
		// server time and, for a legacy one, when it becomes recoverable.
		dec := recovery.Decide(recovery.Input{
			Release:   r.Release,
			Namespace: r.Namespace,
			History:   []helmx.Summary{*latest},
			Lock:      recovery.LockInfo{State: recovery.LockNone},
			Now:       recovery.ServerTime{Earliest: in.Now.Earliest, Latest: in.Now.Latest},
			Policy:    recovery.Policy{Autorecover: true, LegacyAfter: in.LegacyAfter, Hints: recovery.CLIHints},
		})
		r.PendingSince = dec.Target.PendingSince
		if !r.PendingSince.IsZero() && !in.Now.IsZero() {
			r.PendingFor, r.PendingForSeconds = durations(dec.Target.Age)
		}
		if r.State == StateLegacyPending {
			switch {
			case dec.Verdict == recovery.Recover || dec.LookForWork:
				// Old enough; a running hook of its helm, which this
				// listing does not look for, would still hold it back.
				r.RecoverableIn, r.RecoverableInSeconds = durations(0)
			case dec.RetryAfter > 0:
				r.RecoverableIn, r.RecoverableInSeconds = durations(dec.RetryAfter)
			default:
				r.RecoverableIn, r.RecoverableNever = "never", true
			}
		}
	}
	r.Problem = strings.Join(problems, "; ")
	return r
}

// roundDuration prints d in whole seconds (a minute and more without the
// seconds' fraction), the resolution of every server timestamp.
func roundDuration(d time.Duration) string {
	return d.Round(time.Second).String()
}

// SortRows orders rows by namespace, then release.
func SortRows(rows []Row) {
	slices.SortFunc(rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Release, b.Release))
	})
}

// WaiterRow is a queued waiter as locks prints it (lock.Waiter with
// snake_case keys).
type WaiterRow struct {
	Session     string         `json:"session_id"`
	Who         string         `json:"who,omitempty"`
	Operation   lock.Operation `json:"operation,omitempty"`
	EnqueuedAt  time.Time      `json:"enqueued_at"`
	HeartbeatAt time.Time      `json:"heartbeat_at,omitzero"`
	ExpiresAt   time.Time      `json:"expires_at"`
	// Preempt is set when the waiter asked the holder to stop (--preempt);
	// PreemptHolder is the session of the holder it asked.
	Preempt       bool   `json:"preempt,omitempty"`
	PreemptHolder string `json:"preempt_holder,omitempty"`
}

// PreemptRequest is a waiter's request that the holder of the lock stop
// (cooperative preemption, --preempt), named by the fields the lock shows
// of its holder: session, who, the operation it waits to run, and since
// when (its place in the queue, which the request is part of).
type PreemptRequest struct {
	Session     string    `json:"session_id"`
	Who         string    `json:"who,omitempty"`
	Operation   string    `json:"operation,omitempty"`
	RequestedAt time.Time `json:"requested_at"`
	// Declined says why the holder will not stop for it, when its
	// operation is one helm cannot cancel (protocol.Preemptible): the
	// waiter waits for it to finish. A running hook of the chart, which
	// defers the stop too, shows only in the holder's own output.
	Declined string `json:"declined,omitempty"`
}

// PreemptRequestOf returns the request the holder (its session and its
// operation, "" when unknown) acts on: the first waiter of live, the lock's
// live queue in arrival order (lock.Status.Waiters), that asked this holder
// to stop (its request names the holder's session), as lock.Held.WatchAsks
// picks it; nil when none asked.
func PreemptRequestOf(live []lock.Waiter, holder string, holderOp lock.Operation) *PreemptRequest {
	for _, w := range live {
		if !w.Preempt || w.PreemptHolder != holder || w.Session == holder {
			continue
		}
		p := &PreemptRequest{Session: w.Session, Who: w.Who, Operation: string(w.Operation), RequestedAt: w.EnqueuedAt}
		if holderOp != "" {
			if ok, why := protocol.Preemptible(holderOp); !ok {
				p.Declined = why
			}
		}
		return p
	}
	return nil
}

// durations gives d as the table prints it and as whole seconds for JSON.
func durations(d time.Duration) (string, *int64) {
	secs := int64(d.Round(time.Second) / time.Second)
	return roundDuration(d), &secs
}
