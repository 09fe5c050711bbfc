// Package cli builds the helm-autorecover command line: Helm 4's whole command
// tree, unchanged, plus this project's own commands. One file per command.
package cli
