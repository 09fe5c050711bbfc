package cli

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
)

// preface opens `helm-autorecover --help`: what this tool adds to helm,
// before helm's own text.
const preface = `helm-autorecover is helm with locked, self-recovering releases.

  install, upgrade, rollback, uninstall
      take a lock on the release first (its owner, SESSION, and its expiry,
      LOCKED TILL, in the API server's time), renew it while helm runs, and
      recover a revision left pending by a helm process that died: no more
      "another operation (install/upgrade/rollback) is in progress".
      --lock-timeout waits for a live holder instead of failing at once.
  locks      show who holds each release's lock, until when, and who waits
  unlock     release a lock whose holder died (--force: one still renewed)
  recover    mark a release's abandoned pending revision failed, now
  controller recover every stuck release in a cluster, in the cluster

Exit codes, the lock and its guarantees: docs/exit-codes.md,
docs/protocol.md and the README at
https://github.com/helm-autorecover/helm-autorecover.

Everything else is helm's own:

`

// nameAsInvoked makes root's usage lines name the program as its user
// called it: "helm autorecover" when helm runs it as the autorecover
// plugin, the executable's own name otherwise (helm-autorecover), never
// helm's. It also opens the root's help with preface.
func nameAsInvoked(root *cobra.Command) {
	if root.Annotations == nil {
		root.Annotations = map[string]string{}
	}
	root.Annotations[cobra.CommandDisplayNameAnnotation] = invokedAs()
	root.Long = preface + root.Long
}

// invokedAs is the name the program was called by.
func invokedAs() string {
	// helm sets both for the plugin command it runs.
	if p := os.Getenv("HELM_PLUGIN_NAME"); p != "" && os.Getenv("HELM_PLUGIN_DIR") != "" {
		return "helm " + p
	}
	name := strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe")
	if name == "" || name == "." || strings.HasSuffix(name, ".test") {
		return "helm-autorecover"
	}
	return name
}
