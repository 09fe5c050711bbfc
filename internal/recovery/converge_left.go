package recovery

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
)

// When recovery marks a revision failed and no operation of its own follows
// (recover, unlock, the controller), or when the process that recovered it
// may die before its upgrade ends, the objects only that revision rendered
// stay in place (they wait for a revision that says whether it still wants
// them; deleting first could lose what that revision renders again). They
// are recorded on the failed revision itself, in the same write that marks
// it, under helmx.KeyLeft; the next guarded upgrade or install reads them
// from the newest revision (LoadLeft) and removes, once it has written its
// own revision, those that revision does not render (RemoveDeferred), by
// the same rules. A later revision supersedes the record: only the newest
// revision's is read.

// leftSchema is the version of the record's layout; a record of another
// version is not read (LoadLeft says so), never guessed at.
const leftSchema = 1

type leftRecord struct {
	Schema  int          `json:"schema"`
	Objects []leftObject `json:"objects"`
	// DeleteData is Deferred.DeleteData: --recover-delete-data as the
	// recovery that left them was given it.
	DeleteData bool `json:"deleteData,omitempty"`
}

type leftObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name"`
}

// recordLeft returns doc with d's objects recorded under helmx.KeyLeft.
func recordLeft(doc json.RawMessage, d *Deferred) (json.RawMessage, error) {
	rec := leftRecord{Schema: leftSchema, DeleteData: d.DeleteData}
	for _, r := range d.Refs {
		rec.Objects = append(rec.Objects, leftObject(r))
	}
	return helmx.SetTopField(doc, helmx.KeyLeft, rec)
}

// LoadLeft reads what recovery left in place when it marked revision s
// failed (s.Left), with the renderings of s's own manifest, as a Deferred
// for RemoveDeferred; nil when s records nothing. The record is read once.
// An object the manifest does not hold is left as it is: the error names
// it, and the Deferred returned with it holds the others.
func LoadLeft(ctx context.Context, records helmx.Records, s helmx.Summary) (*Deferred, error) {
	if len(s.Left) == 0 {
		return nil, nil
	}
	subject := fmt.Sprintf("release %q in namespace %q: the objects recovery left in place at revision %d", s.Name, s.Namespace, s.Revision)
	var rec leftRecord
	if err := json.Unmarshal([]byte(s.Left), &rec); err != nil {
		return nil, fmt.Errorf("%s: %s is unreadable: %w", subject, helmx.KeyLeft, err)
	}
	if rec.Schema != leftSchema {
		return nil, fmt.Errorf("%s: %s has schema %d, which this version does not read (it reads %d); they are left as they are", subject, helmx.KeyLeft, rec.Schema, leftSchema)
	}
	if len(rec.Objects) == 0 {
		return nil, nil
	}
	ns := s.RecordNamespace
	if ns == "" {
		ns = s.Namespace
	}
	r, err := records.Get(ctx, ns, s.RecordName)
	if err != nil {
		return nil, fmt.Errorf("%s: reading %s %q: %w", subject, records.Kind(), s.RecordName, err)
	}
	rel, err := decodeRelease(r.Payload)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", subject, r.Describe(), err)
	}
	objs, err := parseManifest(rel.Manifest)
	if err != nil {
		return nil, fmt.Errorf("%s: manifest: %w", subject, err)
	}
	d := &Deferred{
		Release: s.Name, Namespace: s.Namespace, RecordNamespace: ns,
		Abandoned: s.Revision, AbandonedCreated: r.Meta.CreationTimestamp.Time, DeleteData: rec.DeleteData,
	}
	var missing []string
	for _, want := range rec.Objects {
		o := findRendered(objs, want, s.Namespace)
		if o == nil {
			// Kept: nothing of it can be judged. The others still are.
			missing = append(missing, ObjectRef{Kind: want.Kind, Namespace: want.Namespace, Name: want.Name}.String())
			continue
		}
		d.Objects = append(d.Objects, o)
		d.Refs = append(d.Refs, ObjectRef(want))
	}
	if len(missing) > 0 {
		return d, fmt.Errorf("%s: %s not found in the revision's manifest; left as they are", subject, strings.Join(missing, ", "))
	}
	return d, nil
}

// findRendered is the object of objs that want names: same group, kind and
// name, and the namespace it was recorded with (a rendering that names none
// is in the release's namespace, or cluster-scoped).
func findRendered(objs []*unstructured.Unstructured, want leftObject, releaseNS string) *unstructured.Unstructured {
	wgv, err := schema.ParseGroupVersion(want.APIVersion)
	if err != nil {
		return nil
	}
	for _, o := range objs {
		if o.GetName() != want.Name || o.GetKind() != want.Kind || o.GroupVersionKind().Group != wgv.Group {
			continue
		}
		// A cluster-scoped object was recorded without a namespace, though
		// its rendering may name one (helm ignores it).
		ns := o.GetNamespace()
		if want.Namespace == "" || ns == want.Namespace || (ns == "" && want.Namespace == releaseNS) {
			return o
		}
	}
	return nil
}
