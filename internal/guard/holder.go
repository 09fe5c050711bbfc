package guard

import (
	"os"
	"strings"

	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
)

// holderNotRunningHere reports whether rec's holder was started on this
// machine (its user@host names this host) and its pid is not running here
// any more: a hint for the person reading the refusal, never a reason to
// take the lock (another machine may share the host name, and a pid
// namespace may hide the process).
func holderNotRunningHere(rec *protocol.Record) bool {
	if rec == nil || rec.PID <= 0 || rec.PID == os.Getpid() {
		return false
	}
	at := strings.LastIndex(rec.Who, "@")
	host, err := os.Hostname()
	if at < 0 || err != nil || host == "" || rec.Who[at+1:] != host {
		return false
	}
	return processGone(rec.PID)
}
