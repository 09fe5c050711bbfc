package lock

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

var (
	// ErrLocked: another session holds the release's lock (or waiters are
	// queued ahead of the caller). The concrete error is *LockedError.
	ErrLocked = errors.New("release is locked")
	// ErrLost: the holder no longer holds its lock (taken over, deleted, or
	// not renewed before its renew deadline). It must stop writing at once.
	ErrLost = errors.New("lock lost")
	// ErrMaxHold: the operation held the lock longer than its maximum hold
	// time; the holder stops renewing and must abort.
	ErrMaxHold = errors.New("lock held past its maximum hold time")
)

// LockedError tells who holds a release's lock. errors.Is(err, ErrLocked)
// holds for it.
type LockedError struct {
	Release   string
	Namespace string
	// State is Live when a holder has the lock; Free or Expired when the
	// lock is takeable but Ahead waiters come first.
	State State
	// Holder is the holder's record; nil when there is none or it could not
	// be read (HolderIdentity then still names the session).
	Holder         *Record
	HolderIdentity string
	// LockedTill is the holder's expiry in server time (zero if unknown);
	// Left is how long, at the time of the error, until another client may
	// take the lock over (LOCKED TILL + margin, less what the server-time
	// estimate is sure of) unless the holder renews it.
	LockedTill time.Time
	Left       time.Duration
	// Confirming is set when the lock's LOCKED TILL has passed in server
	// time, but too recently for that alone to show its holder stopped:
	// it is taken over once this process has seen it unchanged for a lease
	// (see Confirm), in Left unless the holder renews it meanwhile.
	Confirming bool
	// StampedAhead is set when the lock is live in server time only by a
	// LOCKED TILL further ahead of the API server's clock, as this client
	// reads it, than its holder could have stamped through Date headers
	// that agree (one of the two reads a clock that is wrong): it is taken
	// over once this process has seen it unchanged for a lease (see
	// Confirm), in Left unless the holder renews it meanwhile.
	StampedAhead bool
	// Renewing is set when the holder renewed the lock while this client
	// waited for it to be confirmed: it is alive, though the API server's
	// Date headers say its lock expired.
	Renewing bool
	// confirmAt is, on this process's clock, when the lock's judgement by
	// its own elapsed time changes unless the lock does (see Confirm).
	confirmAt time.Time
	// uncertain is the uncertainty of a live lock's stamp counted in
	// confirmAt (see takeoverIn).
	uncertain time.Duration
	// Ahead counts live waiters queued before the caller.
	Ahead int
	// Waited is how long the caller waited for the lock before it gave up
	// (the CLI's --lock-timeout); 0 when it did not wait.
	Waited time.Duration
	// HolderNotRunning is set by a caller on the holder's own machine that
	// found the holder's pid not running there.
	HolderNotRunning bool
}

// Unwrap makes errors.Is(err, ErrLocked) true.
func (e *LockedError) Unwrap() error { return ErrLocked }

const listHelp = `list locks with "helm-autorecover locks"`

// help says what the caller can do next: wait (unless it just did), break
// a dead holder's lock, look at the locks.
func (e *LockedError) help() string {
	var b strings.Builder
	if e.Waited > 0 {
		fmt.Fprintf(&b, "; gave up after waiting %s (--lock-timeout)", e.Waited.Round(time.Second))
	}
	r := e.Holder
	switch {
	case e.State != Live || r == nil || r.Session == "":
	case e.Renewing:
		b.WriteString("; its holder renewed it while this client waited: it is alive, but the Date headers of the API server this client reached say its lock expired (an API server or a proxy in front of it with a wrong clock?)")
	case e.HolderNotRunning:
		fmt.Fprintf(&b, "; its process (pid %d) is not running on this machine: if no other process works on the release, release the lock with: helm-autorecover unlock %s -n %s --session %s --force", r.PID, e.Release, e.Namespace, r.Session)
	default:
		fmt.Fprintf(&b, "; if its holder is dead (process killed, CI job cancelled), release the lock with: helm-autorecover unlock %s -n %s --session %s --force", e.Release, e.Namespace, r.Session)
	}
	if e.Waited == 0 {
		b.WriteString("; wait for it with --lock-timeout=DURATION, or " + listHelp)
	} else {
		b.WriteString("; " + listHelp)
	}
	return b.String()
}

func (e *LockedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "release %q in namespace %q is locked", e.Release, e.Namespace)
	if e.State != Live {
		fmt.Fprintf(&b, ": %d earlier waiter(s) are queued for it%s", e.Ahead, e.help())
		return b.String()
	}
	r := e.Holder
	switch {
	case r == nil && e.HolderIdentity == UnreadableHolder:
		// A record lock that is not JSON at all has no expiry: waiting
		// does not help.
		fmt.Fprintf(&b, " by a lock record that cannot be read (written by another tool or edited by hand); it does not expire by itself: run \"helm-autorecover locks %s -n %s\" to see where it is and how to clear it", e.Release, e.Namespace)
		return b.String()
	case r == nil:
		fmt.Fprintf(&b, " by session %s (lock record unreadable)", e.HolderIdentity)
	default:
		who := r.Who
		if who == "" {
			who = "unknown"
		}
		fmt.Fprintf(&b, " by %s", who)
		if r.PID != 0 {
			fmt.Fprintf(&b, " pid %d", r.PID)
		}
		fmt.Fprintf(&b, " (session %s, operation %s", r.Session, r.Operation)
		if r.Revision != 0 {
			fmt.Fprintf(&b, " of revision %d", r.Revision)
		}
		if !r.AcquiredAt.IsZero() {
			fmt.Fprintf(&b, ", since %s", formatTime(r.AcquiredAt))
		}
		if r.CIJobURL != "" {
			fmt.Fprintf(&b, ", job %s", r.CIJobURL)
		}
		b.WriteString(")")
	}
	switch {
	case e.StampedAhead:
		fmt.Fprintf(&b, ", LOCKED TILL %s (stamped further ahead of the API server's clock, as this client reads it, than a lease; can be taken over in %s unless renewed, once this client has seen it unchanged for a lease)", formatTime(e.LockedTill), e.Left.Round(time.Second))
	case e.Confirming:
		fmt.Fprintf(&b, ", LOCKED TILL %s (passed by the API server's clock; can be taken over in %s unless renewed, once this client has seen it unchanged for a lease)", formatTime(e.LockedTill), e.Left.Round(time.Second))
	case !e.LockedTill.IsZero():
		fmt.Fprintf(&b, ", LOCKED TILL %s (can be taken over in %s unless renewed)", formatTime(e.LockedTill), e.Left.Round(time.Second))
	}
	if e.Ahead > 0 {
		fmt.Fprintf(&b, ", %d waiter(s) queued", e.Ahead)
	}
	b.WriteString(e.help())
	return b.String()
}

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// awaitsConfirmation reports whether the lock is taken over once this
// process has seen it unchanged long enough (Confirm), whatever the API
// server's clock says meanwhile: Confirming or StampedAhead.
func (e *LockedError) awaitsConfirmation() bool { return e.Confirming || e.StampedAhead }

// seenFrom is confirmAt less the stamp's uncertainty counted in it: a
// lease and the margin after this process first saw the lock as it stands,
// later whenever it changed.
func (e *LockedError) seenFrom() time.Time { return e.confirmAt.Add(-e.uncertain) }
