package guard

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/parentwatch"
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
		grace := 3 * time.Second
		if _, ok := sig.(parentEnded); ok || r.t.Op == lock.OpRollback || r.t.Op == lock.OpUninstall {
			grace = 0
		}
		timer := r.g.Clock.NewTimer(grace)
		select {
		case <-quit:
			return
		case <-ch:
			// Not through exitOnce: a second signal must end the process
			// at once even while another path (fail-stop) is cleaning up.
			r.g.Exit(exitcode.Interrupted)
			return
		case <-timer.C():
		}
		select {
		case <-r.opDone:
			return // helm handled it and the operation has ended
		default:
		}
		// Marking the release failed and releasing the lock can take up to
		// their timeouts when the API server is slow; they run aside so that
		// a second signal still ends the process at once.
		go r.exitOnce.Do(func() {
			r.abandonOwn("interrupted by " + sig.String())
			r.release(false)
			fmt.Fprintf(r.g.Stderr, "Error: release %q in namespace %q: interrupted by %s; the release is marked failed and its lock released\n",
				r.t.Release, r.t.Namespace, sig)
			r.g.Exit(exitcode.Interrupted)
		})
		select {
		case <-quit:
		case <-ch:
			r.g.Exit(exitcode.Interrupted)
		}
	}()
	return func() {
		signal.Stop(ch)
		close(quit)
	}
}

// parentEnded stands for the end of helm, the plugin's parent process, in
// the first-signal path.
type parentEnded struct{}

func (parentEnded) String() string { return "the end of helm, its parent process" }
func (parentEnded) Signal()        {}
