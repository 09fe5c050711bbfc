// Package version holds this project's build stamp and reports the Helm
// library version it embeds.
package version

import "runtime/debug"

// These are set at link time with -ldflags -X (see the Makefile).
var (
	// Version is this project's release version.
	Version = "v0.1.0-dev"
	// GitCommit is the commit the binary was built from.
	GitCommit = ""
)

// HelmModule is the Helm SDK module embedded in this binary.
const HelmModule = "helm.sh/helm/v4"

// HelmVersion returns the version of the embedded Helm SDK as recorded in the
// binary's module build information, or "unknown".
func HelmVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, dep := range info.Deps {
		if dep.Path == HelmModule {
			if dep.Replace != nil {
				return dep.Replace.Version
			}
			return dep.Version
		}
	}
	return "unknown"
}
