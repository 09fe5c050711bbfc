package inspect

import (
	"fmt"
	"io"
	"strings"

	"helm.sh/helm/v4/pkg/release/common"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/recovery"
)

// Write is one revision a recovery marks (or would mark) failed.
type Write struct {
	Revision int
	// RecordKind is the kind of the revision's record (Secret or ConfigMap).
	RecordKind  string
	RecordName  string
	From        common.Status
	Description string
}

// Report is what the recover command says about one release.
type Report struct {
	Release   string
	Namespace string
	Decision  recovery.Decision
	// DryRun: nothing was written; Writes are what a real run would write.
	DryRun bool
	// Writes are the revisions marked failed (or to be).
	Writes []Write
	// RolledBack is set when the release was (or would be) rolled back to
	// Decision.RollbackTo after the recovery.
	RolledBack bool
	// Event is the reason of the Event recorded (or to be).
	Event string
	// Said, when set, is what the recovery did (protocol.Outcome.Said),
	// told instead of the decision's own words.
	Said string
	// Objects are the release's objects the recovery reverted, deleted,
	// left in place or kept (or, in a dry run, would), one line each
	// (recovery.ConvergeReport.Lines).
	Objects []string
}

// Verdict says the decision's verdict in plain words.
func Verdict(dec recovery.Decision, dryRun bool) string {
	switch dec.Verdict {
	case recovery.NoRelease:
		return "unknown release: nothing is stored for it"
	case recovery.Proceed:
		return "nothing to recover"
	case recovery.Recover:
		if dryRun {
			return "recoverable"
		}
		return "recovered"
	case recovery.RecoverThenRollback:
		if dryRun {
			return fmt.Sprintf("recoverable, then rolled back to revision %d", dec.RollbackTo)
		}
		return fmt.Sprintf("recovered and rolled back to revision %d", dec.RollbackTo)
	case recovery.Blocked:
		if dec.AtWork {
			return "not recoverable now (its helm may still be at work; looked at again in " + roundDuration(dec.RetryAfter) + ")"
		}
		if dec.RetryAfter > 0 {
			return "not recoverable now (recoverable in " + roundDuration(dec.RetryAfter) + ")"
		}
		return "not recoverable now"
	}
	return dec.Verdict.String()
}

// WriteReport prints r in plain words: the verdict, why, and what was (or
// would be) written.
func WriteReport(out io.Writer, r Report) error {
	var b strings.Builder
	verdict, why := Verdict(r.Decision, r.DryRun), r.Decision.Said(!r.DryRun && len(r.Writes) > 0)
	if !r.DryRun && len(r.Writes) > 0 && r.Said != "" {
		why = r.Said
		if r.Decision.Verdict == recovery.RecoverThenRollback && !r.RolledBack {
			verdict = "recovered, not rolled back"
		}
	}
	fmt.Fprintf(&b, "Release %q in namespace %q: %s.\n", r.Release, r.Namespace, verdict)
	fmt.Fprintf(&b, "Why: %s.\n", strings.TrimSuffix(why, "."))
	recovers := r.Decision.Verdict == recovery.Recover || r.Decision.Verdict == recovery.RecoverThenRollback
	if recovers {
		if r.DryRun {
			b.WriteString("Would write (dry run: nothing was written):\n")
			fmt.Fprintf(&b, "  - the release's lock (%s): taken for the recovery, then released\n", lock.LeaseName(r.Release))
		} else {
			b.WriteString("Wrote:\n")
		}
		for _, w := range r.Writes {
			fmt.Fprintf(&b, "  - %s %s: revision %d %s -> %s, description:\n      %s\n", kindOr(w.RecordKind), w.RecordName, w.Revision, w.From, common.StatusFailed, w.Description)
		}
		if r.RolledBack || (r.DryRun && r.Decision.Verdict == recovery.RecoverThenRollback) {
			fmt.Fprintf(&b, "  - a rollback of release %q to revision %d (--recover-strategy=rollback), a new revision\n", r.Release, r.Decision.RollbackTo)
		}
		if r.Event != "" && len(r.Writes) > 0 {
			fmt.Fprintf(&b, "  - Event %s regarding %s %s\n", r.Event, kindOr(r.Writes[0].RecordKind), r.Writes[0].RecordName)
		}
		if len(r.Objects) > 0 {
			b.WriteString("Objects of the abandoned revision:\n")
			for _, o := range r.Objects {
				fmt.Fprintf(&b, "  - %s\n", o)
			}
		}
	} else if r.DryRun {
		b.WriteString("Dry run: nothing was written.\n")
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// kindOr names a record's kind, Secret (helm's default driver) when unknown.
func kindOr(kind string) string {
	if kind == "" {
		return "Secret"
	}
	return kind
}
