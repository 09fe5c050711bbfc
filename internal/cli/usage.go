package cli

import (
	"errors"

	"github.com/spf13/cobra"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
)

// usageRule makes one rule hold for every command, helm's own and ours: a
// command line that cannot be used (an unknown flag, a flag value that does
// not parse, a wrong number of arguments) exits with exitcode.Usage (2).
// Stock helm exits 1 for these; docs/exit-codes.md says so.
func usageRule(root *cobra.Command) {
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c != root {
			// A command's own flag error func, when it has one, wins over
			// the root's: ours all give exit 2 already.
			if args := c.Args; args != nil {
				c.Args = func(c *cobra.Command, a []string) error {
					if err := args(c, a); err != nil {
						return usageError(err)
					}
					return nil
				}
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// usageError gives err exit code 2 unless it has a code already.
func usageError(err error) error {
	if _, ok := errors.AsType[*exitcode.Error](err); ok {
		return err
	}
	return &exitcode.Error{Code: exitcode.Usage, Err: err}
}
