package recovery

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// maxAttempts bounds the read-decide-write loop of one object under
// conflicting writers.
const maxAttempts = 5

func (c *converger) resource(r resolved) dynamic.ResourceInterface {
	if r.ref.Namespace == "" {
		return c.kc.Dynamic.Resource(r.mapping.Resource)
	}
	return c.kc.Dynamic.Resource(r.mapping.Resource).Namespace(r.ref.Namespace)
}

// revert sets the fields the abandoned revision changed on one object back
// to the base revision's.
func (c *converger) revert(ctx context.Context, ab, base resolved) error {
	ref := base.ref
	if sameObject(ab.obj, base.obj) {
		c.record(ref, ActionInSync, "the abandoned revision renders it unchanged")
		return nil
	}
	if base.mapping == nil {
		c.record(ref, ActionKept, ReasonKindNotServed)
		return nil
	}
	original := withOwnership(ab.obj, c.release, c.ns)
	modified := withOwnership(base.obj, c.release, c.ns)
	res := c.resource(base)
	for attempt := 0; attempt < maxAttempts; attempt++ {
		live, err := res.Get(ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			c.record(ref, ActionInSync, "it is gone; helm's next operation creates it if the new revision has it")
			return nil
		}
		if err != nil {
			c.record(ref, ActionFailed, err.Error())
			return fmt.Errorf("%s: reading it: %w", ref, err)
		}
		if why := notOwned(live, c.release, c.ns); why != "" {
			c.record(ref, ActionKept, why)
			return nil
		}
		if why := revertLoses(live, base.obj); why != "" && !c.opts.DeleteData {
			c.record(ref, ActionKept, why+"; recovery reverts it only with --recover-delete-data")
			return nil
		}
		var pt types.PatchType
		var body []byte
		var opts metav1.PatchOptions
		if ConvergeMethod(c.in.Abandoned) == ServerSideApply {
			pt = types.ApplyPatchType
			body, err = applyBody(modified, live.GetResourceVersion())
			opts = metav1.PatchOptions{FieldManager: c.opts.FieldManager, Force: new(bool)}
			if err == nil {
				// A dry run first: an apply that would change nothing is
				// not sent, so it needs no fence and is reported in sync.
				var same bool
				same, err = c.applyIsNoop(ctx, res, ref.Name, body, opts, live)
				switch {
				case err == nil && same:
					c.record(ref, ActionInSync, "no field differs")
					return nil
				case apierrors.IsConflict(err) && isStale(err):
					continue
				case apierrors.IsNotFound(err):
					c.record(ref, ActionInSync, "it is gone; helm's next operation creates it if the new revision has it")
					return nil
				case err != nil:
					c.record(ref, ActionFailed, err.Error())
					return fmt.Errorf("%s: reverting it to revision %d (dry run): %w", ref, c.target(), err)
				}
			}
		} else {
			var patch []byte
			patch, pt, err = threeWayPatch(original, modified, live)
			if err == nil && patch == nil {
				c.record(ref, ActionInSync, "no field differs")
				return nil
			}
			if err == nil {
				body, err = withResourceVersion(patch, live.GetResourceVersion())
			}
			opts = metav1.PatchOptions{FieldManager: c.opts.FieldManager}
		}
		if err != nil {
			c.record(ref, ActionFailed, err.Error())
			return fmt.Errorf("%s: computing the revert: %w", ref, err)
		}
		if err := c.fence(); errors.Is(err, errDryRun) {
			c.record(ref, ActionReverted, "")
			return nil
		} else if err != nil {
			return err
		}
		out, err := res.Patch(ctx, ref.Name, pt, body, opts)
		switch {
		case err == nil && out.GetResourceVersion() == live.GetResourceVersion():
			c.record(ref, ActionInSync, "no field differs")
			return nil
		case err == nil:
			c.record(ref, ActionReverted, "")
			return nil
		case apierrors.IsConflict(err) && isStale(err):
			continue // someone wrote it since it was read: read and decide again
		case apierrors.IsNotFound(err):
			c.record(ref, ActionInSync, "it is gone; helm's next operation creates it if the new revision has it")
			return nil
		default:
			c.record(ref, ActionFailed, err.Error())
			return fmt.Errorf("%s: reverting it to revision %d: %w", ref, c.target(), err)
		}
	}
	c.record(ref, ActionFailed, "other writers kept changing it")
	return fmt.Errorf("%s: other writers kept changing it; not reverted", ref)
}

// applyIsNoop dry-runs a server-side apply and reports whether it would
// leave the object as live is (field ownership aside).
func (c *converger) applyIsNoop(ctx context.Context, res dynamic.ResourceInterface, name string, body []byte, opts metav1.PatchOptions, live *unstructured.Unstructured) (bool, error) {
	opts.DryRun = []string{metav1.DryRunAll}
	out, err := res.Patch(ctx, name, types.ApplyPatchType, body, opts)
	if err != nil {
		return false, err
	}
	return reflect.DeepEqual(comparable(out), comparable(live)), nil
}

// comparable is the object without the metadata every write moves.
func comparable(o *unstructured.Unstructured) map[string]any {
	c := o.DeepCopy()
	unstructured.RemoveNestedField(c.Object, "metadata", "managedFields")
	unstructured.RemoveNestedField(c.Object, "metadata", "resourceVersion")
	unstructured.RemoveNestedField(c.Object, "metadata", "generation")
	return c.Object
}

// isStale tells a resourceVersion precondition failure from a server-side
// apply field conflict (both are 409 Conflict).
func isStale(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return false
	}
	if d := st.Status().Details; d != nil {
		for _, c := range d.Causes {
			if c.Type == metav1.CauseTypeFieldManagerConflict {
				return false
			}
		}
	}
	return true
}

// remove deletes one object only the abandoned revision has, when the rules
// allow it.
func (c *converger) remove(ctx context.Context, ab resolved) error {
	ref := ab.ref
	if ab.mapping == nil {
		c.record(ref, ActionInSync, ReasonKindNotServed)
		return nil
	}
	res := c.resource(ab)
	for attempt := 0; attempt < maxAttempts; attempt++ {
		live, err := res.Get(ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			c.record(ref, ActionInSync, "not present")
			return nil
		}
		if err != nil {
			c.record(ref, ActionFailed, err.Error())
			return fmt.Errorf("%s: reading it: %w", ref, err)
		}
		if why := keepReason(live, ab.obj, c.release, c.ns, c.in.AbandonedCreated, c.opts.DeleteData); why != "" {
			c.record(ref, ActionKept, why)
			return nil
		}
		if !c.opts.DeleteData {
			if c.cascade == nil {
				c.cascade = &cascadeGuard{kc: c.kc}
			}
			if why := c.cascade.reason(ctx, live); why != "" {
				c.record(ref, ActionKept, why+deleteDataHint)
				return nil
			}
		}
		if err := c.fence(); errors.Is(err, errDryRun) {
			c.record(ref, ActionDeleted, "")
			return nil
		} else if err != nil {
			return err
		}
		uid, rv := live.GetUID(), live.GetResourceVersion()
		policy := metav1.DeletePropagationBackground
		err = res.Delete(ctx, ref.Name, metav1.DeleteOptions{
			Preconditions:     &metav1.Preconditions{UID: &uid, ResourceVersion: &rv},
			PropagationPolicy: &policy,
		})
		switch {
		case err == nil:
			c.record(ref, ActionDeleted, "")
			return nil
		case apierrors.IsNotFound(err):
			c.record(ref, ActionInSync, "not present")
			return nil
		case apierrors.IsConflict(err):
			continue
		default:
			c.record(ref, ActionFailed, err.Error())
			return fmt.Errorf("%s: deleting it: %w", ref, err)
		}
	}
	c.record(ref, ActionFailed, "other writers kept changing it")
	return fmt.Errorf("%s: other writers kept changing it; not deleted", ref)
}
