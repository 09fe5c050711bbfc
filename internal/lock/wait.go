package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/helm-autorecover/helm-autorecover/internal/servertime"
)

// progressEvery is how often Wait reports progress while nothing changes.
const progressEvery = time.Second

// probeWidth is the server-time uncertainty below which holders and waiters
// stop timing requests to narrow it (see servertime.Estimator.ProbeAt).
const probeWidth = 50 * time.Millisecond

// Wait acquires the release's lock, waiting while another session holds it.
// Waiters are served in arrival order: each queues itself on the Lease
// (AnnotationQueue) and refreshes its entry every third of its lease, and a
// Free or Expired lock goes to the first live entry. Entries whose refresh
// has expired in server time are skipped, so a waiter that died delays the
// others by one lease at most.
//
// Wait does not poll. It watches the lock and decides again on every change
// that can make its decision anything but "wait" (a release or deletion, or
// its turn coming, is seen within one round trip; the other waiters'
// heartbeats and the holder's own writes are let pass, see quiet.go), and
// it sets a timer to the moment the holder's LOCKED TILL will certainly
// have passed in server time, so a holder that died is taken over as soon
// as its lock expires.
//
// onProgress, when not nil, is called on every decision and about once a
// second with the holder as last read (nil when the lock is free but
// earlier waiters come first, or the record is unreadable) and how long
// until the holder's lock may be taken over unless it is renewed
// (LockedError.Left).
//
// When ctx ends first, Wait leaves the queue and returns an error wrapping
// both ctx's cause and the last *LockedError (so errors.Is(err, ErrLocked)).
func (b *Backend) Wait(ctx context.Context, req Request, onProgress func(holder *Record, left time.Duration)) (*part, error) {
	req, err := b.complete(req)
	if err != nil {
		return nil, err
	}
	w := &waitState{}
	held, err := b.waitLoop(ctx, &req, w, onProgress)
	if err != nil && !w.lastBeat.IsZero() {
		// Leave the queue even though ctx is over, so that the next waiter
		// need not wait for this entry to expire.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = b.dequeue(dctx, &req)
		cancel()
	}
	return held, err
}

func (b *Backend) waitLoop(ctx context.Context, req *Request, w *waitState, onProgress func(*Record, time.Duration)) (*part, error) {
	var last *LockedError
	for tries := 0; ; tries++ {
		res, err := b.attempt(ctx, req, w, &w.maybe)
		if err != nil {
			if last != nil && ctx.Err() != nil {
				return nil, b.gaveUp(ctx, last)
			}
			if !retriable(err) {
				return nil, err
			}
			// A blip of the API server should not end a long wait.
			t := b.clock.NewTimer(time.Second)
			select {
			case <-ctx.Done():
				t.Stop()
				if last != nil {
					return nil, b.gaveUp(ctx, last)
				}
				return nil, err
			case <-t.C():
			}
			continue
		}
		if res.held != nil {
			res.held.waited = tries > 0
			return res.held, nil
		}
		last = res.locked
		if err := b.waitForChange(ctx, req, w, res, onProgress); err != nil {
			return nil, err
		}
	}
}

func (b *Backend) gaveUp(ctx context.Context, last *LockedError) error {
	return fmt.Errorf("gave up waiting (%w): %w", context.Cause(ctx), last)
}

// waitForChange blocks until the Lease changes, the next decision is due
// (holder expiry, a queued entry ahead expiring, our own heartbeat), or ctx
// ends.
func (b *Backend) waitForChange(ctx context.Context, req *Request, w *waitState, res attemptResult, onProgress func(*Record, time.Duration)) error {
	clk := b.clock
	var events <-chan watch.Event
	watcher, err := b.store(req.Namespace).Watch(ctx, res.seen)
	switch {
	case err == nil:
		defer watcher.Stop()
		events = watcher.ResultChan()
	case ctx.Err() != nil:
		return b.gaveUp(ctx, res.locked)
	}
	decideIn := func() time.Duration {
		d := b.nextDecision(req, w, res.seen, res.locked)
		if events == nil {
			// Without a watch, decide again soon; the next attempt opens
			// a new watch.
			d = min(d, progressEvery)
		}
		return d
	}
	timer := clk.NewTimer(decideIn())
	defer timer.Stop()
	ticker := clk.NewTimer(progressEvery)
	defer ticker.Stop()

	// While waiting, a few requests timed to split the Date header's second
	// narrow the server-time estimate, so that the holder's expiry is
	// recognised up to a second sooner.
	var probe <-chan time.Time
	var probeTimer interface{ Stop() bool }
	armProbe := func(notBefore time.Time) {
		probe = nil
		if at, ok := b.time.ProbeAt(notBefore, probeWidth); ok {
			t := clk.NewTimer(at.Sub(clk.Now()))
			probe, probeTimer = t.C(), t
		}
	}
	defer func() {
		if probeTimer != nil {
			probeTimer.Stop()
		}
	}()
	armProbe(clk.Now())

	view := newWatchView(res.seen, req.Session, res.locked != nil && res.locked.State == Live)
	b.progress(res.locked, onProgress)
	for {
		select {
		case <-ctx.Done():
			return b.gaveUp(ctx, res.locked)
		case ev, ok := <-events:
			if !ok || ev.Type == watch.Error {
				// The watch ended (a resourceVersion too old, the
				// server's timeout): decide again within progressEvery,
				// not at once, so a watch that keeps failing never
				// turns into a loop of requests.
				events = nil
				timer.Stop()
				timer.Reset(decideIn())
				continue
			}
			if ev.Type == watch.Bookmark {
				continue
			}
			// A renewal let pass here is still seen: the holder's lock
			// is confirmed expired a lease after its last renewal was
			// seen (Confirm), not a lease after it is next read.
			b.sightEvent(req.Namespace, LeaseName(req.Release), ev.Object)
			if view.quiet(b.store(req.Namespace), ev, b.serverNowOrZero(), b.margin()) {
				continue
			}
			return nil
		case <-timer.C():
			return nil
		case <-ticker.C():
			b.progress(res.locked, onProgress)
			ticker.Reset(progressEvery)
		case <-probe:
			if err := b.time.Probe(ctx, b.client.Discovery()); err != nil {
				probe = nil
				continue
			}
			timer.Stop()
			timer.Reset(decideIn())
			armProbe(clk.Now().Add(probeWidth))
		}
	}
}

func (b *Backend) progress(lk *LockedError, f func(*Record, time.Duration)) {
	if f == nil || lk == nil {
		return
	}
	left := time.Duration(0)
	if lk.State == Live {
		now, _ := b.time.Now()
		left = b.takeoverIn(lk.LockedTill, lk.confirmAt, lk.uncertain, now)
	}
	f(lk.Holder, left)
}

// serverNowOrZero is the server time as estimated without a request (zero
// when unknown).
func (b *Backend) serverNowOrZero() servertime.Bounds {
	now, _ := b.time.Now()
	return now
}

// retriable tells transient failures from those that retrying cannot fix
// (permissions, a missing namespace, an invalid request).
func retriable(err error) bool {
	switch {
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err), apierrors.IsNotFound(err),
		apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsMethodNotSupported(err):
		return false
	case errors.Is(err, servertime.ErrUnknown):
		return false
	}
	return true
}

// nextDecision returns how long until something can change without the
// Lease changing: the holder's lock certainly expiring, the entry of a
// waiter ahead certainly expiring, or our own heartbeat falling due.
func (b *Backend) nextDecision(req *Request, w *waitState, seen *Snapshot, lk *LockedError) time.Duration {
	// A millisecond past the instant, because expiry is strictly "after".
	const past = time.Millisecond
	next := req.LeaseDuration / 3
	if !w.lastBeat.IsZero() {
		next = w.lastBeat.Add(req.LeaseDuration / 3).Sub(b.clock.Now())
	}
	now, ok := b.time.Now()
	if !ok {
		return max(next, past)
	}
	if lk != nil && !lk.confirmAt.IsZero() {
		// Its judgement on this process's clock (Confirm).
		next = min(next, lk.confirmAt.Sub(b.clock.Now())+past)
	}
	if lk != nil && lk.State == Live && !lk.Confirming && !lk.LockedTill.IsZero() {
		next = min(next, lk.LockedTill.Add(b.margin()).Sub(now.Earliest)+past)
	}
	if seen != nil {
		live := liveWaiters(seen.Queue, now, b.margin())
		for _, x := range live[:waitersAhead(live, req.Session)] {
			next = min(next, x.ExpiresAt.Add(b.margin()).Sub(now.Earliest)+past)
		}
	}
	return max(next, past)
}
