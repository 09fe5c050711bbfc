package cli

import (
	"strings"
	"testing"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/guard"
)

// leaseRequests counts the requests the fake saw on Leases.
func (e *fakeEnv) leaseRequests() int {
	n := 0
	for _, a := range e.client.Actions() {
		if a.GetResource().Resource == "leases" {
			n++
		}
	}
	return n
}

// TestLockCommandsWithoutLeaseRights: a user the API server refuses every
// Lease (the release backend's Role) sees, unlocks and recovers locks from
// the release records alone under the default auto backend, and
// --lock-backend=release (or its variable) never asks for a Lease at all.
func TestLockCommandsWithoutLeaseRights(t *testing.T) {
	for _, tc := range []struct {
		name     string
		backend  []string // flag, or nil
		env      string   // HELM_AUTORECOVER_LOCK_BACKEND
		noLeases bool     // not one request on Leases
	}{
		{name: "auto"},
		{name: "--lock-backend=release", backend: []string{"--lock-backend=release"}, noLeases: true},
		{name: "variable release", env: "release", noLeases: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(guard.EnvLockBackend, tc.env)
			run := func(e *fakeEnv, cmd string, args ...string) (int, error) {
				t.Helper()
				args = append(args, tc.backend...)
				switch cmd {
				case "locks":
					return e.run(t, newLocksCmd(e.c), args...)
				case "unlock":
					return e.run(t, newUnlockCmd(e.c), args...)
				default:
					return e.run(t, newRecoverCmd(e.c), args...)
				}
			}

			e := newFakeEnv(t, fixture(t)...)
			e.denyLeases()
			if code, err := run(e, "locks", "--all"); code != 0 {
				t.Fatalf("locks --all: exit %d: %v", code, err)
			}
			// The live holder and the dead one, read from the records.
			wantContains(t, "locks --all", e.out.String(), "web", "live", "api", "expired", "legacy")
			if code, err := run(e, "locks", "web"); code != 0 || !strings.Contains(e.out.String(), sessWeb) {
				t.Fatalf("locks web: exit %d: %v\n%s", code, err, e.out.String())
			}
			if code, err := run(e, "recover", "api", "--dry-run"); code != 0 {
				t.Fatalf("recover --dry-run api: exit %d: %v", code, err)
			}
			if code, err := run(e, "unlock", "api", "--session", sessAPI); code != 0 {
				t.Fatalf("unlock api: exit %d: %v\nstderr: %s", code, err, e.errOut.String())
			}
			wantContains(t, "unlock api", e.out.String(), "Released the lock", "Marked revision 3 (pending-upgrade) failed")
			if w := strings.Join(e.writes(), ", "); strings.Contains(w, "leases") {
				t.Errorf("wrote Leases without the right to: %s", w)
			}
			if tc.noLeases && e.leaseRequests() > 0 {
				t.Errorf("%d requests on Leases with the release backend; want none", e.leaseRequests())
			}
		})
	}
}

// TestLockCommandsLeaseBackendForbidden: --lock-backend=lease needs the
// Lease rights, and says so with the API server's own message.
func TestLockCommandsLeaseBackendForbidden(t *testing.T) {
	e := newFakeEnv(t, fixture(t)...)
	e.denyLeases()
	code, err := e.run(t, newLocksCmd(e.c), "web", "--lock-backend=lease")
	if code == 0 || err == nil {
		t.Fatalf("locks --lock-backend=lease without Lease rights: exit 0")
	}
	wantContains(t, "error", err.Error(), `cannot get resource "leases" in API group "coordination.k8s.io"`)
}

// TestLockCommandsBadBackend: a bad backend is a usage error naming the
// flag, or the variable it came from.
func TestLockCommandsBadBackend(t *testing.T) {
	e := newFakeEnv(t, fixture(t)...)
	code, err := e.run(t, newLocksCmd(e.c), "--lock-backend=etcd")
	if code != exitcode.Usage || err == nil || !strings.Contains(err.Error(), `--lock-backend="etcd": must be auto, lease or release`) {
		t.Errorf("--lock-backend=etcd: exit %d, %v", code, err)
	}
	t.Setenv(guard.EnvLockBackend, "leases")
	e = newFakeEnv(t, fixture(t)...)
	code, err = e.run(t, newLocksCmd(e.c))
	if code != exitcode.Usage || err == nil || !strings.Contains(err.Error(), guard.EnvLockBackend+`="leases": must be auto, lease or release`) {
		t.Errorf("%s=leases: exit %d, %v", guard.EnvLockBackend, code, err)
	}
}
