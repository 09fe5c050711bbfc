package recovery

import (
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestIsStale(t *testing.T) {
	gr := schema.GroupResource{Resource: "configmaps"}
	if !isStale(apierrors.NewConflict(gr, "x", errors.New("the object has been modified"))) {
		t.Error("a resourceVersion conflict is not stale")
	}
	fieldConflict := &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: 409, Reason: metav1.StatusReasonConflict,
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: metav1.CauseTypeFieldManagerConflict, Field: ".data.x"}}},
	}}
	if isStale(fieldConflict) {
		t.Error("a field manager conflict is retried as stale")
	}
}
