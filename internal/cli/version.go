package cli

import (
	"fmt"
	"io"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/helm-autorecover/helm-autorecover/internal/version"
)

// wrapVersion keeps helm's own `version` command (its flags and output stay
// as scripts expect) and adds this project's version in front of its default
// output. With --short or --template only helm's output is printed.
func wrapVersion(root *cobra.Command, out io.Writer) {
	helmVersion := findCommand(root, "version")
	if helmVersion == nil || helmVersion.RunE == nil {
		return
	}
	inner := helmVersion.RunE
	helmVersion.Short = "print the helm-autorecover and embedded helm versions"
	helmVersion.RunE = func(cmd *cobra.Command, args []string) error {
		short, _ := cmd.Flags().GetBool("short")
		tmpl, _ := cmd.Flags().GetString("template")
		if !short && tmpl == "" {
			fmt.Fprintf(out, "helm-autorecover %s (commit %q, %s, helm SDK %s)\n",
				version.Version, version.GitCommit, runtime.Version(), version.HelmVersion())
		}
		return inner(cmd, args)
	}
}

// findCommand returns root's direct subcommand called name, or nil.
func findCommand(root *cobra.Command, name string) *cobra.Command {
	for _, c := range root.Commands() {
		if c.Name() == name {
			return c
		}
	}
	return nil
}
