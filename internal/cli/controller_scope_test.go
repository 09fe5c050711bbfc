package cli

import (
	"context"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

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

// TestNoOperationUsage: recover, unlock and the controller run no helm
// operation after a recovery, so their --recover-strategy help must not say
// fail "just runs the operation" (issue 35 item 6); the guarded commands'
// help still does.
func TestNoOperationUsage(t *testing.T) {
	c := &lockCmds{}
	for _, cmd := range []*cobra.Command{newControllerCmd(nil, io.Discard), newRecoverCmd(c), newUnlockCmd(c)} {
		f := cmd.Flags().Lookup("recover-strategy")
		if f == nil {
			continue
		}
		if strings.Contains(f.Usage, "just run the operation") || !strings.Contains(f.Usage, "last deployed state") {
			t.Errorf("%s --recover-strategy: %q", cmd.Name(), f.Usage)
		}
	}
}

// TestOptOutHelp: the controller's help and the chart's NOTES name the
// lasting opt-out for a release (a label, which helm copies to every
// revision), not an annotation on the newest record, which covers one
// revision (issue 35 item 6).
func TestOptOutHelp(t *testing.T) {
	notes, err := os.ReadFile("../../charts/helm-autorecover/templates/NOTES.txt")
	if err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{"controller --help": controllerLong, "NOTES.txt": string(notes)} {
		flat := strings.Join(strings.Fields(text), " ")
		if strings.Contains(flat, "release's newest record") || !strings.Contains(flat, "--labels helm-autorecover.io/ignore=true") {
			t.Errorf("%s does not name the lasting opt-out:\n%s", name, text)
		}
	}
}
