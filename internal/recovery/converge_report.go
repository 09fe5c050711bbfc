package recovery

import (
	"fmt"
	"strings"
)

// ObjectRef names one Kubernetes object.
type ObjectRef struct {
	APIVersion, Kind, Namespace, Name string
}

func (o ObjectRef) String() string {
	if o.Namespace == "" {
		return o.Kind + " " + o.Name
	}
	return o.Kind + " " + o.Namespace + "/" + o.Name
}

// ConvergeAction is what Converge did with one object.
type ConvergeAction string

const (
	// Reverted: fields set by the abandoned revision were set back.
	ActionReverted ConvergeAction = "reverted"
	// Deleted: an object only the abandoned revision created was deleted.
	ActionDeleted ConvergeAction = "deleted"
	// InSync: the object needed no write (its renderings are equal, or the
	// patch was empty, or it is already gone).
	ActionInSync ConvergeAction = "in-sync"
	// Kept: the object was left alone on purpose; Reason says why.
	ActionKept ConvergeAction = "kept"
	// Deferred: an object only the abandoned revision rendered, left in
	// place until the operation recovery precedes has written its revision
	// (ConvergeOptions.DeferRemovals, RemoveDeferred).
	ActionDeferred ConvergeAction = "deferred"
	// Failed: the object could not be converged; Reason has the error.
	ActionFailed ConvergeAction = "failed"
)

// ObjectResult is the outcome for one object.
type ObjectResult struct {
	Object ObjectRef
	Action ConvergeAction
	Reason string
}

// ConvergeReport tells what Converge did.
type ConvergeReport struct {
	Release, Namespace string
	// Abandoned and Base are the revision numbers; Base is 0 when no
	// revision is deployed.
	Abandoned, Base int
	Method          ApplyMethod
	// Skipped, when set, says why nothing was compared at all.
	Skipped string
	Objects []ObjectResult
	// Deferred are the objects left for RemoveDeferred (ActionDeferred);
	// nil when none are.
	Deferred *Deferred
	// After is set on RemoveDeferred's report: the revision whose manifest
	// decided what was removed.
	After int
	// DryRun: nothing was written; reverted and deleted say what a real
	// run would do (ConvergeOptions.DryRun).
	DryRun bool
	// Unpreviewed, in a dry run, says what could not be previewed (the
	// error), for Lines; empty when everything was.
	Unpreviewed string
}

// Lines tell, one per object, what converge did (or, in a dry run, would
// do) with every object it reverted, deleted, left in place, kept or
// failed on, with the reason; objects already in sync are left out. The
// recover command prints them for a dry run and a real run alike.
func (r ConvergeReport) Lines() []string {
	var out []string
	for _, o := range r.Objects {
		var what string
		switch o.Action {
		case ActionInSync:
			continue
		case ActionReverted:
			what = fmt.Sprintf("reverted to revision %d", r.Base)
			if r.After > 0 {
				what = fmt.Sprintf("fields only revision %d set removed, as revision %d renders it", r.Abandoned, r.After)
			}
		case ActionDeleted:
			what = fmt.Sprintf("deleted (only revision %d rendered it)", r.Abandoned)
		case ActionDeferred:
			what = fmt.Sprintf("left in place (only revision %d rendered it)", r.Abandoned)
		case ActionKept:
			what = string(o.Action)
		case ActionFailed:
			what = "failed"
			if r.DryRun {
				what = "not previewed"
			}
		}
		if r.DryRun && o.Action != ActionFailed {
			what = "would be " + what
		}
		if o.Reason != "" {
			what += ": " + o.Reason
		}
		out = append(out, o.Object.String()+": "+what)
	}
	if r.Unpreviewed != "" {
		out = append(out, "(not previewed in full: "+r.Unpreviewed+")")
	}
	return out
}

// Changed reports whether Converge wrote anything.
func (r ConvergeReport) Changed() bool {
	for _, o := range r.Objects {
		if o.Action == ActionReverted || o.Action == ActionDeleted {
			return true
		}
	}
	return false
}

// Notable reports whether the report is worth showing: something was
// written, kept on purpose, or failed.
func (r ConvergeReport) Notable() bool {
	for _, o := range r.Objects {
		if o.Action != ActionInSync {
			return true
		}
	}
	return false
}

// Summary is one line for people: what was reverted, deleted and kept.
func (r ConvergeReport) Summary() string {
	subject := fmt.Sprintf("release %q in namespace %q", r.Release, r.Namespace)
	if r.Skipped != "" {
		return fmt.Sprintf("%s: revision %d left as it is: %s", subject, r.Abandoned, r.Skipped)
	}
	var parts []string
	for _, a := range []ConvergeAction{ActionReverted, ActionDeleted, ActionDeferred, ActionKept, ActionFailed} {
		var items []string
		for _, o := range r.Objects {
			if o.Action != a {
				continue
			}
			s := o.Object.String()
			if o.Reason != "" && a != ActionReverted && a != ActionDeleted && a != ActionDeferred {
				s += " (" + o.Reason + ")"
			}
			items = append(items, s)
		}
		if len(items) > 0 {
			parts = append(parts, string(a)+" "+strings.Join(items, ", "))
		}
	}
	if r.After > 0 {
		if len(parts) == 0 {
			parts = append(parts, "nothing to remove")
		}
		return fmt.Sprintf("%s: what only abandoned revision %d rendered, settled against revision %d: %s",
			subject, r.Abandoned, r.After, strings.Join(parts, "; "))
	}
	if len(parts) == 0 {
		parts = append(parts, "nothing to undo")
	}
	if r.Deferred != nil {
		parts = append(parts, "the objects left in place are removed once the next upgrade or install has written its revision, unless it renders them again")
	}
	return fmt.Sprintf("%s: undid what abandoned revision %d applied, back to deployed revision %d (%s apply): %s",
		subject, r.Abandoned, r.Base, methodName(r.Method), strings.Join(parts, "; "))
}

func methodName(m ApplyMethod) string {
	if m == ServerSideApply {
		return "server-side"
	}
	return "client-side"
}

// ReasonKindNotServed: an object the abandoned revision rendered whose kind
// the cluster does not serve (its CRD is gone): nothing to undo, and
// nothing helm's rollback can build.
const ReasonKindNotServed = "its kind is not served by the cluster"

// HeldBack lists the objects a helm rollback run after this converge would
// delete or rewrite against recovery's keep rules: those converge kept on
// purpose for a reason helm does not honour (every reason but
// ReasonPolicyKeep, an exact keep on the live object), and those it
// deferred (ConvergeOptions.DeferRemovals: the operation that follows
// decides whether they stay, and a rollback first would delete them).
func (r ConvergeReport) HeldBack() []ObjectRef {
	var out []ObjectRef
	for _, o := range r.Objects {
		switch {
		case o.Action == ActionKept && o.Reason != ReasonPolicyKeep, o.Action == ActionDeferred,
			o.Reason == ReasonKindNotServed: // helm's rollback fails on it, after writing its revision
			out = append(out, o.Object)
		}
	}
	return out
}

// ObjectList names objects for people: "Kind ns/name, Kind ns/name".
func ObjectList(objs []ObjectRef) string {
	names := make([]string, 0, len(objs))
	for _, o := range objs {
		names = append(names, o.String())
	}
	return strings.Join(names, ", ")
}
