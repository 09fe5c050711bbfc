package recovery

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"helm.sh/helm/v4/pkg/release/common"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
)

// Verdict is what the caller should do about a release before it runs its
// own operation.
type Verdict int

const (
	// NoRelease: the release has no stored revision.
	NoRelease Verdict = iota
	// Proceed: the latest revision is not pending; there is nothing to recover.
	Proceed
	// Recover: mark Decision.Target (and Decision.Stray) failed, then proceed.
	Recover
	// RecoverThenRollback: as Recover, then roll back to Decision.RollbackTo.
	RecoverThenRollback
	// Blocked: the latest revision is pending and may not be recovered now:
	// someone holds a live lock on it, a legacy pending revision is too young
	// (see Decision.RetryAfter), legacy recovery is disabled, or autorecover
	// is off. The caller must not write the release.
	Blocked
)

func (v Verdict) String() string {
	switch v {
	case NoRelease:
		return "NoRelease"
	case Proceed:
		return "Proceed"
	case Recover:
		return "Recover"
	case RecoverThenRollback:
		return "RecoverThenRollback"
	case Blocked:
		return "Blocked"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Strategy is what recovery does after marking the abandoned revision failed.
type Strategy string

const (
	// StrategyFail only marks the abandoned revision failed; the requested
	// operation then runs against the last good state.
	StrategyFail Strategy = "fail"
	// StrategyRollback also rolls back to the last deployed revision.
	StrategyRollback Strategy = "rollback"
)

// Policy is the user's choice of how far recovery may go.
type Policy struct {
	// Autorecover off leaves every pending revision alone (the lock is still
	// taken and honoured).
	Autorecover bool
	// LegacyAfter is how long, in server time, a pending revision with no lock
	// record must have been pending before it counts as abandoned. Zero or
	// negative: never.
	LegacyAfter time.Duration
	// Strategy is fail (the zero value means fail) or rollback.
	Strategy Strategy
	// Hints names the user's knobs in the reasons; the zero value names
	// them in words, as a library user sees them (the CLI passes CLIHints).
	Hints Hints
}

// Hints are the names of the settings Decide's reasons tell a person to
// change.
type Hints struct {
	// LegacyAfter names Policy.LegacyAfter, Autorecover turning recovery
	// off, and LockTimeout waiting for a live holder.
	LegacyAfter string
	Autorecover string
	LockTimeout string
}

// CLIHints are the helm-autorecover CLI's flags.
var CLIHints = Hints{LegacyAfter: "--recover-legacy-after", Autorecover: "--autorecover=false", LockTimeout: "--lock-timeout"}

func (h Hints) orWords() Hints {
	if h.LegacyAfter == "" {
		h.LegacyAfter = "the legacy recovery age"
	}
	if h.Autorecover == "" {
		h.Autorecover = "autorecover off"
	}
	if h.LockTimeout == "" {
		h.LockTimeout = "a lock wait"
	}
	return h
}

// Operations a lock record may name. They are matched against the pending
// status when the record does not say which revision it was writing.
const (
	OpInstall   = "install"
	OpUpgrade   = "upgrade"
	OpRollback  = "rollback"
	OpUninstall = "uninstall"
)

// LockState is how the caller found the release's lock.
type LockState int

const (
	// LockNone: there is no lock record for the release. Whatever is pending
	// was not written under our lock (stock helm, or an older client).
	LockNone LockState = iota
	// LockReleased: a record exists and its holder released it cleanly. A
	// holder that releases is alive and resolves its own revision first, so a
	// revision still pending is not attributed to it: it counts as legacy, as
	// with LockNone. (A holder whose Create lost to stock helm releases too;
	// that pending revision is stock helm's, and may be live.)
	LockReleased
	// LockExpired: the record's holder let it expire and the caller took the
	// lock over; LockInfo describes the previous holder.
	LockExpired
	// LockLive: someone else holds the lock now. Only observers (such as the
	// controller) see this; a client that holds the lock itself never does.
	LockLive
)

func (s LockState) String() string {
	switch s {
	case LockNone:
		return "none"
	case LockReleased:
		return "released"
	case LockExpired:
		return "expired"
	case LockLive:
		return "live"
	}
	return fmt.Sprintf("LockState(%d)", int(s))
}

// LockInfo is the previous lock record as far as recovery needs it. The
// caller maps its lock backend's record onto it.
type LockInfo struct {
	State LockState
	// Session, Who and Operation identify the previous holder, for messages
	// and for matching when Revision is unknown.
	Session   string
	Who       string
	Operation string
	// Revision is the revision the holder was writing; 0 when unknown. It is
	// strongest evidence when the holder records it after its own Create of
	// that revision succeeded.
	Revision int
	// AcquiredAt is when the holder took the lock, in server time; zero when
	// unknown. A revision written before it is not the holder's.
	AcquiredAt time.Time
	// LockedTill is when the lock expired (or expires), in server time.
	LockedTill time.Time
	// Stopped is set when the holder is known to have stopped writing: the
	// client that took its lock over confirmed its expiry on its own clock
	// (lock.Confirm), or the holder released naming itself
	// (lock.Record.Stopped). Otherwise (a person's unlock --force released
	// it early, or an earlier version handed it on) it may still write
	// until its LockedTill.
	Stopped bool
}

// ServerTime bounds the API server's clock at the moment of the decision.
type ServerTime struct {
	Earliest time.Time
	Latest   time.Time
}

func (t ServerTime) known() bool {
	return !t.Earliest.IsZero() && !t.Latest.Before(t.Earliest)
}

// Input is everything Decide looks at. It holds no clients and no clocks.
type Input struct {
	// Release and Namespace name the release, for messages; when empty they
	// are taken from the latest revision.
	Release   string
	Namespace string
	// History is every stored revision of the release, in any order.
	History []helmx.Summary
	// Lock is the release's lock as the caller found it.
	Lock LockInfo
	// Now is the API server's clock, never the local one.
	Now    ServerTime
	Policy Policy
	// Work is what the caller found of signs that a helm process is still
	// at work on the latest revision (rule 5). The caller looks only when
	// a decision asks it to (Decision.LookForWork), and then decides again.
	Work Work
}

// Work is what the caller found, in the cluster, of signs that a helm
// process is still at work on a legacy pending revision: the hook Jobs and
// Pods the revision's own record names (helm records each hook there
// before it creates it, and waits for a Job or Pod hook to finish).
type Work struct {
	// Looked is set once the caller looked.
	Looked bool
	// Hooks are the revision's hook Jobs and Pods that exist.
	Hooks []HookObject
	// Unknown says why the caller could not tell (the record or a hook
	// could not be read); empty when it could.
	Unknown string
}

// HookObject is a hook Job or Pod of a pending revision as found in the
// cluster.
type HookObject struct {
	Kind      string
	Namespace string
	Name      string
	// Created is its server-set creationTimestamp.
	Created time.Time
	// Finished: a Job Complete or Failed, a Pod Succeeded or Failed.
	Finished bool
}

// HookRecheck is how long a legacy pending revision held back by a running
// hook (or by hooks that could not be read) waits before it is looked at
// again (Decision.RetryAfter).
const HookRecheck = 30 * time.Second

// Abandonment describes one pending revision that recovery will mark failed,
// and why it is judged abandoned.
type Abandonment struct {
	// Release is the pending revision as read, with its resourceVersion.
	Release helmx.Summary
	// Lock is the lock record it was written under; nil when it was written
	// with no lock record of ours (stock helm).
	Lock *LockInfo
	// PendingSince is when the revision was last written, in server time.
	PendingSince time.Time
	// Age is how long it had been pending at the decision, in server time.
	Age time.Duration
}

// Decision is Decide's verdict, with a reason a person can act on.
type Decision struct {
	Verdict Verdict
	// Reason is one plain sentence naming the release, namespace, revision,
	// status and, where known, the previous holder.
	Reason string
	// Done is Reason as it reads once a Recover or RecoverThenRollback
	// verdict has been carried out ("was marked failed"), for the Event,
	// the log and the report written after the fact; empty otherwise.
	Done string
	// DoneMarked is Done without the rollback a RecoverThenRollback verdict
	// calls for, for a recovery whose rollback did not happen.
	DoneMarked string
	// Target is the latest revision when it is pending (the one to mark
	// failed under a Recover verdict); its Release.Revision is 0 otherwise.
	Target Abandonment
	// Stray lists older pending revisions, newest first, to mark failed
	// together with Target. Set only with Recover and RecoverThenRollback.
	Stray []Abandonment
	// RollbackTo is the revision to roll back to under RecoverThenRollback.
	RollbackTo int
	// RetryAfter is, under Blocked, the server-time wait until a legacy
	// pending revision becomes recoverable, or until a holder whose lock
	// was released early has certainly stopped writing; 0 when waiting will
	// not help.
	RetryAfter time.Duration
	// LookForWork is set, under Blocked, when a legacy pending revision is
	// old enough to be recovered but Input.Work was not looked at: look
	// for its running hooks and decide again (rule 5).
	LookForWork bool
	// AtWork is set, under Blocked, when a legacy pending revision old
	// enough to be recovered is held back by a running hook of it, or by
	// hooks that could not be read: RetryAfter is then when to look again,
	// not when it becomes recoverable.
	AtWork bool
	// HolderMayWrite is set, under Blocked, when the revision's holder may
	// still be writing the release (its lock was released before its LOCKED
	// TILL): nobody may write the release before RetryAfter, whatever the
	// policy.
	HolderMayWrite bool
}

// TimestampResolution is the precision of the server-set timestamps ages are
// measured from (metav1.Time keeps whole seconds). A recorded time may be up
// to this much earlier than the real write, so it is added before comparing.
const TimestampResolution = time.Second

// IsPending reports whether status means an operation was under way when the
// revision was written: helm's three pending states, plus uninstalling, which
// an interrupted uninstall leaves behind.
func IsPending(status common.Status) bool {
	return status.IsPending() || status == common.StatusUninstalling
}

// Decide judges whether the release's pending revision, if any, may be
// recovered now. It is pure: the same Input always gives the same Decision.
//
// The rules, in the order they apply:
//
//  1. No revisions: NoRelease.
//  2. Only the latest revision counts, as it does for helm. If it is not
//     pending (pending-install, pending-upgrade, pending-rollback or
//     uninstalling), Proceed. Older pending revisions do not block helm and
//     are left alone here.
//  3. A pending latest revision under a live lock is protected: Blocked. Its
//     holder is alive and may still finish it.
//  4. The latest revision was written under the previous lock record, which
//     has expired (the caller took it over), when the record names that
//     revision (or the revision's own record names itself under that
//     holder's lock: helmx.Summary.LockRevision), or names no revision (0)
//     and an operation that writes this
//     pending status (install: pending-install; upgrade: pending-upgrade, or
//     pending-install for upgrade --install; rollback: pending-rollback;
//     uninstall: uninstalling), and the revision's own record carries that
//     holder's lock (its session is the record's holder, or the holder the
//     record names abandoned: helmx.Summary.CarriesLockOf). When the record
//     names no revision, the revision's last write, in server time, must
//     also lie inside the lock's tenure: after AcquiredAt (when known;
//     timestamps are whole seconds, so within TimestampResolution before it
//     counts as after) and no later than LockedTill, since a fenced holder
//     never writes after its lock ends (a record that names the revision
//     needs no times, which its holder's Date headers may have skewed).
//     Such a revision is abandoned:
//     Recover, unless autorecover is off (Blocked). A holder known to have
//     stopped (Stopped: its taker confirmed the expiry, on its own clock
//     when the Date headers could not tell) has no writer left; any other
//     (a lock a person released early) may, until the server clock has
//     certainly passed its LockedTill plus lock.TakeoverMargin: Blocked
//     with RetryAfter until then. The record is
//     mapped by FromRecord, whose attribution rule drops AcquiredAt when
//     the record names its revision. A released lock
//     never attributes a revision (see LockReleased).
//  5. Any other pending latest revision is legacy: stock helm wrote it with
//     no lock record, or wrote it after (newer than) the revision our record
//     names, and may still be running it. It is abandoned only when it has
//     been pending for at least Policy.LegacyAfter in server time, counted
//     from its last server-side write (creationTimestamp, or the newest
//     managedFields time, since an uninstall edits an old Secret in place)
//     plus TimestampResolution, up to the earliest possible server now.
//     Before that: Blocked with RetryAfter. LegacyAfter 0 (never), an unknown
//     write time or unknown server time: Blocked with no RetryAfter.
//     Autorecover off: Blocked. Once old enough, it is still held back
//     while its helm shows signs of being at work: a hook Job or Pod its
//     own record names, created no earlier than the revision
//     (creationTimestamp; for uninstalling, its last write; same second
//     counts) and not finished. Until the caller has looked
//     (Input.Work.Looked): Blocked with LookForWork, so that the lookup
//     costs nothing on any other path. A running hook, or hooks that
//     could not be read: Blocked with RetryAfter HookRecheck, naming them.
//  6. With StrategyRollback, a recoverable revision gives
//     RecoverThenRollback to the newest deployed revision older than it; when
//     there is none, plain Recover (fail).
//
// When the verdict is Recover or RecoverThenRollback, Stray lists the older
// pending revisions: a newer revision was written after them, so no live
// writer of theirs can be protected by leaving them pending.
func Decide(in Input) Decision {
	if len(in.History) == 0 {
		return Decision{
			Verdict: NoRelease,
			Reason:  fmt.Sprintf("release %q in namespace %q has no stored revision", in.Release, in.Namespace),
		}
	}
	hist := slices.Clone(in.History)
	slices.SortStableFunc(hist, func(a, b helmx.Summary) int { return cmp.Compare(b.Revision, a.Revision) })
	latest := hist[0]
	name, ns := cmp.Or(in.Release, latest.Name), cmp.Or(in.Namespace, latest.Namespace)
	subject := fmt.Sprintf("release %q in namespace %q", name, ns)

	// Rule 2.
	if !IsPending(latest.Status) {
		reason := fmt.Sprintf("%s: latest revision %d is %s; nothing is pending", subject, latest.Revision, latest.Status)
		if in.Lock.State == LockExpired && in.Lock.Revision == latest.Revision {
			reason += fmt.Sprintf(" (the previous holder, %s, finished writing it)", holder(in.Lock))
		}
		return Decision{Verdict: Proceed, Reason: reason}
	}

	pendingAt := fmt.Sprintf("%s: revision %d is %s", subject, latest.Revision, latest.Status)
	hints := in.Policy.Hints.orWords()
	target := abandonment(latest, in.Lock, in.Now)

	// Rule 3.
	if in.Lock.State == LockLive {
		return Decision{
			Verdict: Blocked,
			Target:  target,
			Reason: fmt.Sprintf("%s under a live lock held by %s until %s; it is not abandoned. Wait for the holder, or use %s to wait automatically",
				pendingAt, holder(in.Lock), stamp(in.Lock.LockedTill), hints.LockTimeout),
		}
	}

	var reason string
	if target.Lock != nil {
		// Rule 4.
		reason = fmt.Sprintf("%s, written by %s %s", pendingAt, holder(*target.Lock), lockEnd(*target.Lock, in.Now.Latest))
		// A holder stops writing before its LOCKED TILL, so only past it
		// (plus the takeover margin, in server time) is the revision of a
		// holder not known to have stopped (a person released its lock
		// early: unlock --force) certainly abandoned, and only then may
		// anyone else write the release. A holder whose taker confirmed
		// its expiry on its own clock (lock.Confirm) has stopped, and the
		// LOCKED TILL it stamped through a Date header running ahead may
		// still lie minutes in the future.
		notBefore := target.Lock.LockedTill.Add(lock.TakeoverMargin)
		if !target.Lock.Stopped && (!in.Now.known() || !in.Now.Earliest.After(notBefore)) {
			d := Decision{
				Verdict:        Blocked,
				Target:         target,
				HolderMayWrite: true,
				Reason:         fmt.Sprintf("%s; its lock was released before it ran out, and the holder may still be writing until %s", reason, stamp(notBefore)),
			}
			if in.Now.known() {
				d.RetryAfter = notBefore.Sub(in.Now.Earliest) + time.Millisecond
				d.Reason += fmt.Sprintf(". Retry in %s", roundUp(d.RetryAfter))
			}
			return d
		}
		if !in.Policy.Autorecover {
			return Decision{
				Verdict: Blocked,
				Target:  target,
				Reason:  reason + "; autorecover is off (" + hints.Autorecover + "), so it is left pending. Turn autorecover on, or run helm rollback",
			}
		}
		reason += "; it is abandoned"
	} else {
		// Rule 5.
		reason = pendingAt + " with no lock record covering it (stock helm may have written it)"
		if !in.Policy.Autorecover {
			return Decision{
				Verdict: Blocked,
				Target:  target,
				Reason:  reason + "; autorecover is off (" + hints.Autorecover + "), so it is left pending. Turn autorecover on, or run helm rollback",
			}
		}
		if in.Policy.LegacyAfter <= 0 {
			return Decision{
				Verdict: Blocked,
				Target:  target,
				Reason:  reason + "; " + hints.LegacyAfter + " is 0, so it is never recovered automatically. Set " + hints.LegacyAfter + ", or run helm rollback once no helm process is running",
			}
		}
		if target.PendingSince.IsZero() || !in.Now.known() {
			return Decision{
				Verdict: Blocked,
				Target:  target,
				Reason:  reason + "; its age in server time is unknown, so it is not recovered. Run helm rollback once no helm process is running",
			}
		}
		notBefore := target.PendingSince.Add(TimestampResolution).Add(in.Policy.LegacyAfter)
		if in.Now.Earliest.Before(notBefore) {
			wait := notBefore.Sub(in.Now.Earliest)
			return Decision{
				Verdict:    Blocked,
				Target:     target,
				RetryAfter: wait,
				Reason: fmt.Sprintf("%s; pending since %s, age %s; a helm process may still be running it, so it is recoverable from %s (%s %s). Retry in %s, or lower %s if you know none is running",
					reason, stamp(target.PendingSince), age(target.Age), stamp(notBefore), hints.LegacyAfter, in.Policy.LegacyAfter, roundUp(wait), hints.LegacyAfter),
			}
		}
		oldEnough := fmt.Sprintf("%s; pending since %s, age %s, at least %s %s",
			reason, stamp(target.PendingSince), age(target.Age), hints.LegacyAfter, in.Policy.LegacyAfter)
		if d, held := atWork(target, in.Work, in.Now, in.Policy.LegacyAfter, oldEnough); held {
			return d
		}
		reason = oldEnough + "; it is abandoned"
	}

	d := Decision{Verdict: Recover, Target: target}
	for _, s := range hist[1:] {
		if IsPending(s.Status) {
			d.Stray = append(d.Stray, abandonment(s, in.Lock, in.Now))
		}
	}
	done := reason + " and was marked failed"
	reason += " and will be marked failed"
	if len(d.Stray) > 0 {
		revs := make([]string, len(d.Stray))
		for i, s := range d.Stray {
			revs[i] = fmt.Sprintf("%d (%s)", s.Release.Revision, s.Release.Status)
		}
		reason += ", with older pending revisions " + strings.Join(revs, ", ")
		done += ", with older pending revisions " + strings.Join(revs, ", ")
	}

	d.DoneMarked = done
	// Rule 6.
	if in.Policy.Strategy == StrategyRollback {
		if to, ok := lastDeployed(hist[1:]); ok {
			d.Verdict = RecoverThenRollback
			d.RollbackTo = to
			reason += fmt.Sprintf(", then rolled back to revision %d, the last deployed", to)
			done += fmt.Sprintf(", then rolled back to revision %d, the last deployed", to)
		} else {
			reason += "; there is no deployed revision to roll back to, so it is only marked failed"
			done += "; there was no deployed revision to roll back to, so it was only marked failed"
		}
	}
	d.Reason, d.Done = reason, done
	return d
}

// atWork is rule 5's last test: a legacy revision old enough to recover is
// held back while its helm shows signs of being at work (work, as the
// caller found it), or until the caller has looked. reason says why the
// revision is otherwise recoverable.
func atWork(target Abandonment, work Work, now ServerTime, legacyAfter time.Duration, reason string) (Decision, bool) {
	d := Decision{Verdict: Blocked, Target: target}
	switch {
	case !work.Looked:
		d.LookForWork = true
		d.Reason = reason + ", but whether a helm process is still at work on it (a hook Job or Pod still running) was not looked at"
		return d, true
	case work.Unknown != "":
		d.RetryAfter, d.AtWork = HookRecheck, true
		d.Reason = fmt.Sprintf("%s, but whether a helm process is still at work on it cannot be told: %s. Retry in %s",
			reason, work.Unknown, HookRecheck)
		return d, true
	}
	// helm creates a revision's hooks after the revision (an uninstall
	// after its write of the uninstalling status); an older object of the
	// same name is an earlier operation's.
	since := target.Release.CreationTimestamp
	if target.Release.Status == common.StatusUninstalling || since.IsZero() {
		since = target.PendingSince
	}
	// A hook older than the legacy age is no sign of a live helm: helm
	// waits for one hook at most its --timeout, which that age exceeds
	// (docs/protocol.md, "Legacy revisions"); one stuck since (a Pod that
	// never schedules, a suspended Job) would hold the release for ever.
	var running []HookObject
	for _, h := range work.Hooks {
		stale := !h.Created.IsZero() && now.known() && now.Earliest.Sub(h.Created) >= legacyAfter
		if !h.Finished && !stale && (h.Created.IsZero() || !h.Created.Before(since)) {
			running = append(running, h)
		}
	}
	if len(running) == 0 {
		return Decision{}, false
	}
	h := running[0]
	more := ""
	if len(running) > 1 {
		more = fmt.Sprintf(" (and %d more)", len(running)-1)
	}
	d.RetryAfter, d.AtWork = HookRecheck, true
	d.Reason = fmt.Sprintf("%s, but its hook %s %s/%s%s, created at %s, is still running: a helm process may still be at work on it. Retry in %s, or once the hook has finished; if no helm process is running, helm rollback ends it",
		reason, h.Kind, h.Namespace, h.Name, more, stamp(h.Created), HookRecheck)
	return d, true
}

// abandonment describes s as a candidate for recovery, attributing it to the
// lock record when rule 4 holds.
func abandonment(s helmx.Summary, lock LockInfo, now ServerTime) Abandonment {
	a := Abandonment{Release: s, PendingSince: pendingSince(s)}
	if !a.PendingSince.IsZero() && now.known() {
		a.Age = now.Earliest.Sub(a.PendingSince)
	}
	if writtenUnder(s, lock) {
		l := lock
		a.Lock = &l
	}
	return a
}

// writtenUnder is rule 4's test: the revision was written by the holder of
// a lock that has since expired.
func writtenUnder(s helmx.Summary, lock LockInfo) bool {
	if lock.State != LockExpired || lock.LockedTill.IsZero() {
		return false
	}
	// Named: the lock names this revision, or the revision's own record
	// names itself under the holder's lock. The fence writes the revision
	// into the copy of the lock it puts on the record it creates or
	// rewrites, so the latter is the holder's own write of this revision
	// even when the lock named another: an upgrade's --rollback-on-failure
	// writes a second revision under the lock taken for the first.
	named := (lock.Revision > 0 && lock.Revision == s.Revision) ||
		(s.Revision > 0 && s.LockSession == lock.Session && s.LockRevision == s.Revision)
	if !named && (lock.Revision != 0 || !operationWrites(lock.Operation, s.Status)) {
		return false
	}
	if !s.CarriesLockOf(lock.Session) {
		// Not written under this lock: a holder's fenced write carries its
		// lock into the record, and a takeover names the holder it found
		// there. Stock helm may have created this revision between the
		// holder's stamp of the revision number and its own create.
		return false
	}
	// The holder named this revision and its record carries the holder's
	// lock: its own fenced writes put it there (stock helm rewrites a
	// record without annotations), and its LockedTill is not compared: the
	// holder stamped it through its Date headers, which may run minutes
	// behind the API server's clock that dated the write (the simulation,
	// seed 98, found such a revision left pending for good). A lock that
	// named no revision must have been live when the revision was written.
	since := pendingSince(s)
	if !named && (since.IsZero() || since.After(lock.LockedTill)) {
		return false
	}
	if !lock.AcquiredAt.IsZero() && (since.IsZero() || !since.Add(TimestampResolution).After(lock.AcquiredAt)) {
		return false
	}
	return true
}

func operationWrites(op string, status common.Status) bool {
	switch op {
	case OpInstall:
		return status == common.StatusPendingInstall
	case OpUpgrade:
		return status == common.StatusPendingUpgrade || status == common.StatusPendingInstall
	case OpRollback:
		return status == common.StatusPendingRollback
	case OpUninstall:
		return status == common.StatusUninstalling
	}
	return false
}

// pendingSince is the server time of the revision's last write. Helm creates
// pending-install, pending-upgrade and pending-rollback revisions, but sets
// uninstalling on an existing Secret, whose creationTimestamp is then far too
// old; managedFields times move with every write, so the later one is used.
func pendingSince(s helmx.Summary) time.Time {
	// A write in the same (whole) second as the creation still dates the
	// latest change: an uninstall that started right after the revision was
	// created must not count as of unknown age.
	if !s.LastWriteTime.IsZero() && !s.LastWriteTime.Before(s.CreationTimestamp) {
		return s.LastWriteTime
	}
	if s.Status == common.StatusUninstalling {
		// Without a write time the start of the uninstall is unknown.
		return time.Time{}
	}
	return s.CreationTimestamp
}

func lastDeployed(older []helmx.Summary) (int, bool) {
	for _, s := range older {
		if s.Status == common.StatusDeployed {
			return s.Revision, true
		}
	}
	return 0, false
}

// Holder names the lock's holder as recovery's messages do:
// "who (session S, operation O)".
func (l LockInfo) Holder() string { return holder(l) }

func holder(l LockInfo) string {
	who := l.Who
	if who == "" {
		who = "an unknown holder"
	}
	var parts []string
	if l.Session != "" {
		parts = append(parts, "session "+l.Session)
	}
	if l.Operation != "" {
		parts = append(parts, "operation "+l.Operation)
	}
	if len(parts) == 0 {
		return who
	}
	return who + " (" + strings.Join(parts, ", ") + ")"
}

// lockEnd tells how the holder's lock l ended, as seen at server time at
// (the upper bound, which recovery's descriptions are dated with): expired
// at its LOCKED TILL, or, when at lies before it, not expired at all. A
// holder known to have stopped (its taker confirmed its expiry on its own
// clock) is recovered before a LOCKED TILL its Date headers may have put
// ahead: saying its lock expired then would date the recovery before the
// expiry it names.
func lockEnd(l LockInfo, at time.Time) string {
	switch {
	case !beforeLockedTill(l, at):
		return "whose lock expired at " + stamp(l.LockedTill)
	case l.Stopped:
		return "which stopped renewing its lock (LOCKED TILL " + stamp(l.LockedTill) + ", not reached)"
	}
	return "whose lock lasts until " + stamp(l.LockedTill)
}

// beforeLockedTill reports whether server time at, when known, lies before
// l's LOCKED TILL.
func beforeLockedTill(l LockInfo, at time.Time) bool {
	return !at.IsZero() && at.Before(l.LockedTill)
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "an unknown time"
	}
	return t.UTC().Format(time.RFC3339)
}

func age(d time.Duration) string {
	return d.Truncate(time.Second).String()
}

func roundUp(d time.Duration) time.Duration {
	if r := d.Truncate(time.Second); r < d {
		return r + time.Second
	}
	return d
}

// Said is what to tell about d once it has been acted on: Done when the
// recovery it decided was carried out, Reason otherwise.
func (d Decision) Said(carriedOut bool) string {
	if carriedOut && d.Done != "" {
		return d.Done
	}
	return d.Reason
}
