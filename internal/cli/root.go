package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/parentwatch"
)

// Run builds the command tree for args, runs it and returns the process exit
// code. It is what main calls and what tests call.
func Run(out, errOut io.Writer, args []string) int {
	parentwatch.Start()
	root, err := helmx.NewHelmRootCmd(out, args)
	if err != nil {
		fmt.Fprintf(errOut, "Error: %v\n", err)
		return exitcode.Failure
	}
	if err := helmx.InstallOnHelm(); err != nil {
		fmt.Fprintf(errOut, "Error: %v\n", err)
		return exitcode.Failure
	}
	root.SetArgs(args)
	root.SetOut(out)
	root.SetErr(errOut)
	wrapVersion(root, out)
	settings := helmSettings(args)
	addLockCommands(root, settings, out, errOut)
	session, err := sqlSession(root, args)
	if err != nil {
		fmt.Fprintf(errOut, "Error: %v\n", err)
		return exitcode.Usage
	}
	if err := guardMutating(root, settings, errOut, session); err != nil {
		fmt.Fprintf(errOut, "Error: %v\n", err)
		return exitcode.Usage
	}
	usageRule(root)
	nameAsInvoked(root)
	// Errors are printed here, as cobra would, except those a command has
	// reported already.
	root.SilenceErrors = true
	if err := root.Execute(); err != nil {
		exitErr, ok := errors.AsType[*exitcode.Error](err)
		if !ok || !exitErr.Reported {
			fmt.Fprintf(errOut, "Error: %v\n", err)
		}
		if strings.HasPrefix(err.Error(), "unknown command ") {
			fmt.Fprintf(errOut, "Run '%s --help' for usage.\n", root.CommandPath())
		}
		if ok {
			return exitErr.Code
		}
		if strings.HasPrefix(err.Error(), "unknown command ") {
			// cobra's own check of the root's arguments (usageRule
			// cannot wrap it without losing its suggestions).
			return exitcode.Usage
		}
		if code := helmx.HelmExitCode(err); code != 0 {
			return code
		}
		slog.Debug("command failed", slog.Any("error", err))
		return exitcode.Failure
	}
	return exitcode.OK
}
