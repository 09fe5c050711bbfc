package releasestore

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/helm-autorecover/helm-autorecover/internal/lock"
	"github.com/helm-autorecover/helm-autorecover/internal/records"
)

// TestRenewalReadsTheBeat: a waiter's watch shows the beat; the store reads
// from it the holder, its latest renewal and its LOCKED TILL, so that the
// waiter knows when it first saw that renewal (lock.Confirm counts from
// then). A released beat, another object, or one that is not a beat names
// no live holder.
func TestRenewalReadsTheBeat(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	lease := 15 * time.Second
	name := lock.LeaseName("web")
	beatObj := func(objName string, mut func(*lock.Record)) runtime.Object {
		r := lock.Record{
			Schema: lock.SchemaVersion, Session: "A", Operation: lock.OpUpgrade, Release: "web", Namespace: "shop",
			LeaseDuration: metav1.Duration{Duration: lease}, AcquiredAt: t0, RenewedAt: t0.Add(5 * time.Second), LockedTill: t0.Add(5*time.Second + lease),
		}
		if mut != nil {
			mut(&r)
		}
		enc, err := EncodeBeat(r)
		if err != nil {
			t.Fatal(err)
		}
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: objName, Namespace: "shop", Annotations: map[string]string{AnnotationBeat: enc}}}
	}
	st := NewStore(nil, records.DriverSecret, "shop")
	holder, renewed, till, ok := st.Renewal(name, beatObj(name, nil))
	if !ok || holder != "A" || !renewed.Equal(t0.Add(5*time.Second)) || !till.Equal(t0.Add(5*time.Second+lease)) {
		t.Fatalf("Renewal of A's beat = %q, %s, %s, %v; want A, renewed %s, till %s", holder, renewed, till, ok, t0.Add(5*time.Second), t0.Add(5*time.Second+lease))
	}
	for what, obj := range map[string]runtime.Object{
		"a released beat":        beatObj(name, func(r *lock.Record) { r.ReleasedAt = t0.Add(6 * time.Second) }),
		"another release's beat": beatObj(lock.LeaseName("api"), nil),
		"a record":               &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sh.helm.release.v1.web.v1", Namespace: "shop"}},
		"an unreadable beat":     &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", Annotations: map[string]string{AnnotationBeat: "{"}}},
		"a Lease":                &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop"}},
	} {
		if holder, _, _, ok := st.Renewal(name, obj); ok {
			t.Errorf("Renewal of %s = holder %q; want none", what, holder)
		}
	}
}
