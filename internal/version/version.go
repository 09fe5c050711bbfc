// Package version holds this project's build stamp and reports the Helm
// library version it embeds.
package version

import "runtime/debug"

// Version is this project's version: the one string the binary reports
// (`helm-autorecover version`), writes into lock records (toolVersion) and
// sends as its user agent, and that plugin.yaml's version and the chart's
// version and appVersion repeat word for word (TestOneVersionEverywhere).
// It is set here, in the source, and nowhere else: no build stamps it, so
// `go build`, `go install` and `make build` report the same.
var Version = "0.1.0-dev"

// GitCommit is the commit the binary was built from, reported beside the
// version; `make build` sets it at link time (-ldflags -X).
var GitCommit = ""

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
