package cli

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
)

// sqlSession chooses the lock session of a guarded command (install,
// upgrade, rollback, uninstall) run with helm's sql driver, and puts it into
// helm's connection string (protocol.NameSQLSession) before helm reads it:
// helm opens its database when the command starts, before the guard runs,
// and the database then refuses helm's writes once this session no longer
// holds the release's lock row. Empty for any other command or driver.
func sqlSession(root *cobra.Command, args []string) (string, error) {
	if os.Getenv("HELM_DRIVER") != protocol.DriverSQL {
		return "", nil
	}
	c, _, err := root.Find(args)
	if err != nil || c == nil {
		return "", nil //nolint:nilerr // cobra reports the unknown command itself
	}
	if _, ok := guardedCommands[c.Name()]; !ok || c.Parent() != root {
		return "", nil
	}
	session := protocol.NewSession()
	if err := protocol.NameSQLSession(session); err != nil {
		return "", err
	}
	return session, nil
}
