package records

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func listOptions(cs *fake.Clientset) []metav1.ListOptions {
	var out []metav1.ListOptions
	for _, a := range cs.Actions() {
		if l, ok := a.(k8stesting.ListActionImpl); ok {
			out = append(out, l.ListOptions)
		}
	}
	return out
}

// TestNotOlderThanOnce: the first list under WithNotOlderThan asks for a
// state not older than the floor; the next is consistent; a floored list
// the server refuses is read again consistently.
func TestNotOlderThanOnce(t *testing.T) {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sh.helm.release.v1.web.v1", Namespace: "shop", Labels: map[string]string{"owner": "helm", "name": "web"}}}
	cs := fake.NewClientset(sec)
	s := New(cs, DriverSecret)
	ctx := WithNotOlderThan(context.Background(), "42")
	for range 2 {
		if rs, _, err := s.List(ctx, "shop", "owner=helm,name=web"); err != nil || len(rs) != 1 {
			t.Fatalf("list: %d records, %v", len(rs), err)
		}
	}
	got := listOptions(cs)
	if len(got) != 2 || got[0].ResourceVersion != "42" || got[0].ResourceVersionMatch != metav1.ResourceVersionMatchNotOlderThan || got[1].ResourceVersion != "" {
		t.Errorf("lists %+v: want the first not older than 42, the second consistent", got)
	}

	cs = fake.NewClientset(sec)
	cs.PrependReactor("list", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.ListActionImpl).ListOptions.ResourceVersion != "" {
			return true, nil, errors.New("Timeout: Too large resource version")
		}
		return false, nil, nil
	})
	s = New(cs, DriverSecret)
	if rs, _, err := s.ListMeta(WithNotOlderThan(context.Background(), "42"), "shop", "owner=helm,name=web"); err != nil || len(rs) != 1 {
		t.Fatalf("list after a refused floored read: %d records, %v", len(rs), err)
	}
	if got := listOptions(cs); len(got) != 2 || got[1].ResourceVersion != "" {
		t.Errorf("lists %+v: want the floored one, then a consistent one", got)
	}
}
