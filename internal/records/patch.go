package records

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// ErrNoPatch says PatchAnnotations cannot patch through this client (a fake
// clientset has no REST client): the caller reads and updates instead.
var ErrNoPatch = errors.New("no REST client to patch with")

// objectMetadataAccept asks for an object's metadata only
// (PartialObjectMetadata), with the whole object as the fallback of a
// server that cannot.
const objectMetadataAccept = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"

// PatchAnnotations sets (a non-nil value) or removes (nil) annotations of
// record name in namespace ns with one JSON merge patch, conditional on
// resourceVersion rv (a Conflict when the record changed since, NotFound
// when it is gone), under fieldManager. Only metadata travels: the patch
// carries the annotations, the answer the record's metadata (a Record with
// Meta and Kind only). It needs the patch verb on the records' resource;
// without it the API server answers Forbidden, and the caller reads the
// record and updates it instead (Get and Update), as it does on ErrNoPatch.
func (s Store) PatchAnnotations(ctx context.Context, ns, name, rv string, set map[string]*string, fieldManager string) (Record, error) {
	rc := s.client.CoreV1().RESTClient()
	if c, ok := rc.(*rest.RESTClient); !ok || c == nil {
		return Record{}, ErrNoPatch
	}
	if rv == "" {
		return Record{}, fmt.Errorf("patching %s %q: no resourceVersion to make it conditional on", s.kind, name)
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": rv, "annotations": set}})
	if err != nil {
		return Record{}, err
	}
	raw, err := rc.Patch(types.MergePatchType).Namespace(ns).Resource(s.Resource()).Name(name).
		Param("fieldManager", fieldManager).
		SetHeader("Accept", objectMetadataAccept).
		Body(body).Do(ctx).Raw()
	if err != nil {
		return Record{}, statusError(raw, err)
	}
	var out struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return Record{}, fmt.Errorf("reading the answer to a patch of %s %q: %w", s.kind, name, err)
	}
	return Record{Kind: s.kind, Meta: out.Metadata}, nil
}
