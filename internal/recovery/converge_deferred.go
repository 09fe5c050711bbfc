package recovery

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	rspb "helm.sh/helm/v4/pkg/release/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
)

// Deferred are the objects only an abandoned revision rendered, left in
// place by a Converge that precedes an operation (ConvergeOptions.
// DeferRemovals): whether they go depends on the manifest that operation
// writes, which RemoveDeferred reads once it has run.
type Deferred struct {
	// Release and Namespace name the release; RecordNamespace is where its
	// records live (the release's namespace with helm's drivers).
	Release, Namespace, RecordNamespace string
	// Abandoned is the abandoned revision's number, AbandonedCreated the
	// server-set creationTimestamp of its record (see ConvergeInput).
	Abandoned        int
	AbandonedCreated time.Time
	// Objects are the abandoned revision's renderings, in the order they
	// are removed; Refs names them, in the same order.
	Objects []*unstructured.Unstructured
	Refs    []ObjectRef
	// DeleteData is the consent to delete what holds data
	// (--recover-delete-data) given by the recovery that left them, which
	// judged the revision abandoned: it, not the flag of the operation that
	// later removes them, decides (ConvergeOptions.DeleteData).
	DeleteData bool
}

// Names lists the objects for people: "ConfigMap shop/a, Service shop/b".
func (d *Deferred) Names() string {
	if d == nil {
		return ""
	}
	s := make([]string, 0, len(d.Refs))
	for _, r := range d.Refs {
		s = append(s, r.String())
	}
	return strings.Join(s, ", ")
}

// Empty reports whether nothing waits for removal.
func (d *Deferred) Empty() bool { return d == nil || len(d.Objects) == 0 }

// ErrNoNewRevision: the operation recovery preceded wrote no revision after
// the abandoned one, so nothing tells which of the deferred objects it would
// render; they are left in place.
var ErrNoNewRevision = errors.New("no revision was written after the abandoned one")

// deferAll records the objects only the abandoned revision rendered as
// deferred, in removal order, without reading or writing any of them.
func (c *converger) deferAll(objs []resolved, created time.Time) {
	d := &Deferred{
		Release: c.release, Namespace: c.ns, RecordNamespace: c.ns,
		Abandoned: c.rep.Abandoned, AbandonedCreated: created, DeleteData: c.opts.DeleteData,
	}
	for _, o := range objs {
		if o.mapping == nil {
			c.record(o.ref, ActionInSync, ReasonKindNotServed)
			continue
		}
		c.record(o.ref, ActionDeferred, "removed once the next upgrade or install has written its revision, unless that revision renders it again")
		d.Objects = append(d.Objects, o.obj)
		d.Refs = append(d.Refs, o.ref)
	}
	if !d.Empty() {
		c.rep.Deferred = d
	}
}

// refresh handles a deferred object the new revision renders again: it is
// never deleted; fields only the abandoned revision's rendering set are
// removed (revert, towards the new rendering), unless the object existed
// before the abandoned revision, whose earlier fields are unknown.
func (c *converger) refresh(ctx context.Context, ab, next resolved) error {
	again := fmt.Sprintf("revision %d renders it again", c.rep.After)
	if next.mapping == nil || sameObject(ab.obj, next.obj) {
		c.record(next.ref, ActionKept, again)
		return nil
	}
	live, err := c.resource(next).Get(ctx, next.ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		c.record(next.ref, ActionInSync, "not present")
		return nil
	case err != nil:
		c.record(next.ref, ActionFailed, err.Error())
		return fmt.Errorf("%s: reading it: %w", next.ref, err)
	case !c.in.AbandonedCreated.IsZero() && live.GetCreationTimestamp().Time.Before(c.in.AbandonedCreated):
		c.record(next.ref, ActionKept, again+"; it existed before the abandoned revision, so its fields are left as they are")
		return nil
	}
	n := len(c.rep.Objects)
	if err := c.revert(ctx, ab, next); err != nil {
		return err
	}
	if len(c.rep.Objects) > n && c.rep.Objects[n].Action == ActionInSync {
		c.rep.Objects[n] = ObjectResult{Object: next.ref, Action: ActionKept, Reason: again}
	}
	return nil
}

// RemoveDeferred removes the deferred objects that the revision written
// after the abandoned one (by the operation recovery preceded, successful or
// not) does not render, as helm removes what an upgrade drops: only objects
// the abandoned revision created and this release owns, never one with
// helm.sh/resource-policy: keep, and never what holds data unless
// d.DeleteData (opts.DeleteData is not read: the recovery that left them
// decided). An object
// that revision renders again is helm's: it adopted it, and it stays.
//
// It reads the release's newest record once. When that is not newer than
// the abandoned revision (the operation failed before writing one), nothing
// is written and the error wraps ErrNoNewRevision; the report names the
// objects left. Like Converge, it goes on past an object it cannot remove
// and stops at once when opts.BeforeWrite fails (the error wraps ErrFenced).
func RemoveDeferred(ctx context.Context, kube func() (*Kube, error), records helmx.Records, d *Deferred, opts ConvergeOptions) (ConvergeReport, error) {
	if d.Empty() {
		return ConvergeReport{}, nil
	}
	rep := ConvergeReport{Release: d.Release, Namespace: d.Namespace, Abandoned: d.Abandoned}
	subject := fmt.Sprintf("release %q in namespace %q: removing what only abandoned revision %d rendered", d.Release, d.Namespace, d.Abandoned)
	leave := func(reason string) {
		for _, r := range d.Refs {
			rep.Objects = append(rep.Objects, ObjectResult{Object: r, Action: ActionKept, Reason: reason})
		}
	}
	ns := d.RecordNamespace
	if ns == "" {
		ns = d.Namespace
	}
	rec, ok, _, err := records.Newest(ctx, ns, helmx.HistorySelector(d.Release))
	if err != nil {
		leave("the revision written after it could not be read")
		return rep, fmt.Errorf("%s: reading the revision written after it: %w; left in place: %s", subject, err, d.Names())
	}
	var next *rspb.Release
	if ok {
		if next, err = decodeRelease(rec.Payload); err != nil {
			leave("the revision written after it is unreadable")
			return rep, fmt.Errorf("%s: %s: %w; left in place: %s", subject, rec.Describe(), err, d.Names())
		}
		if next.Version == 0 {
			next.Version = rec.Revision()
		}
	}
	if !ok || next.Version <= d.Abandoned {
		rep.Skipped = "no revision was written after it, so nothing tells which of its objects the next one renders"
		leave("no revision after the abandoned one says whether it is still wanted")
		return rep, fmt.Errorf("%s: %w; left in place: %s", subject, ErrNoNewRevision, d.Names())
	}
	rep.After = next.Version
	objs, err := parseManifest(next.Manifest)
	if err != nil {
		leave("the manifest of the revision written after it is unreadable")
		return rep, fmt.Errorf("%s: manifest of revision %d: %w; left in place: %s", subject, next.Version, err, d.Names())
	}
	kc, err := kube()
	if err != nil {
		leave("no cluster access")
		return rep, fmt.Errorf("%s: %w; left in place: %s", subject, err, d.Names())
	}
	if opts.FieldManager == "" {
		opts.FieldManager = HelmFieldManager
	}
	opts.DeleteData = d.DeleteData
	c := &converger{kc: kc, in: ConvergeInput{AbandonedCreated: d.AbandonedCreated}, opts: opts, rep: &rep, release: d.Release, ns: d.Namespace}
	rendered, errs := c.resolveAll(objs)
	if len(errs) > 0 {
		// An object of the new manifest that cannot be matched could be any
		// of them: keep them all.
		leave(fmt.Sprintf("revision %d's manifest could not be fully matched against the cluster", next.Version))
		return rep, fmt.Errorf("%s: manifest of revision %d: %w; left in place: %s", subject, next.Version, errors.Join(errs...), d.Names())
	}
	again := map[objKey]resolved{}
	for _, r := range rendered {
		again[r.key()] = r
	}
	// Fields of an object rendered again are brought to the new rendering
	// with the new revision's own apply method, as Converge reverts: helm
	// adopted the object with its new rendering as the original, so with
	// client-side apply a field only the abandoned revision set would stay.
	c.in.Abandoned = next
	deferred, errs := c.resolveAll(d.Objects)
	for _, o := range deferred {
		if n, ok := again[o.key()]; ok {
			err := c.refresh(ctx, o, n)
			if errors.Is(err, ErrFenced) {
				return rep, fmt.Errorf("%s: %w", subject, err)
			}
			if err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if err := c.remove(ctx, o); err != nil {
			if errors.Is(err, ErrFenced) {
				return rep, fmt.Errorf("%s: %w", subject, err)
			}
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return rep, fmt.Errorf("%s, after revision %d: %w", subject, next.Version, errors.Join(errs...))
	}
	return rep, nil
}
