package inspect

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/fatih/color"
	"github.com/gosuri/uitable"
	"helm.sh/helm/v4/pkg/cli/output"
	"helm.sh/helm/v4/pkg/release/common"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
)

// none is printed in a table cell that has no value.
const none = "-"

// LocksHeader is the header of the locks table.
var LocksHeader = []any{
	"NAMESPACE", "RELEASE", "STATE", "REVISION", "STATUS", "SESSION ID", "HOLDER", "OPERATION",
	"ACQUIRED", "RENEWED", "LOCKED TILL", "LEFT", "PENDING FOR", "CI JOB",
}

// WriteLocks writes rows in format (table, json or yaml). An empty list is
// a header alone in a table, and [] in json and yaml.
func WriteLocks(out io.Writer, format output.Format, rows []Row, noHeaders bool) error {
	if done, err := writeStructured(out, format, rows); done {
		return err
	}
	t := uitable.New()
	if !noHeaders {
		t.AddRow(LocksHeader...)
	}
	for _, r := range rows {
		rev := none
		if r.Revision > 0 {
			rev = strconv.Itoa(r.Revision)
		}
		left := cell(r.TimeLeft)
		if r.State == StateExpired && r.ExpiredFor != "" {
			left = "expired " + r.ExpiredFor + " ago"
		}
		pending := cell(r.PendingFor)
		if r.RecoverableIn != "" {
			pending += ", recoverable " + recoverableIn(r.RecoverableIn)
		}
		t.AddRow(r.Namespace, r.Release, string(r.State), rev, cell(r.Status), cell(r.Session), Holder(r)+asked(r.PreemptRequestedBy),
			cell(r.Operation), stamp(r.AcquiredAt), stamp(r.RenewedAt), stamp(r.LockedTill), left, pending, cell(r.CIJobURL))
	}
	return output.EncodeTable(out, t)
}

func recoverableIn(s string) string {
	switch s {
	case "0s":
		return "now"
	case "never":
		return "never (--recover-legacy-after=0)"
	}
	return "in " + s
}

// Holder is the HOLDER cell: who and pid of a held lock (the tables add
// the request to stop a waiter made, if any: asked).
func Holder(r Row) string {
	switch {
	case r.Session == "":
		return none
	case r.Who == "":
		return "unknown (no matching lock record)"
	case r.PID != 0:
		return fmt.Sprintf("%s (pid %d)", r.Who, r.PID)
	}
	return r.Who
}

// asked follows the HOLDER cell of a holder a waiter asked to stop
// (--preempt): who asked, as the holder's own messages name it
// (protocol.Asker), since when, and why the holder will not stop, if it
// will not.
func asked(p *PreemptRequest) string {
	if p == nil {
		return ""
	}
	s := fmt.Sprintf("; asked to stop by %s since %s", protocol.Asker(protocol.Waiter{Session: p.Session, Who: p.Who, Operation: lock.Operation(p.Operation)}), stamp(p.RequestedAt))
	if p.Declined != "" {
		s += ", which it will not do: " + p.Declined
	}
	return s
}

func cell(s string) string {
	if s == "" {
		return none
	}
	return s
}

// stamp prints a server time to the second, in UTC.
func stamp(t time.Time) string {
	if t.IsZero() {
		return none
	}
	return t.UTC().Format(time.RFC3339)
}

// ListElement is one release of `list --locks`: helm list's own fields,
// then the lock's.
type ListElement struct {
	Name       string `json:"name"`
	Namespace  string `json:"namespace"`
	Revision   string `json:"revision"`
	Updated    string `json:"updated"`
	Status     string `json:"status"`
	Chart      string `json:"chart"`
	AppVersion string `json:"app_version"`
	// LockState is live, expired, legacy-pending or none.
	LockState string `json:"lock_state"`
	// LockedTill is the holder's LOCKED TILL in API-server time (RFC 3339),
	// empty when nobody holds the lock.
	LockedTill string `json:"locked_till"`
	// SessionID is the holder's session, empty when nobody holds the lock.
	SessionID string `json:"session_id"`
	// Holder is who holds it, user@host (pid).
	Holder string `json:"holder"`
	// PreemptRequestedBy is the waiter that asked the holder to stop
	// (--preempt), absent when none did.
	PreemptRequestedBy *PreemptRequest `json:"preempt_requested_by,omitempty"`
}

// LockFields fills the lock fields of e from row.
func (e *ListElement) LockFields(r Row) {
	e.LockState = string(r.State)
	e.SessionID = r.Session
	if r.Session != "" {
		e.Holder = Holder(r)
	}
	e.PreemptRequestedBy = r.PreemptRequestedBy
	if r.Session != "" && !r.LockedTill.IsZero() {
		e.LockedTill = r.LockedTill.UTC().Format(time.RFC3339Nano)
	}
}

// ListHeader is the header of `list --locks`: helm's, then the lock's.
var ListHeader = []string{"NAME", "NAMESPACE", "REVISION", "UPDATED", "STATUS", "CHART", "APP VERSION", "LOCKED TILL", "SESSION ID", "HOLDER"}

// WriteList writes `list --locks` output. The table is helm list's table,
// byte for byte (colors included), with LOCKED TILL, SESSION ID and HOLDER
// appended.
func WriteList(out io.Writer, format output.Format, elems []ListElement, noHeaders, noColor bool) error {
	if done, err := writeStructured(out, format, elems); done {
		return err
	}
	t := uitable.New()
	if !noHeaders {
		row := make([]any, len(ListHeader))
		for i, h := range ListHeader {
			row[i] = colorize(h, noColor, color.Bold)
		}
		t.AddRow(row...)
	}
	for _, e := range elems {
		till := cell(e.LockedTill)
		if e.LockedTill != "" {
			if ts, err := time.Parse(time.RFC3339Nano, e.LockedTill); err == nil {
				till = stamp(ts)
			}
			if e.LockState == string(StateExpired) {
				till += " (expired)"
			}
		}
		t.AddRow(e.Name, colorize(e.Namespace, noColor, color.FgCyan), e.Revision, e.Updated,
			colorizeStatus(e.Status, noColor), e.Chart, e.AppVersion, till, cell(e.SessionID), cell(e.Holder)+asked(e.PreemptRequestedBy))
	}
	return output.EncodeTable(out, t)
}

// colorizeStatus colors a status as helm list does.
func colorizeStatus(s string, noColor bool) string {
	switch common.Status(s) {
	case common.StatusDeployed:
		return colorize(s, noColor, color.FgGreen)
	case common.StatusFailed, common.StatusUnknown:
		return colorize(s, noColor, color.FgRed)
	case common.StatusPendingInstall, common.StatusPendingUpgrade, common.StatusPendingRollback, common.StatusUninstalling:
		return colorize(s, noColor, color.FgYellow)
	case common.StatusUninstalled, common.StatusSuperseded:
	}
	return s
}

func colorize(s string, noColor bool, attr color.Attribute) string {
	if noColor {
		return s
	}
	return color.New(attr).Sprint(s)
}

// writeStructured writes items as json or yaml (an empty list as []) and
// reports that it did; for a table it writes nothing and returns false, so
// the caller renders its own table.
func writeStructured[T any](out io.Writer, format output.Format, items []T) (bool, error) {
	if items == nil {
		items = []T{}
	}
	switch format {
	case output.JSON:
		return true, output.EncodeJSON(out, items)
	case output.YAML:
		return true, output.EncodeYAML(out, items)
	case output.Table:
		return false, nil
	default:
		return true, fmt.Errorf("output format %q: %w", format, output.ErrInvalidFormatType)
	}
}
