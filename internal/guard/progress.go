package guard

import (
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/term"
	"k8s.io/utils/clock"

	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
)

// progress reports a wait for a lock on stderr: one line rewritten in place
// on a terminal, a line every few seconds otherwise.
type progress struct {
	w        io.Writer
	clock    clock.PassiveClock
	tty      bool
	deadline time.Time
	last     time.Time
	printed  bool
	// preempt is set when this client asked the holder to stop
	// (--preempt); asked names the holder it said so of last.
	preempt bool
	asked   string
}

func newProgress(w io.Writer, clk clock.PassiveClock, timeout time.Duration) *progress {
	tty := false
	if f, ok := w.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	return &progress{w: w, clock: clk, tty: tty, deadline: clk.Now().Add(timeout)}
}

func (p *progress) update(holder *protocol.Record, left time.Duration) {
	now := p.clock.Now()
	if p.preempt && holder != nil && holder.Session != p.asked {
		p.asked = holder.Session
		p.asking(holder)
	}
	if !p.tty && p.printed && now.Sub(p.last) < 5*time.Second {
		return
	}
	p.last, p.printed = now, true
	who := "another client"
	if holder != nil {
		who = fmt.Sprintf("%s (%s, session %s)", holder.Who, holder.Operation, holder.Session)
	}
	line := fmt.Sprintf("waiting for the lock held by %s; taking it over in %s unless it is renewed; giving up in %s",
		who, left.Round(time.Second), p.deadline.Sub(now).Round(time.Second))
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		return
	}
	fmt.Fprintln(p.w, line)
}

// asking says, once per holder, that this client asked it to stop, and
// whether it can.
func (p *progress) asking(holder *protocol.Record) {
	who := fmt.Sprintf("%s (%s, session %s)", holder.Who, holder.Operation, holder.Session)
	line := fmt.Sprintf("asked the holder of the lock, %s, to stop (--preempt); waiting for it in arrival order", who)
	if ok, why := protocol.Preemptible(holder.Operation); !ok {
		line = fmt.Sprintf("asked the holder of the lock, %s, to stop (--preempt), but it will not: %s; waiting for it to finish", who, why)
	}
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s\n", line)
		return
	}
	fmt.Fprintln(p.w, line)
}

func (p *progress) done() {
	if p.tty && p.printed {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

// confirmNotice tells, once per wait, that a lock which expired only just
// now by the API server's clock is waited for until this client has seen
// it unchanged for a lease (lock.Confirm), so that a short pause before a
// recovery is explained.
func confirmNotice(w io.Writer, release, namespace string) func(*protocol.Record, time.Duration) {
	return func(holder *protocol.Record, in time.Duration) {
		who := "its holder"
		if holder != nil {
			who = fmt.Sprintf("%s (%s, session %s)", holder.Who, holder.Operation, holder.Session)
		}
		fmt.Fprintf(w, "the lock of release %q in namespace %q held by %s expired by the API server's clock; taking it over in %s unless it is renewed (an expiry this recent is confirmed on this machine's own clock)\n",
			release, namespace, who, in.Round(time.Second))
	}
}
