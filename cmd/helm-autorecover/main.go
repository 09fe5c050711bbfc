// Command helm-autorecover is a drop-in Helm 4 CLI whose mutating commands hold
// a lock and recover releases left pending by a dead helm process.
package main

import (
	"os"

	"github.com/helm-autorecover/helm-autorecover/internal/cli"
)

func main() {
	os.Exit(cli.Run(os.Stdout, os.Stderr, os.Args[1:]))
}
