package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/helm-autorecover/helm-autorecover/internal/exitcode"
	"github.com/helm-autorecover/helm-autorecover/internal/guard"
)

// TestExitCodeRule: one rule for every command, helm's and ours, as
// docs/exit-codes.md states it. A command line that cannot be used (unknown
// flag, a value that does not parse or is out of range, wrong arguments, a
// release name helm would refuse) exits 2 before anything is read or
// written; a bad HELM_AUTORECOVER_* variable fails only the commands that
// use it, in a sentence that names it. No case reaches a cluster: the
// kubeconfig points at a port nothing listens on, so a command that gets
// past its checks fails with 1 (helm's code for a cluster error).
func TestExitCodeRule(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	cfg := "apiVersion: v1\nkind: Config\nclusters:\n- name: none\n  cluster: {server: \"https://127.0.0.1:1\"}\nusers:\n- name: none\n  user: {token: x}\ncontexts:\n- name: none\n  context: {cluster: none, user: none, namespace: prod}\ncurrent-context: none\n"
	if err := os.WriteFile(kubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join("..", "testenv", "testdata", "charts", "app")
	t.Setenv("KUBECONFIG", kubeconfig)
	t.Setenv("HELM_CONFIG_HOME", filepath.Join(dir, "config"))
	t.Setenv("HELM_DATA_HOME", filepath.Join(dir, "data"))
	t.Setenv("HELM_CACHE_HOME", filepath.Join(dir, "cache"))
	for _, v := range []string{guard.EnvLockBackend, guard.EnvLeaseDuration, guard.EnvLockTimeout, guard.EnvRecoverLegacyAfter, guard.EnvAutorecover, guard.EnvRecoverDeleteData, guard.EnvRecoverStrategy, guard.EnvLockMaxHold, guard.EnvPreempt} {
		t.Setenv(v, "")
	}

	type tc struct {
		args []string
		env  map[string]string
		code int
		// stderr must contain want.
		want string
	}
	var cases []tc
	add := func(code int, want string, args ...string) {
		cases = append(cases, tc{args: args, code: code, want: want})
	}
	// Unknown flags, and unknown commands, on every kind of command.
	for _, cmd := range [][]string{
		{"install", "r", chart},
		{"upgrade", "r", chart},
		{"rollback", "r", "1"},
		{"uninstall", "r"},
		{"list"},
		{"status", "r"},
		{"history", "r"},
		{"version"},
		{"get", "values", "r"},
		{"locks"},
		{"unlock", "r", "--session", "s"},
		{"recover", "r"},
	} {
		add(exitcode.Usage, "unknown flag: --nosuch", append(cmd, "--nosuch")...)
	}
	add(exitcode.Usage, `unknown command "nosuchcmd"`, "nosuchcmd")
	// Flag values that do not parse or are out of range: the same code.
	for _, cmd := range [][]string{{"install", "r", chart}, {"upgrade", "r", chart}, {"rollback", "r", "1"}, {"uninstall", "r"}} {
		add(exitcode.Usage, `invalid argument "abc" for "--lease-duration"`, append(cmd, "--lease-duration", "abc")...)
		add(exitcode.Usage, "--lease-duration=0s: must be at least 3s", append(cmd, "--lease-duration", "0")...)
		add(exitcode.Usage, "--lease-duration=100h0m0s: must be at most 10m0s", append(cmd, "--lease-duration", "100h")...)
		add(exitcode.Usage, `--lock-backend="etcd": must be auto, lease or release`, append(cmd, "--lock-backend", "etcd")...)
		add(exitcode.Usage, `--recover-strategy="undo": must be fail or rollback`, append(cmd, "--recover-strategy", "undo")...)
		add(exitcode.Usage, `invalid argument "soon" for "--lock-timeout"`, append(cmd, "--lock-timeout", "soon")...)
		add(exitcode.Usage, `invalid argument "maybe" for "--autorecover"`, append(cmd, "--autorecover=maybe")...)
		add(exitcode.Usage, `invalid argument "maybe" for "--preempt"`, append(cmd, "--preempt=maybe")...)
	}
	add(exitcode.Usage, `invalid argument "abc" for "--timeout"`, "upgrade", "r", chart, "--timeout", "abc")
	add(exitcode.Usage, `--lock-backend="etcd": must be auto, lease or release`, "locks", "--lock-backend", "etcd")
	add(exitcode.Usage, `--lock-backend="etcd": must be auto, lease or release`, "unlock", "r", "--session", "s", "--lock-backend", "etcd")
	add(exitcode.Usage, `--lock-backend="etcd": must be auto, lease or release`, "recover", "r", "--lock-backend", "etcd")
	add(exitcode.Usage, `--output="xml": must be table, json or yaml`, "locks", "-o", "xml")
	// Release names helm would refuse.
	const badName = `release "Bad_Name" in namespace "prod": release name "Bad_Name" is not a DNS-1123 subdomain`
	add(exitcode.Usage, badName, "install", "Bad_Name", chart)
	add(exitcode.Usage, badName, "upgrade", "Bad_Name", chart)
	add(exitcode.Usage, badName, "rollback", "Bad_Name", "1")
	add(exitcode.Usage, badName, "uninstall", "ok", "Bad_Name")
	add(exitcode.Usage, badName, "locks", "Bad_Name")
	add(exitcode.Usage, badName, "unlock", "Bad_Name", "--session", "s")
	add(exitcode.Usage, badName, "recover", "Bad_Name")
	// Wrong numbers of arguments.
	add(exitcode.Usage, `"helm-autorecover install" requires at least 1 argument`, "install")
	add(exitcode.Usage, `"helm-autorecover upgrade" requires 2 arguments`, "upgrade", "r")
	add(exitcode.Usage, "locks: takes at most one argument", "locks", "a", "b")
	add(exitcode.Usage, "unlock: needs exactly one argument", "unlock", "--session", "s")
	add(exitcode.Usage, "recover: needs exactly one argument", "recover")
	// A bad variable fails only the commands that use it.
	envCase := func(env map[string]string, code int, want string, args ...string) {
		cases = append(cases, tc{args: args, env: env, code: code, want: want})
	}
	badLease := map[string]string{guard.EnvLeaseDuration: "abc"}
	const badLeaseMsg = `HELM_AUTORECOVER_LEASE_DURATION="abc" is not a duration (for example 30s, 5m or 1h30m): fix or unset it, or give the flag`
	envCase(badLease, exitcode.OK, "", "version")
	envCase(badLease, exitcode.OK, "", "upgrade", "--help")
	envCase(badLease, exitcode.OK, "", "__complete", "upgrade", "--lock-backend", "")
	envCase(badLease, exitcode.Failure, "127.0.0.1:1", "list")
	envCase(badLease, exitcode.Failure, "127.0.0.1:1", "locks")
	envCase(badLease, exitcode.Failure, "127.0.0.1:1", "unlock", "r", "--session", "s")
	envCase(badLease, exitcode.Usage, badLeaseMsg, "upgrade", "r", chart)
	envCase(badLease, exitcode.Usage, badLeaseMsg, "recover", "r")
	envCase(badLease, exitcode.Failure, "127.0.0.1:1", "upgrade", "r", chart, "--lease-duration", "20s")
	badLegacy := map[string]string{guard.EnvRecoverLegacyAfter: "later"}
	envCase(badLegacy, exitcode.Usage, `HELM_AUTORECOVER_RECOVER_LEGACY_AFTER="later" is not a duration`, "locks")
	envCase(badLegacy, exitcode.Failure, "127.0.0.1:1", "locks", "--recover-legacy-after", "1m")
	envCase(badLegacy, exitcode.Failure, "127.0.0.1:1", "unlock", "r", "--session", "s")
	badBackend := map[string]string{guard.EnvLockBackend: "leases"}
	envCase(badBackend, exitcode.OK, "", "version")
	envCase(badBackend, exitcode.Usage, `HELM_AUTORECOVER_LOCK_BACKEND="leases": must be auto, lease or release`, "locks")
	envCase(badBackend, exitcode.Usage, `HELM_AUTORECOVER_LOCK_BACKEND="leases": must be auto, lease or release`, "upgrade", "r", chart)
	badBool := map[string]string{guard.EnvRecoverDeleteData: "sure"}
	envCase(badBool, exitcode.Usage, `HELM_AUTORECOVER_RECOVER_DELETE_DATA="sure" is not true or false`, "unlock", "r", "--session", "s")
	envCase(badBool, exitcode.Failure, "127.0.0.1:1", "locks")
	// --preempt's variable: the guarded commands alone read it.
	badPreempt := map[string]string{guard.EnvPreempt: "soon"}
	const badPreemptMsg = `HELM_AUTORECOVER_PREEMPT="soon" is not true or false: fix or unset it, or give the flag`
	for _, cmd := range [][]string{{"install", "r", chart}, {"upgrade", "r", chart}, {"rollback", "r", "1"}, {"uninstall", "r"}} {
		envCase(badPreempt, exitcode.Usage, badPreemptMsg, cmd...)
	}
	envCase(badPreempt, exitcode.Failure, "127.0.0.1:1", "upgrade", "r", chart, "--preempt")
	envCase(badPreempt, exitcode.Failure, "127.0.0.1:1", "upgrade", "r", chart, "--preempt=false")
	envCase(badPreempt, exitcode.Failure, "127.0.0.1:1", "locks")
	envCase(badPreempt, exitcode.Failure, "127.0.0.1:1", "unlock", "r", "--session", "s")
	envCase(badPreempt, exitcode.Usage, "recover: needs exactly one argument", "recover")
	envCase(map[string]string{guard.EnvPreempt: "true"}, exitcode.Failure, "127.0.0.1:1", "upgrade", "r", chart)

	for _, c := range cases {
		name := strings.Join(c.args, " ")
		for k, v := range c.env {
			name = k + "=" + v + " " + name
		}
		t.Run(name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			var out, errOut bytes.Buffer
			code := Run(&out, &errOut, c.args)
			if code != c.code || !strings.Contains(errOut.String(), c.want) {
				t.Errorf("exit %d, want %d; stderr:\n%s\nwant it to contain %q", code, c.code, errOut.String(), c.want)
			}
			if strings.Contains(errOut.String(), "[HELM_AUTORECOVER") {
				t.Errorf("stderr has a raw Go list:\n%s", errOut.String())
			}
		})
	}
}
