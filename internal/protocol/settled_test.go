package protocol

import (
	"context"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/release/common"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// takenWriter is a lock whose take read the newest record as newest (ok
// false: its take read no record).
type takenWriter struct {
	writer
	newest helmx.Summary
	ok     bool
	given  int
}

func (w *takenWriter) NewestAtTake() (helmx.Summary, bool) {
	w.given++
	if w.given > 1 {
		return helmx.Summary{}, false
	}
	return w.newest, w.ok
}

// TestRecoverTrustsASettledTake: when the take found the newest record
// settled by its labels, the first recovery under the lock reads that
// record alone (not the whole history) and decides from it when its
// release data says settled too; a record whose label was edited by hand
// over a pending release (helm goes by the data), a pending, unlabelled or
// unknown label, or a take that read no record (a Lease alone) reads the
// history as before, and so does every later recovery under the same lock.
// A take that found no record decides there is none.
func TestRecoverTrustsASettledTake(t *testing.T) {
	relabelled := revision(t, 3, common.StatusPendingUpgrade, t0.Add(-time.Minute))
	relabelled.Labels["status"] = "failed" // "fixed" by hand; helm still refuses
	policy := recovery.Policy{Autorecover: true}
	v2 := helmx.ReleaseSecretName("web", 2)
	v3 := helmx.ReleaseSecretName("web", 3)
	for _, tc := range []struct {
		name      string
		stored    []runtime.Object
		newest    helmx.Summary
		ok        bool
		wantReads int // whole-history lists
		wantGets  int // reads of one record
		wantLast  int
		want      recovery.Verdict
	}{
		{"settled newest", nil, helmx.Summary{RecordName: v2, Revision: 2, Status: common.StatusDeployed}, true, 0, 1, 2, recovery.Proceed},
		{"no record", nil, helmx.Summary{}, true, 0, 0, 0, recovery.NoRelease},
		{"label edited over a pending release", []runtime.Object{relabelled}, helmx.Summary{RecordName: v3, Revision: 3, Status: common.StatusFailed}, true, 1, 1, 3, recovery.Blocked},
		{"pending label", nil, helmx.Summary{RecordName: v2, Revision: 2, Status: common.StatusPendingUpgrade}, true, 1, 0, 2, recovery.Proceed},
		{"no status label", nil, helmx.Summary{RecordName: v2, Revision: 2}, true, 1, 0, 2, recovery.Proceed},
		{"a Lease alone", nil, helmx.Summary{}, false, 1, 0, 2, recovery.Proceed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stored := append([]runtime.Object{
				revision(t, 1, common.StatusSuperseded, t0.Add(-2*time.Hour)),
				revision(t, 2, common.StatusDeployed, t0.Add(-time.Hour)),
			}, tc.stored...)
			c, cs := fakeConn(t, stored...)
			w := &takenWriter{newest: tc.newest, ok: tc.ok}
			out, err := c.Recover(context.Background(), Procedure{Release: "web", Namespace: "shop", Lock: dead, Policy: policy, Next: lock.OpRollback, Writer: w})
			if err != nil {
				t.Fatal(err)
			}
			if out.Decision.Verdict != tc.want || out.Latest != tc.wantLast {
				t.Errorf("verdict %v (%s), latest %d; want %v, %d", out.Decision.Verdict, out.Decision.Reason, out.Latest, tc.want, tc.wantLast)
			}
			gets := 0
			for _, a := range cs.Actions() {
				if a.GetVerb() == "get" && a.GetResource().Resource == "secrets" {
					gets++
				}
			}
			if got := len(historyLists(cs)); got != tc.wantReads || gets != tc.wantGets {
				t.Errorf("%d history reads and %d record reads, want %d and %d", got, gets, tc.wantReads, tc.wantGets)
			}
			// A later recovery under the same lock reads the history.
			cs.ClearActions()
			if _, err := c.Recover(context.Background(), Procedure{Release: "web", Namespace: "shop", Lock: dead, Policy: policy, Next: lock.OpRollback, Writer: w}); err != nil {
				t.Fatal(err)
			}
			if got := len(historyLists(cs)); got != 1 {
				t.Errorf("a later recovery made %d history reads, want 1", got)
			}
		})
	}
}
