package guard

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/parentwatch"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
)

// handleSignals implements the signal contract: after a first SIGINT or
// SIGTERM the release ends failed and the lock is released within 5 s; a
// second signal exits at once (the lease then expires and the next
// operation recovers). Helm's own install and upgrade react to the first
// signal by cancelling and marking the release failed; for rollback and
// uninstall, which do not, and as a backstop, this marks it failed itself.
//
// In plugin mode, the end of helm, the parent process, is a first signal
// too (parentwatch.Gone): many CI runners signal only helm. Helm's action
// in this process did not get a signal then, so the release is marked
// failed at once.
func (r *run) handleSignals() (stop func()) {
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	quit := make(chan struct{})
	go func() {
		var sig os.Signal
		select {
		case sig = <-ch:
		case <-parentwatch.Gone():
			sig = parentEnded{}
		case <-quit:
			return
		}
		r.interrupted.Store(true)
		firstAt := r.g.Clock.Now()
		_, parent := sig.(parentEnded)
		// waitFor waits until until fires (true), quit (false), or a second
		// signal, which ends the process at once (false): not through
		// exitOnce, so that it does even while another path (fail-stop) is
		// cleaning up. A nil until never fires.
		waitFor := func(until <-chan time.Time) bool {
			for {
				select {
				case <-quit:
					return false
				case <-ch:
					if isSecondSignal(parent, r.g.Clock.Since(firstAt)) {
						r.g.Exit(exitcode.Interrupted)
						return false
					}
				case <-until:
					return true
				}
			}
		}
		grace := 3 * time.Second
		if parent || r.t.Op == protocol.OpRollback || r.t.Op == protocol.OpUninstall {
			grace = 0
		}
		if !waitFor(r.g.Clock.NewTimer(grace).C()) {
			return
		}
		r.endMu.Lock()
		select {
		case <-r.opDone:
			r.endMu.Unlock()
			return // helm handled it and the operation has ended
		default:
		}
		if r.ending {
			// A waiter's request to stop (--preempt) is ending the
			// operation already: a second signal still ends the process
			// at once.
			r.endMu.Unlock()
			waitFor(nil)
			return
		}
		r.ending = true
		r.endMu.Unlock()
		fmt.Fprintf(r.g.Stderr, "helm-autorecover: release %q in namespace %q: %s: %s\n", r.t.Release, r.t.Namespace, sig, CleanupStarted)
		// Marking the release failed and releasing the lock can take up to
		// their timeouts when the API server is slow; they run aside so that
		// a second signal still ends the process at once.
		go func() {
			defer close(r.ended)
			r.exitOnce.Do(func() {
				r.abandonOwn("interrupted by " + sig.String())
				r.end()
				fmt.Fprintf(r.g.Stderr, "Error: release %q in namespace %q: interrupted by %s; the release is marked failed and its lock released\n",
					r.t.Release, r.t.Namespace, sig)
				r.g.Exit(exitcode.Interrupted)
			})
		}()
		waitFor(nil)
	}()
	return func() {
		signal.Stop(ch)
		close(quit)
	}
}

// CleanupStarted is what the guard says on stderr when it starts marking
// the release failed and releasing the lock itself after a first signal
// (helm did not end the operation within the grace period, or does not
// handle signals in it). Tests wait for it to know that path was taken.
const CleanupStarted = "marking the release failed and releasing its lock (a second signal ends at once and leaves the lock to expire)"

// groupSignalWindow is how long after the end of helm (the plugin's
// parent) a signal to this process is taken for the same event: a signal
// to the process group (a terminal's Ctrl-C, a CI runner stopping a job)
// ends helm and reaches this process too, and the end of helm may be seen
// first.
const groupSignalWindow = 2 * time.Second

// isSecondSignal reports whether a signal that arrives since after the
// first one (the end of helm when parent is set) is a second signal, which
// ends the process at once: any signal after a first signal, except one
// that arrives within groupSignalWindow of the end of helm.
func isSecondSignal(parent bool, since time.Duration) bool {
	return !parent || since >= groupSignalWindow
}

// parentEnded stands for the end of helm, the plugin's parent process, in
// the first-signal path.
type parentEnded struct{}

func (parentEnded) String() string { return "the end of helm, its parent process" }
func (parentEnded) Signal()        {}
