package cli

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
	"helm.sh/helm/v4/pkg/chart/common"

	"github.com/helm-autorecover/helm-autorecover/internal/version"
)

// wrapVersion keeps helm's own `version` command (its flags and output stay
// as scripts expect: helm's version and helm's commit of the embedded SDK)
// and adds this project's version and commit in front of its default
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
			fmt.Fprintln(out, versionLine())
		}
		return inner(cmd, args)
	}
}

// versionLine names this project's version and commit and the embedded
// helm SDK's version and commit (helm's commit is known only when the
// build stamped it; the module version names the SDK's source).
func versionLine() string {
	return fmt.Sprintf("helm-autorecover %s (commit %q, %s), helm SDK %s (helm commit %q)",
		version.Version, ownCommit(), runtime.Version(), version.HelmVersion(), common.DefaultCapabilities.HelmVersion.GitCommit)
}

// ownCommit is the commit this binary was built from: the link-time stamp
// (make build), else the revision the go command recorded from the
// checkout (go build, go install from a clone), with "-dirty" when the
// tree had changes.
func ownCommit() string {
	if version.GitCommit != "" {
		return version.GitCommit
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if len(rev) > 7 {
		rev = rev[:7]
	}
	if rev == "" {
		return ""
	}
	return rev + dirty
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
