package cli

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func TestCompletion(t *testing.T) {
	e := newFakeEnv(t, fixture(t)...)
	for _, tc := range []struct {
		name string
		fn   func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective)
		args []string
		pre  string
		want []string
	}{
		{"releases", e.c.completeReleases, nil, "", []string{
			"api\trevision 3 pending-upgrade, lock expired, held by alice@ci-7 (pid 4242)",
			"db\trevision 1 deployed, lock none",
			"legacy\trevision 2 pending-rollback, lock legacy-pending",
			"web\trevision 8 pending-upgrade, lock live, held by alice@ci-7 (pid 4242)",
		}},
		{"releases by prefix", e.c.completeReleases, nil, "l", []string{"legacy\trevision 2 pending-rollback, lock legacy-pending"}},
		{"one release only", e.c.completeReleases, []string{"api"}, "", nil},
		{"held releases", e.c.completeHeldReleases, nil, "", []string{
			"api\trevision 3 pending-upgrade, lock expired, held by alice@ci-7 (pid 4242)",
			"web\trevision 8 pending-upgrade, lock live, held by alice@ci-7 (pid 4242)",
		}},
		{"session", e.c.completeSessions, []string{"api"}, "", []string{sessAPI + "\texpired lock, alice@ci-7 pid 4242, operation upgrade of revision 3"}},
		{"session of a free lock", e.c.completeSessions, []string{"db"}, "", nil},
		{"session without release", e.c.completeSessions, nil, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, dir := tc.fn(&cobra.Command{}, tc.args, tc.pre)
			if dir != cobra.ShellCompDirectiveNoFileComp {
				t.Errorf("directive %v; want NoFileComp", dir)
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
	if w := e.writes(); len(w) > 0 {
		t.Errorf("completion wrote %v", w)
	}
}
