// How each record write ended, told to the lock: the resourceVersion an
// accepted write returned (RecordWriteNoter) and whether the holder's own
// revision was left settled or pending (OwnRecordReporter).

package helmx

import (
	"bytes"
	"io"
	"net/http"

	"helm.sh/helm/v4/pkg/release/common"
)

// noteWrite tells the lock the resourceVersion an accepted record write
// returned (RecordWriteNoter). The answer's body is read and put back for
// helm.
func (f *fenceRT) noteWrite(g *GuardedWrites, resp *http.Response, err error) {
	n, ok := g.Lock.(RecordWriteNoter)
	if !ok {
		return
	}
	if !accepted(resp, err) || resp.Body == nil {
		n.RecordWriteUnsure()
		return
	}
	body, rerr := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if rerr != nil {
		// helm reads what arrived, then the same error.
		resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{rerr}))
		return
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if d, derr := decode(body); derr == nil && d.meta.ResourceVersion != "" {
		n.RecordWritten(*d.meta)
		return
	}
	n.RecordWriteUnsure()
}

// noteDelete tells the lock (RecordWriteNoter) of a record delete the fence
// was asked to make that did not end in an accepted answer.
func (f *fenceRT) noteDelete(g *GuardedWrites, resp *http.Response, err error) {
	if n, ok := g.Lock.(RecordWriteNoter); ok && !accepted(resp, err) {
		n.RecordWriteUnsure()
	}
}

// accepted reports whether a write's answer says the API server accepted it.
func accepted(resp *http.Response, err error) bool {
	return err == nil && resp != nil && resp.StatusCode/100 == 2
}

// errReader fails every read with err.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// report tells the lock how a write of revision rev's record ended, when
// the revision is the holder's own and the lock wants to know (see
// OwnRecordReporter). status is the status label the write carried ("" for
// a delete).
func (f *fenceRT) report(g *GuardedWrites, rev int, resp *http.Response, err error, status string) {
	r, ok := g.Lock.(OwnRecordReporter)
	if !ok || !f.own(g, rev) {
		return
	}
	settled := false
	switch {
	case err != nil || resp == nil:
	case status == "": // a delete
		settled = resp.StatusCode/100 == 2 || resp.StatusCode == http.StatusNotFound
	default:
		settled = resp.StatusCode/100 == 2 && !isPendingStatus(status)
	}
	r.OwnRecordWrite(rev, settled)
}

// own reports whether revision rev is the holder's: the one its lock record
// names, or one the fence created under it.
func (f *fenceRT) own(g *GuardedWrites, rev int) bool {
	if rev > 0 && g.Lock.Record().Revision == rev {
		return true
	}
	f.w.mu.Lock()
	defer f.w.mu.Unlock()
	return f.w.created[rev]
}

// isPendingStatus reports whether a record's status label says an operation
// is in progress (as recovery.IsPending, which this package cannot import).
func isPendingStatus(s string) bool {
	switch common.Status(s) {
	case common.StatusPendingInstall, common.StatusPendingUpgrade, common.StatusPendingRollback, common.StatusUninstalling,
		common.StatusUnknown: // as good as pending
		return true
	case common.StatusDeployed, common.StatusUninstalled, common.StatusSuperseded, common.StatusFailed:
		return false
	}
	return true // no status label, or one this helm does not know
}
