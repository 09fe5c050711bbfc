// Request and response bodies: a Secret or ConfigMap decoded from one,
// encoded back to JSON, and requests rebuilt with a new body.

package helmx

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
)

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// decoded is a request or response body as an object.
type decoded struct {
	obj  runtime.Object
	meta *metav1.ObjectMeta
}

func decode(body []byte) (decoded, error) {
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
	if err != nil {
		return decoded{}, err
	}
	switch o := obj.(type) {
	case *corev1.Secret:
		return decoded{obj: o, meta: &o.ObjectMeta}, nil
	case *corev1.ConfigMap:
		return decoded{obj: o, meta: &o.ObjectMeta}, nil
	}
	return decoded{}, fmt.Errorf("unexpected %T", obj)
}

// encodeJSON turns obj into the JSON body of a request to the API server.
func encodeJSON(d decoded) ([]byte, error) {
	var gvk string
	switch d.obj.(type) {
	case *corev1.Secret:
		gvk = "Secret"
	default:
		gvk = "ConfigMap"
	}
	var buf bytes.Buffer
	d.obj.GetObjectKind().SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind(gvk))
	if err := json.NewEncoder(&buf).Encode(d.obj); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// decodedKey carries, in a write's context, its body as phaseOfWrite
// decoded it (decodedBody), so that a record's create or update does not
// decode it again.
type decodedKey struct{}

type decodedBody struct {
	body []byte
	d    decoded
	err  error
}

// decodeRequest decodes body, req's, or returns what phaseOfWrite decoded
// of the same body.
func decodeRequest(req *http.Request, body []byte) (decoded, error) {
	if c, ok := req.Context().Value(decodedKey{}).(decodedBody); ok && bytes.Equal(c.body, body) {
		return c.d, c.err
	}
	return decode(body)
}

func readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil {
		return nil, nil
	}
	defer req.Body.Close()
	return io.ReadAll(req.Body)
}

func withBody(req *http.Request, body []byte) *http.Request {
	r := req.Clone(req.Context())
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.Header.Set("Content-Type", "application/json")
	return r
}

func withRawBody(req *http.Request, body []byte) *http.Request {
	r := req.Clone(req.Context())
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return r
}
