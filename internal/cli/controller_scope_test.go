package cli

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestControllerScope: the controller serves exactly the scope the user
// named: --namespaces, or helm's -n when given (issue 35 item 1: -n was
// accepted and ignored), never a silent mix of the two.
func TestControllerScope(t *testing.T) {
	for _, c := range []struct {
		name       string
		namespaces []string
		nsGiven    bool
		ns         string
		want       []string
		err        string
	}{
		{"nothing given: every namespace", nil, false, "default", nil, ""},
		{"-n shop", nil, true, "shop", []string{"shop"}, ""},
		{"--namespaces a,b", []string{"a", "b"}, false, "default", []string{"a", "b"}, ""},
		{"-n from the kube context, not typed", nil, false, "team-a", nil, ""},
		{"-n shop --namespaces shop", []string{"shop"}, true, "shop", []string{"shop"}, ""},
		{"-n shop --namespaces web", []string{"web"}, true, "shop", nil, `-n/--namespace "shop" and --namespaces "web" name different scopes`},
		{"-n shop --namespaces shop,web", []string{"shop", "web"}, true, "shop", nil, "different scopes"},
		{"--namespaces ' '", []string{" "}, false, "default", nil, "names no namespace"},
	} {
		got, err := controllerScope(c.namespaces, c.nsGiven, c.ns)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: error %v; want %q", c.name, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case !slices.Equal(got, c.want):
			t.Errorf("%s: scope %q; want %q", c.name, got, c.want)
		}
	}
}

// TestMissingNamespaces names the namespaces of the scope that do not
// exist, for the controller's warning.
func TestMissingNamespaces(t *testing.T) {
	cs := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})
	if got := missingNamespaces(context.Background(), cs, []string{"shop", "nosuchns"}); !slices.Equal(got, []string{"nosuchns"}) {
		t.Errorf("missing %q; want [nosuchns]", got)
	}
}
