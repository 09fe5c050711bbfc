package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"helm.sh/helm/v4/pkg/action"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	releasei "helm.sh/helm/v4/pkg/release"
	release "helm.sh/helm/v4/pkg/release/v1"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/guard"
	"github.com/helm-autorecover/helm-autorecover/internal/helmx"
	"github.com/helm-autorecover/helm-autorecover/internal/inspect"
	"github.com/helm-autorecover/helm-autorecover/internal/protocol"
)

const listLocksUsage = "add the columns LOCKED TILL, SESSION ID and HOLDER (and lock_state, locked_till, session_id and holder to -o json|yaml, and preempt_requested_by once a waiter asked the holder to stop with --preempt), in API-server time; also reads the releases' lock Leases (no effect with --short)"

// wrapList adds --locks to helm's own list. Without the flag, helm's list
// runs untouched and prints exactly what stock helm prints.
func wrapList(root *cobra.Command, c *lockCmds) {
	cmd := findCommand(root, "list")
	if cmd == nil || cmd.RunE == nil {
		return
	}
	var withLocks bool
	cmd.Flags().BoolVar(&withLocks, "locks", false, listLocksUsage)
	guard.LockBackendFlag(cmd.Flags(), &c.backend)
	_ = registerGuardCompletions(cmd)
	inner := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if short, _ := cmd.Flags().GetBool("short"); !withLocks || short {
			return inner(cmd, args)
		}
		return c.runListLocks(cmd)
	}
}

// runListLocks runs helm's list action with the flags helm's list command
// parsed, and prints its releases with their locks.
func (c *lockCmds) runListLocks(cmd *cobra.Command) error {
	f := cmd.Flags()
	format, err := parseOutput(f.Lookup("output").Value.String())
	if err != nil {
		return err
	}
	allNamespaces, _ := f.GetBool("all-namespaces")
	ns := c.settings.Namespace()
	if allNamespaces {
		ns = ""
	}
	cfg := action.NewConfiguration()
	if err := cfg.Init(c.settings.RESTClientGetter(), ns, os.Getenv("HELM_DRIVER")); err != nil {
		return err
	}
	l := action.NewList(cfg)
	l.AllNamespaces = allNamespaces
	l.ByDate, _ = f.GetBool("date")
	l.SortReverse, _ = f.GetBool("reverse")
	l.Uninstalled, _ = f.GetBool("uninstalled")
	l.Superseded, _ = f.GetBool("superseded")
	l.Uninstalling, _ = f.GetBool("uninstalling")
	l.Deployed, _ = f.GetBool("deployed")
	l.Failed, _ = f.GetBool("failed")
	l.Pending, _ = f.GetBool("pending")
	l.Limit, _ = f.GetInt("max")
	l.Offset, _ = f.GetInt("offset")
	l.Filter, _ = f.GetString("filter")
	l.Selector, _ = f.GetString("selector")
	l.NoHeaders, _ = f.GetBool("no-headers")
	l.TimeFormat, _ = f.GetString("time-format")
	l.SetStateMask()
	found, err := l.Run()
	if err != nil {
		return err
	}
	rels, err := toV1(found)
	if err != nil {
		return err
	}

	cn, err := c.open()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	sts, err := cn.list(ctx, ns)
	if err != nil {
		return err
	}
	locks := map[releaseKey]*protocol.Status{}
	for i := range sts {
		locks[releaseKey{sts[i].Namespace, sts[i].Release}] = &sts[i]
	}
	now, err := cn.serverNow(ctx)
	if err != nil {
		return err
	}
	elems := make([]inspect.ListElement, 0, len(rels))
	var rows []inspect.Row
	for _, r := range rels {
		e := listElement(r, l.TimeFormat)
		latest := &helmx.Summary{Name: r.Name, Namespace: r.Namespace, Revision: r.Version}
		if r.Info != nil {
			latest.Status = r.Info.Status
		}
		row := inspect.NewRow(inspect.Input{
			Lock:    locks[releaseKey{r.Namespace, r.Name}],
			Release: inspect.Release{Name: r.Name, Namespace: r.Namespace, Latest: latest},
			Now:     now,
			Margin:  cn.locks.Margin(),
		})
		e.LockFields(row)
		elems = append(elems, e)
		rows = append(rows, row)
	}
	if err := inspect.WriteList(c.out, format, elems, l.NoHeaders, c.settings.ShouldDisableColor()); err != nil {
		return err
	}
	c.warnProblems(rows)
	return nil
}

// listElement is helm list's element for r, built as helm builds it.
func listElement(r *release.Release, timeFormat string) inspect.ListElement {
	e := inspect.ListElement{
		Name:       r.Name,
		Namespace:  r.Namespace,
		Revision:   fmt.Sprint(r.Version),
		Updated:    "-",
		Chart:      chartName(r.Chart),
		AppVersion: appVersion(r.Chart),
	}
	if r.Info != nil {
		e.Status = r.Info.Status.String()
		if t := r.Info.LastDeployed; !t.IsZero() {
			if timeFormat != "" {
				e.Updated = t.Format(timeFormat)
			} else {
				e.Updated = t.String()
			}
		}
	}
	return e
}

func chartName(c *chart.Chart) string {
	if c == nil || c.Metadata == nil {
		return "MISSING"
	}
	return fmt.Sprintf("%s-%s", c.Name(), c.Metadata.Version)
}

func appVersion(c *chart.Chart) string {
	if c == nil || c.Metadata == nil {
		return "MISSING"
	}
	return c.AppVersion()
}

func toV1(ls []releasei.Releaser) ([]*release.Release, error) {
	out := make([]*release.Release, 0, len(ls))
	for _, v := range ls {
		switch r := v.(type) {
		case *release.Release:
			out = append(out, r)
		case release.Release:
			out = append(out, &r)
		case nil:
		default:
			return nil, &exitcode.Error{Code: exitcode.Failure, Err: fmt.Errorf("list: unsupported release type %T", v)}
		}
	}
	return out, nil
}
