package guard

import (
	"fmt"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
)

// preempted ends the process once a waiter asked this holder to stop
// (--preempt) and the lock's write fence is drained (protocol.Lock.Run):
// as the first signal's clean-up does, it marks the revision failed (naming
// who asked) and gives the lock back, then exits with exitcode.Preempted.
// Helm's install or upgrade is not told: its writes are refused from now
// on, and its --wait ends with the process. When helm's operation ended
// first (it may, on a write the drained fence refused), do gives the
// process the preempted exit code itself.
func (r *run) preempted(p *protocol.PreemptedError) {
	if r.interrupted.Load() {
		// A signal came first: its own path ends the process, with its
		// own exit code (the revision is marked failed naming the asker
		// all the same: the fence was drained for the request).
		return
	}
	r.endMu.Lock()
	select {
	case <-r.opDone:
		r.endMu.Unlock()
		return
	default:
	}
	if r.ending {
		r.endMu.Unlock()
		return // a signal's clean-up is under way already
	}
	r.ending = true
	r.endMu.Unlock()
	r.sayStopping(p)
	go func() {
		defer close(r.ended)
		r.exitOnce.Do(func() {
			r.end()
			fmt.Fprintf(r.g.Stderr, "Error: %v; the release is marked failed and its lock given back\n", p)
			r.g.Exit(exitcode.Preempted)
		})
	}()
}

// sayStopping says on stderr who asked the operation to stop, and that it
// stops.
func (r *run) sayStopping(p *protocol.PreemptedError) {
	fmt.Fprintf(r.g.Stderr, "helm-autorecover: release %q in namespace %q: %s asked this operation to stop (--preempt): %s\n",
		r.t.Release, r.t.Namespace, protocol.Asker(p.By), PreemptStarted)
}

// PreemptStarted is what the guard says on stderr when it stops its
// operation at a waiter's request.
const PreemptStarted = "stopping: marking the release failed and giving its lock back"

// declined says why the operation goes on although a waiter asked it to
// stop: the waiter keeps waiting.
func (r *run) declined(by protocol.Waiter, why string) {
	fmt.Fprintf(r.g.Stderr, "helm-autorecover: release %q in namespace %q: %s asked this operation to stop (--preempt); it goes on for now: %s\n",
		r.t.Release, r.t.Namespace, protocol.Asker(by), why)
}
