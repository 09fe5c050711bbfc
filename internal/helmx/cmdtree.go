package helmx

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	helmcmd "helm.sh/helm/v4/pkg/cmd"
	"helm.sh/helm/v4/pkg/kube"
)

// NewHelmRootCmd returns Helm 4's complete command tree, exactly as the helm
// binary builds it. It may be called once per process: Helm keeps its
// settings in package state.
func NewHelmRootCmd(out io.Writer, args []string) (*cobra.Command, error) {
	// Keep server-side apply ownership identical to stock helm, so releases
	// move between helm and helm-autorecover without field-manager conflicts.
	kube.ManagedFieldsManager = "helm"
	root, err := helmcmd.NewRootCmd(out, args, helmcmd.SetupLogging)
	if err != nil {
		return nil, fmt.Errorf("building the helm command tree: %w", err)
	}
	return root, nil
}

// HelmExitCode returns the exit code helm itself would use for err (plugins
// report theirs through helm's CommandError), or 0 when err is not such an error.
func HelmExitCode(err error) int {
	if cerr, ok := errors.AsType[helmcmd.CommandError](err); ok {
		return cerr.ExitCode
	}
	return 0
}
