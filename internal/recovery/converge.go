package recovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"helm.sh/helm/v4/pkg/release/common"
	rspb "helm.sh/helm/v4/pkg/release/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
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
	// DeferRemovals leaves the objects only the abandoned revision rendered
	// in place and returns them in ConvergeReport.Deferred, for
	// RemoveDeferred once the operation recovery precedes has written its
	// revision: it may render them again (a PersistentVolumeClaim, a
	// LoadBalancer Service), and deleting them first would lose what they
	// hold. protocol.Conn.Recover always sets it, also with no operation
	// to follow (the objects are then recorded on the failed revision:
	// MarkFailedLeaving).
	DeferRemovals bool
	// DeleteData lets recovery delete PersistentVolumeClaims,
	// CustomResourceDefinitions and Namespaces that only the abandoned
	// revision created (the --recover-delete-data flag); without it they
	// are always kept, as their deletion destroys a volume's data, every
	// custom resource of the kind, or everything in the namespace.
	DeleteData bool
	// DryRun reads what a real run reads and decides as it would, but
	// writes nothing: the report says what it would revert and delete
	// (server-side apply asks the API server's own dry run). BeforeWrite
	// is not called.
	DryRun bool
}

// ConvergeAbandoned loads the abandoned revision and the last deployed one
// from helm's records in namespace abandoned.RecordNamespace and converges.
// Call it with abandoned the Summary from the recovery decision, while
// holding the lock, before marking it failed and before helm's own upgrade
// or install runs (with opts.DeferRemovals; then RemoveDeferred after the
// next upgrade or install has written its revision).
//
// An abandoned uninstall (status uninstalling when it was found) is left
// alone: it applied nothing, it only deleted, and helm's next operation
// works from that same revision.
func ConvergeAbandoned(ctx context.Context, kube func() (*Kube, error), records helmx.Records, abandoned helmx.Summary, opts ConvergeOptions) (ConvergeReport, error) {
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
	kc, err := kube()
	if err != nil {
		return ConvergeReport{Release: abandoned.Name, Namespace: abandoned.Namespace, Abandoned: abandoned.Revision},
			fmt.Errorf("converging release %q in namespace %q: %w", abandoned.Name, abandoned.Namespace, err)
	}
	rep, err := Converge(ctx, kc, in, opts)
	if rep.Deferred != nil && abandoned.RecordNamespace != "" {
		rep.Deferred.RecordNamespace = abandoned.RecordNamespace
	}
	return rep, err
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
			if r.Meta.Name == abandoned.RecordName {
				return ConvergeInput{}, fmt.Errorf("%s: %w", subject, err)
			}
			// An unreadable record that is neither the abandoned revision
			// nor a deployed one helm could use: helm skips it, and so does
			// the history (helmx.ReadHistory warns about it).
			continue
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
	rep := ConvergeReport{Release: ab.Name, Namespace: ab.Namespace, Abandoned: ab.Version, Method: ConvergeMethod(ab), DryRun: opts.DryRun}
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
	if opts.DeferRemovals {
		c.deferAll(p.OnlyAbandoned, in.AbandonedCreated)
		p.OnlyAbandoned = nil
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

// errDryRun stops a write of a dry run (ConvergeOptions.DryRun) where it
// would be sent; the caller records what it would have done.
var errDryRun = errors.New("dry run")

// ErrFenced wraps the error of ConvergeOptions.BeforeWrite when it stopped
// Converge; the error returned wraps both.
var ErrFenced = errors.New("stopped before writing")

type converger struct {
	kc      *Kube
	in      ConvergeInput
	opts    ConvergeOptions
	rep     *ConvergeReport
	release string
	ns      string
	// cascade finds the owners of data, once something is to be deleted.
	cascade *cascadeGuard
}

// target is the revision objects are brought to: the deployed one, or
// after the operation (RemoveDeferred) the one it wrote.
func (c *converger) target() int {
	if c.rep.After > 0 {
		return c.rep.After
	}
	return c.rep.Base
}

func (c *converger) record(ref ObjectRef, a ConvergeAction, reason string) {
	c.rep.Objects = append(c.rep.Objects, ObjectResult{Object: ref, Action: a, Reason: reason})
}

func (c *converger) fence() error {
	if c.opts.DryRun {
		return errDryRun
	}
	if c.opts.BeforeWrite == nil {
		return nil
	}
	if err := c.opts.BeforeWrite(); err != nil {
		return fmt.Errorf("%w: %w", ErrFenced, err)
	}
	return nil
}
