// Putting the fence on helm's clients: helm's command tree
// (InstallOnHelm, through go:linkname to its settings), REST configs and
// getters for helm actions run outside it (Wrap, Getter).

package helmx

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	_ "unsafe" // go:linkname reaches helm's command settings; see helmSettings.

	helmcli "helm.sh/helm/v4/pkg/cli"
	helmcmd "helm.sh/helm/v4/pkg/cmd"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"
)

// helmSettings is the settings object of helm's command tree. Helm keeps it
// in an unexported package variable and builds every Kubernetes client of its
// commands from it; reaching it is the only way to see helm's own requests
// without forking helm. If helm renames it, the link fails at build time, not
// at run time.
//
//go:linkname helmSettings helm.sh/helm/v4/pkg/cmd.settings
var helmSettings *helmcli.EnvSettings

var _ = helmcmd.NewRootCmd // the variable above lives in this package

var installOnce sync.Once

// InstallOnHelm wraps every Kubernetes client helm's command tree builds
// with DefaultWriteFence. Call it once, after helmx.NewHelmRootCmd.
func InstallOnHelm() error {
	var err error
	installOnce.Do(func() {
		if helmSettings == nil {
			err = errors.New("helm's command settings are not initialised")
			return
		}
		err = WrapGetter(helmSettings.RESTClientGetter(), DefaultWriteFence)
	})
	return err
}

// WrapGetter makes every REST configuration getter hands out go through w.
// getter must be helm's (a *genericclioptions.ConfigFlags).
func WrapGetter(getter genericclioptions.RESTClientGetter, w *WriteFence) error {
	cf, ok := getter.(*genericclioptions.ConfigFlags)
	if !ok {
		return fmt.Errorf("helm's REST client getter is a %T, not *genericclioptions.ConfigFlags; this helm version is not supported", getter)
	}
	inner := cf.WrapConfigFn
	cf.WrapConfigFn = func(c *rest.Config) *rest.Config {
		if inner != nil {
			c = inner(c)
		}
		c.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &fenceRT{next: rt, w: w} })
		return c
	}
	return nil
}

// Wrap returns a copy of cfg whose requests go through w, for clients built
// outside helm's command tree (an embedder's helm actions).
func (w *WriteFence) Wrap(cfg *rest.Config) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &fenceRT{next: rt, w: w} })
	return out
}

// Getter returns a REST client getter for helm's actions run under w's
// lock beside others (the controller's rollbacks, each under its release's
// lock): every client helm builds from it goes through w (Wrap), while
// discovery and the REST mapper, which only read, are base's and shared.
func (w *WriteFence) Getter(base genericclioptions.RESTClientGetter) genericclioptions.RESTClientGetter {
	return fencedGetter{RESTClientGetter: base, w: w}
}

type fencedGetter struct {
	genericclioptions.RESTClientGetter
	w *WriteFence
}

func (g fencedGetter) ToRESTConfig() (*rest.Config, error) {
	cfg, err := g.RESTClientGetter.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	return g.w.Wrap(cfg), nil
}

// HelmRESTClientGetter is the getter of helm's command tree, whose clients
// InstallOnHelm fenced; use it for helm actions run on the guard's behalf.
func HelmRESTClientGetter() genericclioptions.RESTClientGetter {
	return helmSettings.RESTClientGetter()
}
