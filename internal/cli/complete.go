package cli

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/helm-autorecover/helm-autorecover/internal/inspect"
)

// completionTimeout keeps a shell responsive when the cluster is slow.
const completionTimeout = 3 * time.Second

// completeReleases completes the first argument with the releases of the
// namespace (those with a stored revision or a lock), described by state.
func (c *lockCmds) completeReleases(_ *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return c.releaseChoices(toComplete, func(inspect.Row) bool { return true })
}

// completeHeldReleases completes unlock's argument with the releases whose
// lock somebody holds.
func (c *lockCmds) completeHeldReleases(_ *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return c.releaseChoices(toComplete, func(r inspect.Row) bool { return r.Session != "" })
}

func (c *lockCmds) releaseChoices(toComplete string, keep func(inspect.Row) bool) ([]string, cobra.ShellCompDirective) {
	ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
	defer cancel()
	cn, err := c.open()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	rows, err := c.namespaceRows(ctx, cn, c.settings.Namespace(), 0)
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var out []string
	for _, r := range rows {
		if strings.HasPrefix(r.Release, toComplete) && keep(r) {
			out = append(out, r.Release+"\t"+describeRow(r))
		}
	}
	sort.Strings(out)
	return out, cobra.ShellCompDirectiveNoFileComp
}

func describeRow(r inspect.Row) string {
	var parts []string
	if r.Revision > 0 {
		parts = append(parts, fmt.Sprintf("revision %d %s", r.Revision, r.Status))
	}
	parts = append(parts, "lock "+string(r.State))
	if r.Session != "" {
		parts = append(parts, "held by "+inspect.Holder(r))
	}
	return strings.Join(parts, ", ")
}

// completeSessions completes --session with the session holding the lock
// of the release named in the arguments.
func (c *lockCmds) completeSessions(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) == 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
	defer cancel()
	cn, err := c.open()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	st, err := cn.inspect(ctx, c.settings.Namespace(), args[0])
	if err != nil || st.HolderIdentity == "" {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	desc := fmt.Sprintf("%s lock, %s", st.State, holderText(st.Record, st.HolderIdentity))
	return []string{st.HolderIdentity + "\t" + desc}, cobra.ShellCompDirectiveNoFileComp
}
