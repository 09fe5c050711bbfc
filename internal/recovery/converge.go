package recovery

// Convergence: undoing what an abandoned revision applied.
//
// A revision abandoned while pending may have applied part or all of its
// manifest before its client died: changed fields of existing objects, and
// new objects. Marking it failed does not undo any of that, and helm's next
// upgrade does not either: it diffs the new revision against the last
// *deployed* revision, so a field that only the abandoned revision set (a
// nodeSelector that leaves a Deployment unschedulable) survives a
// client-side apply, and an object that only the abandoned revision created
// survives any apply method. Converge brings the live objects back to the
// last deployed revision, for exactly what the abandoned revision touched,
// before the requested operation runs; that operation then starts from the
// state its diff assumes, and afterwards the live objects match the revision
// it writes.
//
// The rules:
//
//   - An object in both manifests whose rendering differs between the two
//     revisions is reverted to the last deployed rendering, with the apply
//     method the abandoned revision used (ConvergeMethod). Client-side: a
//     three-way patch with original = the abandoned revision's object,
//     modified = the last deployed object, current = the live object (the
//     patch helm's own client-side update computes, with the abandoned
//     revision as the original); fields the abandoned revision added are
//     removed, fields it changed are set back, changes made by other writers
//     to fields neither revision mentions stay. Server-side: the last
//     deployed object is applied under the field manager "helm", without
//     forcing conflicts, exactly as helm applies it; fields that only the
//     abandoned revision's apply owned are removed by the API server.
//     Objects whose two renderings are equal are not written at all.
//   - An object only in the abandoned revision is deleted when it is live,
//     carries this release's ownership metadata (annotations
//     meta.helm.sh/release-name and meta.helm.sh/release-namespace naming
//     this release, and label app.kubernetes.io/managed-by=Helm, helm's own
//     test of ownership), has no helm.sh/resource-policy: keep (on the live
//     object or in the manifest), and was created by the abandoned revision:
//     its server-set creationTimestamp is not before the server-set
//     creationTimestamp of the abandoned revision's Secret, and, when both
//     fall in the same second, no field manager but helm's wrote it (status
//     writes aside). An object that existed before (adopted with
//     --take-ownership, or kept from an older revision) is left alone,
//     because its earlier state is unknown.
//   - An object that is not owned by this release is never written, whether
//     it is in one manifest or both.
//   - An object only in the last deployed revision (the abandoned revision
//     may have deleted it) is not recreated: helm's next upgrade creates
//     every object of the new revision that is missing, and recreating one
//     the new revision drops would only churn.
//   - Every write is conditional on the resourceVersion read (patches and
//     applies carry metadata.resourceVersion, deletes carry UID and
//     resourceVersion preconditions); on a conflict the object is read again
//     and decided again, a few times, never overwritten blindly.
//
// Hooks of the abandoned revision are not in its manifest and are not
// touched; helm's hook delete policies handle them on the next run.
//
// No deployed revision (an abandoned pending-install, or a history with no
// deployed revision left): Converge does nothing. Helm's own next operation
// already converges in that case: `upgrade` (and `upgrade --install`) diffs
// against the latest revision when none is deployed, which is the abandoned
// one, so it removes the fields and deletes the objects the abandoned
// revision applied and the new one does not ask for; `rollback` and
// `uninstall` diff against, or delete, the latest revision's manifest too.
// Deleting the abandoned install's objects ahead of that would make
// Deployments and volumes churn through a delete and a recreate for nothing.
// (`install --replace` adopts the owned objects, as after any failed install
// of stock helm.)
//
// Only upgrade and install need Converge: rollback and uninstall take the
// latest revision, the abandoned one, as their base already, and converging
// to the last deployed revision first could even hide from a rollback's
// three-way patch a field it must remove.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/jsonmergepatch"
	"k8s.io/apimachinery/pkg/util/mergepatch"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// Helm's ownership metadata and resource policy.
const (
	AnnotationReleaseName      = "meta.helm.sh/release-name"
	AnnotationReleaseNamespace = "meta.helm.sh/release-namespace"
	LabelManagedBy             = "app.kubernetes.io/managed-by"
	ManagedByHelm              = "Helm"
	AnnotationResourcePolicy   = "helm.sh/resource-policy"
	ResourcePolicyKeep         = "keep"

	// HelmFieldManager is the field manager stock helm 3 and 4, and this
	// tool, write objects under.
	HelmFieldManager = "helm"
)

// ApplyMethod is how a revision wrote its objects.
type ApplyMethod string

const (
	ClientSideApply ApplyMethod = ApplyMethod(rspb.ApplyMethodClientSideApply)
	ServerSideApply ApplyMethod = ApplyMethod(rspb.ApplyMethodServerSideApply)
)

// ConvergeMethod is the apply method to converge with: the one the
// abandoned revision used, since it made the changes to undo. Helm 4 records
// it in the release ("apply_method"); an empty value (every revision written
// by helm 3, and helm 4 revisions of releases first installed by helm 3) is
// client-side, as helm itself reads it. Helm's next upgrade with the default
// --server-side=auto picks the same method, from the same latest revision.
func ConvergeMethod(abandoned *rspb.Release) ApplyMethod {
	if abandoned != nil && abandoned.ApplyMethod == string(rspb.ApplyMethodServerSideApply) {
		return ServerSideApply
	}
	return ClientSideApply
}

// Kube is the cluster access Converge needs: a dynamic client and a REST
// mapper for the kinds in the manifests.
type Kube struct {
	Dynamic dynamic.Interface
	Mapper  meta.RESTMapper
}

// NewKube builds the cluster access from a REST configuration (helm's).
func NewKube(cfg *rest.Config) (*Kube, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	return &Kube{Dynamic: dyn, Mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}, nil
}

// ConvergeInput is what Converge compares.
type ConvergeInput struct {
	// Abandoned is the revision that was abandoned (already marked failed).
	Abandoned *rspb.Release
	// AbandonedCreated is the server-set creationTimestamp of the abandoned
	// revision's Secret: objects created before it were not created by that
	// revision and are never deleted. Zero means unknown: then nothing is
	// deleted.
	AbandonedCreated time.Time
	// Base is the last deployed revision, the state to converge to; nil
	// when there is none (see the package notes: nothing is done).
	Base *rspb.Release
}

// ConvergeOptions tune Converge; the zero value is what the CLI uses.
type ConvergeOptions struct {
	// FieldManager writes under this manager; empty means "helm", the one
	// stock helm and this tool use, which server-side apply needs to remove
	// fields the abandoned revision's apply owns.
	FieldManager string
	// BeforeWrite, when set, is called before every write; an error stops
	// Converge at once (fencing: a holder that lost its lock writes nothing
	// more).
	BeforeWrite func() error
}

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
	for _, a := range []ConvergeAction{ActionReverted, ActionDeleted, ActionKept, ActionFailed} {
		var items []string
		for _, o := range r.Objects {
			if o.Action != a {
				continue
			}
			s := o.Object.String()
			if o.Reason != "" && a != ActionReverted && a != ActionDeleted {
				s += " (" + o.Reason + ")"
			}
			items = append(items, s)
		}
		if len(items) > 0 {
			parts = append(parts, string(a)+" "+strings.Join(items, ", "))
		}
	}
	if len(parts) == 0 {
		parts = append(parts, "nothing to undo")
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

// ConvergeAbandoned loads the abandoned revision and the last deployed one
// from helm's records in namespace abandoned.RecordNamespace and converges.
// Call it after MarkFailed succeeded on abandoned (the Summary from the
// recovery decision), while still holding the lock, and before helm's own
// upgrade or install runs.
//
// An abandoned uninstall (status uninstalling when it was found) is left
// alone: it applied nothing, it only deleted, and helm's next operation
// works from that same revision.
func ConvergeAbandoned(ctx context.Context, cfg *rest.Config, records helmx.Records, abandoned helmx.Summary, opts ConvergeOptions) (ConvergeReport, error) {
	if abandoned.Status == common.StatusUninstalling {
		return ConvergeReport{
			Release: abandoned.Name, Namespace: abandoned.Namespace, Abandoned: abandoned.Revision,
			Skipped: "an interrupted uninstall applies nothing, and helm's next operation works from this revision itself",
		}, nil
	}
	in, err := LoadConvergeInput(ctx, records, abandoned)
	if err != nil {
		return ConvergeReport{Release: abandoned.Name, Namespace: abandoned.Namespace, Abandoned: abandoned.Revision}, err
	}
	if in.Base == nil {
		return Converge(ctx, nil, in, opts)
	}
	kc, err := NewKube(cfg)
	if err != nil {
		return ConvergeReport{Release: abandoned.Name, Namespace: abandoned.Namespace, Abandoned: abandoned.Revision},
			fmt.Errorf("converging release %q in namespace %q: %w", abandoned.Name, abandoned.Namespace, err)
	}
	return Converge(ctx, kc, in, opts)
}

// LoadConvergeInput reads the abandoned revision and the revision helm's
// next upgrade diffs against: the highest-numbered deployed revision, as
// helm's storage picks it (nil when none is deployed).
func LoadConvergeInput(ctx context.Context, records helmx.Records, abandoned helmx.Summary) (ConvergeInput, error) {
	ns := abandoned.RecordNamespace
	if ns == "" {
		ns = abandoned.Namespace
	}
	subject := fmt.Sprintf("converging release %q in namespace %q", abandoned.Name, ns)
	list, _, err := records.List(ctx, ns, helmx.HistorySelector(abandoned.Name))
	if err != nil {
		return ConvergeInput{}, fmt.Errorf("%s: reading history: %w", subject, err)
	}
	var in ConvergeInput
	baseRev := 0
	for _, r := range list {
		sum, err := helmx.SummarizeRecord(r)
		if err != nil {
			return ConvergeInput{}, fmt.Errorf("%s: %w", subject, err)
		}
		switch {
		case r.Meta.Name == abandoned.RecordName || (abandoned.RecordName == "" && sum.Revision == abandoned.Revision):
			if in.Abandoned, err = decodeRelease(r.Payload); err != nil {
				return ConvergeInput{}, fmt.Errorf("%s: %s: %w", subject, r.Describe(), err)
			}
			in.AbandonedCreated = r.Meta.CreationTimestamp.Time
		case sum.Status == common.StatusDeployed && sum.Revision > baseRev:
			baseRev = sum.Revision
			if in.Base, err = decodeRelease(r.Payload); err != nil {
				return ConvergeInput{}, fmt.Errorf("%s: %s: %w", subject, r.Describe(), err)
			}
		}
	}
	if in.Abandoned == nil {
		return ConvergeInput{}, fmt.Errorf("%s: revision %d is gone from the history", subject, abandoned.Revision)
	}
	// Releases stored without a namespace live in their Secret's.
	for _, r := range []*rspb.Release{in.Abandoned, in.Base} {
		if r != nil && r.Namespace == "" {
			r.Namespace = ns
		}
	}
	return in, nil
}

func decodeRelease(data []byte) (*rspb.Release, error) {
	doc, err := helmx.DecodeReleaseJSON(data)
	if err != nil {
		return nil, err
	}
	var r rspb.Release
	if err := json.Unmarshal(doc, &r); err != nil {
		return nil, fmt.Errorf("the release JSON does not match Helm's layout: %w", err)
	}
	return &r, nil
}

// Converge brings the live objects the abandoned revision touched back to
// the base revision (see the package notes for the exact rules). It goes on
// past an object it cannot converge and returns every such failure joined,
// with the report of what it did; it stops at once when opts.BeforeWrite
// fails. kc may be nil only when in.Base is nil.
func Converge(ctx context.Context, kc *Kube, in ConvergeInput, opts ConvergeOptions) (ConvergeReport, error) {
	if in.Abandoned == nil {
		return ConvergeReport{}, errors.New("converging: no abandoned revision given")
	}
	ab := in.Abandoned
	rep := ConvergeReport{Release: ab.Name, Namespace: ab.Namespace, Abandoned: ab.Version, Method: ConvergeMethod(ab)}
	subject := fmt.Sprintf("converging release %q in namespace %q", ab.Name, ab.Namespace)
	if in.Base == nil {
		rep.Skipped = "no revision is deployed, so helm's next upgrade diffs against the abandoned revision itself and removes what it applied"
		return rep, nil
	}
	rep.Base = in.Base.Version
	if in.Base.Version >= ab.Version {
		rep.Skipped = fmt.Sprintf("deployed revision %d is not older than the abandoned one", in.Base.Version)
		return rep, nil
	}
	if kc == nil {
		return rep, fmt.Errorf("%s: no cluster access given", subject)
	}
	c := &converger{kc: kc, in: in, opts: opts, rep: &rep, release: ab.Name, ns: ab.Namespace}
	if c.opts.FieldManager == "" {
		c.opts.FieldManager = HelmFieldManager
	}

	abObjs, err := parseManifest(ab.Manifest)
	if err != nil {
		return rep, fmt.Errorf("%s: manifest of revision %d: %w", subject, ab.Version, err)
	}
	baseObjs, err := parseManifest(in.Base.Manifest)
	if err != nil {
		return rep, fmt.Errorf("%s: manifest of revision %d: %w", subject, in.Base.Version, err)
	}
	abRes, abErrs := c.resolveAll(abObjs)
	baseRes, baseErrs := c.resolveAll(baseObjs)
	errs := append(append([]error{}, abErrs...), baseErrs...)
	p := plan(abRes, baseRes)

	for _, pr := range p.Both {
		if err := c.revert(ctx, pr.Abandoned, pr.Base); err != nil {
			if errors.Is(err, ErrFenced) {
				return rep, fmt.Errorf("%s: %w", subject, err)
			}
			errs = append(errs, err)
		}
	}
	for _, o := range p.OnlyAbandoned {
		if err := c.remove(ctx, o); err != nil {
			if errors.Is(err, ErrFenced) {
				return rep, fmt.Errorf("%s: %w", subject, err)
			}
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return rep, fmt.Errorf("%s from abandoned revision %d back to revision %d: %w", subject, ab.Version, in.Base.Version, errors.Join(errs...))
	}
	return rep, nil
}

// ErrFenced wraps the error of ConvergeOptions.BeforeWrite when it stopped
// Converge; the error returned wraps both.
var ErrFenced = errors.New("stopped before writing")

// maxAttempts bounds the read-decide-write loop of one object under
// conflicting writers.
const maxAttempts = 5

type converger struct {
	kc      *Kube
	in      ConvergeInput
	opts    ConvergeOptions
	rep     *ConvergeReport
	release string
	ns      string
}

// resolved is one manifest object with its REST mapping and namespace.
type resolved struct {
	obj     *unstructured.Unstructured
	mapping *meta.RESTMapping // nil when the kind is not served
	ref     ObjectRef
}

func (r resolved) key() objKey {
	return keyOf(r.obj.GroupVersionKind().GroupKind(), r.ref.Namespace, r.ref.Name)
}

func (c *converger) resolveAll(objs []*unstructured.Unstructured) ([]resolved, []error) {
	out := make([]resolved, 0, len(objs))
	var errs []error
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		r := resolved{obj: o, ref: ObjectRef{APIVersion: o.GetAPIVersion(), Kind: o.GetKind(), Name: o.GetName()}}
		m, err := c.kc.Mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		switch {
		case meta.IsNoMatchError(err):
			// Not served: no such object can exist. The namespace only
			// matters for matching, so assume helm's default.
			r.ref.Namespace = objNamespace(o, true, c.ns)
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: mapping %s: %w", r.ref, gvk, err))
			continue
		default:
			r.mapping = m
			r.ref.Namespace = objNamespace(o, m.Scope.Name() == meta.RESTScopeNameNamespace, c.ns)
		}
		out = append(out, r)
	}
	return out, errs
}

// objNamespace is the namespace helm writes an object to: its own, or the
// release's when it names none; none for cluster-scoped kinds.
func objNamespace(o *unstructured.Unstructured, namespaced bool, releaseNS string) string {
	if !namespaced {
		return ""
	}
	if ns := o.GetNamespace(); ns != "" {
		return ns
	}
	return releaseNS
}

func (c *converger) resource(r resolved) dynamic.ResourceInterface {
	if r.ref.Namespace == "" {
		return c.kc.Dynamic.Resource(r.mapping.Resource)
	}
	return c.kc.Dynamic.Resource(r.mapping.Resource).Namespace(r.ref.Namespace)
}

func (c *converger) record(ref ObjectRef, a ConvergeAction, reason string) {
	c.rep.Objects = append(c.rep.Objects, ObjectResult{Object: ref, Action: a, Reason: reason})
}

func (c *converger) fence() error {
	if c.opts.BeforeWrite == nil {
		return nil
	}
	if err := c.opts.BeforeWrite(); err != nil {
		return fmt.Errorf("%w: %w", ErrFenced, err)
	}
	return nil
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
		c.record(ref, ActionKept, "its kind is not served by the cluster")
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
					return fmt.Errorf("%s: reverting it to revision %d (dry run): %w", ref, c.rep.Base, err)
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
		if err := c.fence(); err != nil {
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
			return fmt.Errorf("%s: reverting it to revision %d: %w", ref, c.rep.Base, err)
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
		c.record(ref, ActionInSync, "its kind is not served by the cluster")
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
		if why := keepReason(live, ab.obj, c.release, c.ns, c.in.AbandonedCreated); why != "" {
			c.record(ref, ActionKept, why)
			return nil
		}
		if err := c.fence(); err != nil {
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

// --- pure parts ---

// objKey identifies an object across revisions as helm matches them: group,
// kind, namespace and name (not the version).
type objKey struct {
	Group, Kind, Namespace, Name string
}

func keyOf(gk schema.GroupKind, ns, name string) objKey {
	return objKey{Group: gk.Group, Kind: gk.Kind, Namespace: ns, Name: name}
}

type pair struct{ Abandoned, Base resolved }

type convergePlan struct {
	// Both: objects in both manifests, in the base manifest's order.
	Both []pair
	// OnlyAbandoned: objects only the abandoned revision renders, in reverse
	// manifest order (helm installs in kind order; deleting in reverse puts
	// dependants before what they depend on).
	OnlyAbandoned []resolved
}

func plan(abandoned, base []resolved) convergePlan {
	var p convergePlan
	inBase := map[objKey]bool{}
	abByKey := map[objKey]resolved{}
	for _, a := range abandoned {
		abByKey[a.key()] = a
	}
	for _, b := range base {
		k := b.key()
		inBase[k] = true
		if a, ok := abByKey[k]; ok {
			p.Both = append(p.Both, pair{Abandoned: a, Base: b})
		}
	}
	for _, a := range slices.Backward(abandoned) {
		if !inBase[a.key()] {
			p.OnlyAbandoned = append(p.OnlyAbandoned, a)
		}
	}
	return p
}

// parseManifest splits a release manifest into objects, dropping empty
// documents and flattening List kinds as helm's builder does.
func parseManifest(manifest string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	var out []*unstructured.Unstructured
	for i := 0; ; i++ {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("document %d has no apiVersion or kind", i+1)
		}
		if u.IsList() {
			list, err := u.ToList()
			if err != nil {
				return nil, fmt.Errorf("document %d: %w", i+1, err)
			}
			for j := range list.Items {
				out = append(out, &list.Items[j])
			}
			continue
		}
		if u.GetName() == "" {
			return nil, fmt.Errorf("document %d (%s) has no name", i+1, u.GetKind())
		}
		out = append(out, u)
	}
}

func sameObject(a, b *unstructured.Unstructured) bool {
	ja, err1 := json.Marshal(a.Object)
	jb, err2 := json.Marshal(b.Object)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}

// withOwnership is the object as helm wrote it: rendered, plus the
// ownership label and annotations helm adds to every object of a release.
func withOwnership(o *unstructured.Unstructured, release, ns string) *unstructured.Unstructured {
	c := o.DeepCopy()
	labels := c.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelManagedBy] = ManagedByHelm
	c.SetLabels(labels)
	ann := c.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[AnnotationReleaseName] = release
	ann[AnnotationReleaseNamespace] = ns
	c.SetAnnotations(ann)
	return c
}

// notOwned says why live does not belong to the release, or "" when it does
// (helm's own test: managed-by label and both annotations).
func notOwned(live *unstructured.Unstructured, release, ns string) string {
	ann := live.GetAnnotations()
	switch {
	case ann[AnnotationReleaseName] != release:
		return fmt.Sprintf("not owned by this release: annotation %s is %q", AnnotationReleaseName, ann[AnnotationReleaseName])
	case ann[AnnotationReleaseNamespace] != ns:
		return fmt.Sprintf("not owned by this release: annotation %s is %q", AnnotationReleaseNamespace, ann[AnnotationReleaseNamespace])
	case live.GetLabels()[LabelManagedBy] != ManagedByHelm:
		return fmt.Sprintf("not owned by this release: label %s is %q", LabelManagedBy, live.GetLabels()[LabelManagedBy])
	}
	return ""
}

func hasKeepPolicy(o *unstructured.Unstructured) bool {
	return strings.EqualFold(strings.TrimSpace(o.GetAnnotations()[AnnotationResourcePolicy]), ResourcePolicyKeep)
}

// keepReason says why an object only the abandoned revision renders must
// not be deleted, or "" when it may be.
func keepReason(live, rendered *unstructured.Unstructured, release, ns string, abandonedCreated time.Time) string {
	if why := notOwned(live, release, ns); why != "" {
		return why
	}
	if hasKeepPolicy(live) || hasKeepPolicy(rendered) {
		return AnnotationResourcePolicy + ": " + ResourcePolicyKeep
	}
	if abandonedCreated.IsZero() {
		return "the abandoned revision's creation time is unknown"
	}
	// Both timestamps are the API server's, in whole seconds.
	created := live.GetCreationTimestamp().Time
	if created.Before(abandonedCreated) {
		return fmt.Sprintf("it existed before the abandoned revision (created %s, revision written %s)",
			created.UTC().Format(time.RFC3339), abandonedCreated.UTC().Format(time.RFC3339))
	}
	// In the same second, the order is unknown (helm writes the revision
	// before it applies anything, but a user may have created the object a
	// moment before and let the revision adopt it). An object helm created
	// has been written by helm's field manager only (controllers' status
	// writes aside); one written by another manager too may have existed
	// before, and deleting it could lose data.
	if created.Equal(abandonedCreated) {
		for _, mf := range live.GetManagedFields() {
			if mf.Manager != HelmFieldManager && mf.Subresource == "" {
				return fmt.Sprintf("it was created in the same second as the abandoned revision (%s) and also written by field manager %q, so it may have existed before",
					created.UTC().Format(time.RFC3339), mf.Manager)
			}
		}
	}
	return ""
}

// threeWayPatch is the client-side revert: the patch that takes live from
// original to modified, keeping other writers' changes to fields neither
// mentions; nil when applying it would change nothing. Kinds compiled into client-go get a strategic merge patch, any
// other kind (custom resources) a JSON merge patch, as helm's client-side
// update does.
func threeWayPatch(original, modified, live *unstructured.Unstructured) ([]byte, types.PatchType, error) {
	o, err := json.Marshal(original.Object)
	if err != nil {
		return nil, "", err
	}
	m, err := json.Marshal(modified.Object)
	if err != nil {
		return nil, "", err
	}
	cur, err := json.Marshal(live.Object)
	if err != nil {
		return nil, "", err
	}
	pre := []mergepatch.PreconditionFunc{
		mergepatch.RequireKeyUnchanged("apiVersion"),
		mergepatch.RequireKeyUnchanged("kind"),
		mergepatch.RequireMetadataKeyUnchanged("name"),
	}
	typed, err := scheme.Scheme.New(modified.GroupVersionKind())
	if err != nil {
		// A no-op merge patch is caught after the write: the
		// resourceVersion does not move.
		p, err := jsonmergepatch.CreateThreeWayJSONMergePatch(o, m, cur, pre...)
		if err != nil || isEmptyPatch(p) {
			return nil, types.MergePatchType, err
		}
		return p, types.MergePatchType, nil
	}
	pm, err := strategicpatch.NewPatchMetaFromStruct(typed)
	if err != nil {
		return nil, "", err
	}
	p, err := strategicpatch.CreateThreeWayMergePatch(o, m, cur, pm, true, pre...)
	if err != nil || isEmptyPatch(p) {
		return nil, types.StrategicMergePatchType, err
	}
	// A patch that only deletes fields the live object lacks changes
	// nothing: write nothing, and report the object in sync.
	after, err := strategicpatch.StrategicMergePatch(cur, p, typed)
	if err != nil {
		return nil, "", err
	}
	if sameJSON(cur, after) {
		return nil, types.StrategicMergePatchType, nil
	}
	return p, types.StrategicMergePatchType, nil
}

// isEmptyPatch reports a patch that changes nothing.
func isEmptyPatch(p []byte) bool {
	s := strings.TrimSpace(string(p))
	return s == "" || s == "{}" || s == "null"
}

func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// withResourceVersion adds metadata.resourceVersion to a merge patch, which
// makes the API server apply it only to that version.
func withResourceVersion(patch []byte, rv string) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(patch, &m); err != nil {
		return nil, err
	}
	md, _ := m["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
	}
	md["resourceVersion"] = rv
	m["metadata"] = md
	return json.Marshal(m)
}

// applyBody is the server-side apply configuration: the object, with the
// resourceVersion read as a precondition (it is not a managed field).
func applyBody(o *unstructured.Unstructured, rv string) ([]byte, error) {
	c := o.DeepCopy()
	c.SetResourceVersion(rv)
	return json.Marshal(c.Object)
}
