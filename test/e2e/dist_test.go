package e2e

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
	"github.com/helm-autorecover/helm-autorecover/internal/version"
)

// TestPluginInstallsFromArchive (issue 15 item 3, issue 35 item 4): on a
// machine without Go (PATH without it) and outside a source checkout, the
// plugin's install hook takes this machine's archive (make dist,
// hack/dist.sh) from a local folder or an HTTP server named by
// HELM_AUTORECOVER_DIST, checks it against checksums.txt, and the plugin
// runs. An archive whose checksum does not match leaves nothing installed,
// under helm v3 and v4 alike (both keep a plugin whose install hook failed:
// the hook takes it out again): helm plugin list does not show it, the
// folder given to helm is left as it was, and a second install succeeds.
func TestPluginInstallsFromArchive(t *testing.T) {
	env := testenv.Get(t)
	dist := buildDist(t, env, runtime.GOOS+"/"+runtime.GOARCH)
	tampered := t.TempDir()
	for _, f := range []string{"checksums.txt", distArchive(t, runtime.GOOS, runtime.GOARCH)} {
		copyFile(t, filepath.Join(dist, f), filepath.Join(tampered, f), 0o644)
	}
	sums, err := os.ReadFile(filepath.Join(tampered, "checksums.txt"))
	if err != nil {
		t.Fatal(err)
	}
	bad := "0000000000000000" + string(sums)[16:]
	if err := os.WriteFile(filepath.Join(tampered, "checksums.txt"), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.FileServer(http.Dir(dist)))
	defer srv.Close()

	for _, c := range []struct{ name, helm, from string }{
		{"helm4 from a local folder", env.Helm4, dist},
		{"helm3 from an HTTP server", env.Helm3, srv.URL},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := pluginRelease(t, env)
			vars := append(helmHome(t.TempDir()), "HELM_AUTORECOVER_DIST="+c.from, "PATH=/usr/bin:/bin")
			if res := env.RunEnv(t, vars, c.helm, "plugin", "install", dir); res.ExitCode != 0 {
				t.Fatalf("plugin install: exit %d\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
			}
			res := env.RunEnv(t, vars, c.helm, "autorecover", "version")
			if res.ExitCode != 0 || !strings.Contains(res.Stdout, "helm-autorecover") {
				t.Fatalf("helm autorecover version: exit %d\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
			}
		})
	}
	for name, helm := range helms(env) {
		t.Run(name+": a checksum that does not match leaves nothing installed", func(t *testing.T) {
			dir := pluginRelease(t, env)
			home := helmHome(t.TempDir())
			vars := append(home, "HELM_AUTORECOVER_DIST="+tampered, "PATH=/usr/bin:/bin")
			res := env.RunEnv(t, vars, helm, "plugin", "install", dir)
			out := res.Stdout + res.Stderr
			if res.ExitCode == 0 || !strings.Contains(out, "checksum mismatch") || !strings.Contains(out, "nothing stays installed") {
				t.Errorf("plugin install from a tampered archive: exit %d; want a refusal naming the checksum and saying that nothing stays installed\n%s", res.ExitCode, out)
			}
			if _, err := os.Stat(filepath.Join(dir, "bin", "helm-autorecover")); err == nil {
				t.Error("a binary was installed from the tampered archive")
			}
			if _, err := os.Stat(filepath.Join(dir, "plugin.yaml")); err != nil {
				t.Errorf("the folder given to helm plugin install lost its plugin.yaml: %v", err)
			}
			if res := env.RunEnv(t, vars, helm, "plugin", "list"); strings.Contains(res.Stdout, "autorecover") {
				t.Errorf("helm plugin list after the failed install still shows the plugin:\n%s", res.Stdout)
			}
			entries, err := os.ReadDir(filepath.Join(strings.TrimPrefix(home[0], "HELM_DATA_HOME="), "plugins"))
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			for _, e := range entries {
				t.Errorf("helm's plugins folder keeps %s after the failed install", e.Name())
			}
			// The next install, from archives that are right, just works.
			vars = append(home, "HELM_AUTORECOVER_DIST="+dist, "PATH=/usr/bin:/bin")
			if res := env.RunEnv(t, vars, helm, "plugin", "install", dir); res.ExitCode != 0 {
				t.Fatalf("plugin install again: exit %d\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
			}
			if res := env.RunEnv(t, vars, helm, "autorecover", "version"); res.ExitCode != 0 || !strings.Contains(res.Stdout, "helm-autorecover "+version.Version) {
				t.Errorf("helm autorecover version: exit %d\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
			}
			// A binary gone later, and no way to get it: the plugin names
			// the command that takes it out.
			if err := os.Remove(filepath.Join(dir, "bin", "helm-autorecover")); err != nil {
				t.Fatal(err)
			}
			vars = append(home, "HELM_AUTORECOVER_DIST="+tampered, "PATH=/usr/bin:/bin")
			res = env.RunEnv(t, vars, helm, "autorecover", "version")
			if want := "remove it with `helm plugin uninstall autorecover`"; res.ExitCode == 0 || !strings.Contains(res.Stderr, want) {
				t.Errorf("helm autorecover version without its binary: exit %d; want a failure that says %q\n%s%s", res.ExitCode, want, res.Stdout, res.Stderr)
			}
		})
	}
}

// TestDistArchivesInstall (issue 35 item 5): the archives of make dist
// install the ways the README's Install section says, with the real helm
// v3 and v4: from a URL with both (helm v4 with --verify=false: there is no
// .prov signature; helm v3 again after an uninstall, which its download
// cache broke), and, after extracting one into a folder, from that folder
// with both. A .tar.gz given to helm as a file does not install (helm v3
// takes only folders; helm v4 wants the plugin in a folder inside the
// archive named after the archive, which helm v3 cannot install from a
// URL): the README says to extract it first, and this test notices when
// helm changes that. The windows archives are .zip files, listed in
// checksums.txt like the others.
func TestDistArchivesInstall(t *testing.T) {
	env := testenv.Get(t)
	platform := runtime.GOOS + "/" + runtime.GOARCH
	dist := buildDist(t, env, platform+" windows/amd64")
	archive := distArchive(t, runtime.GOOS, runtime.GOARCH)
	srv := httptest.NewServer(http.FileServer(http.Dir(dist)))
	defer srv.Close()
	url := srv.URL + "/" + archive
	extracted := filepath.Join(t.TempDir(), "helm-autorecover")
	if err := os.MkdirAll(extracted, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("tar", "-xzf", filepath.Join(dist, archive), "-C", extracted).CombinedOutput(); err != nil {
		t.Fatalf("tar -xzf %s: %v\n%s", archive, err, out)
	}

	// works installs source with helm (and flags) and runs the plugin; again
	// uninstalls it and installs it once more.
	works := func(t *testing.T, helm, source string, again bool, flags ...string) {
		t.Helper()
		vars := append(helmHome(t.TempDir()), "PATH=/usr/bin:/bin")
		install := append([]string{"plugin", "install", source}, flags...)
		rounds := 1
		if again {
			rounds = 2
		}
		for round := 1; round <= rounds; round++ {
			if round > 1 {
				if res := env.RunEnv(t, vars, helm, "plugin", "uninstall", "autorecover"); res.ExitCode != 0 {
					t.Fatalf("plugin uninstall: exit %d\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
				}
			}
			if res := env.RunEnv(t, vars, helm, install...); res.ExitCode != 0 {
				t.Fatalf("install #%d: exit %d\n%s%s", round, res.ExitCode, res.Stdout, res.Stderr)
			}
			res := env.RunEnv(t, vars, helm, "autorecover", "version")
			if res.ExitCode != 0 || !strings.Contains(res.Stdout, "helm-autorecover "+version.Version) {
				t.Fatalf("helm autorecover version after install #%d: exit %d\n%s%s", round, res.ExitCode, res.Stdout, res.Stderr)
			}
		}
	}
	// fails installs source with helm (and flags) and wants helm's refusal.
	fails := func(t *testing.T, helm, source, want string, flags ...string) {
		t.Helper()
		vars := append(helmHome(t.TempDir()), "PATH=/usr/bin:/bin")
		res := env.RunEnv(t, vars, helm, append([]string{"plugin", "install", source}, flags...)...)
		if res.ExitCode == 0 || !strings.Contains(res.Stderr, want) {
			t.Errorf("exit %d; want helm's refusal %q (has helm changed? update the README's Install section and this test)\n%s%s", res.ExitCode, want, res.Stdout, res.Stderr)
		}
	}
	t.Run("helm3 from a URL, twice", func(t *testing.T) { works(t, env.Helm3, url, true) })
	t.Run("helm4 from a URL with --verify=false, twice", func(t *testing.T) { works(t, env.Helm4, url, true, "--verify=false") })
	t.Run("helm3 from the extracted folder", func(t *testing.T) { works(t, env.Helm3, extracted, false) })
	t.Run("helm4 from the extracted folder", func(t *testing.T) { works(t, env.Helm4, extracted, false) })
	t.Run("helm4 from a URL wants a .prov", func(t *testing.T) {
		fails(t, env.Helm4, url, "no provenance file (.prov) found")
	})
	t.Run("helm3 from the .tar.gz file", func(t *testing.T) {
		fails(t, env.Helm3, filepath.Join(dist, archive), "expected plugin to be a folder")
	})
	t.Run("helm4 from the .tar.gz file", func(t *testing.T) {
		fails(t, env.Helm4, filepath.Join(dist, archive), "plugin.yaml not found in expected directory", "--verify=false")
	})

	t.Run("windows archives are .zip files", func(t *testing.T) {
		zipName := strings.TrimSuffix(distArchive(t, "windows", "amd64"), ".tar.gz") + ".zip"
		sums, err := os.ReadFile(filepath.Join(dist, "checksums.txt"))
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(dist, zipName))
		if err != nil {
			t.Fatalf("no %s: %v", zipName, err)
		}
		if want := fmt.Sprintf("%x  %s\n", sha256.Sum256(data), zipName); !strings.Contains(string(sums), want) {
			t.Errorf("checksums.txt does not list %q:\n%s", want, sums)
		}
		z, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			t.Fatalf("%s: %v", zipName, err)
		}
		var names []string
		for _, f := range z.File {
			names = append(names, f.Name)
		}
		for _, want := range []string{"plugin.yaml", "bin/helm-autorecover.exe", "hack/plugin-exec.sh", "docs/exit-codes.md"} {
			if !slices.Contains(names, want) {
				t.Errorf("%s holds %v; want %s at its top", zipName, names, want)
			}
		}
		if _, err := os.Stat(filepath.Join(dist, distArchive(t, "windows", "amd64"))); err == nil {
			t.Errorf("make dist still writes a .tar.gz for windows")
		}
	})
}

// buildDist runs hack/dist.sh, the code make dist runs, for platforms
// (os/arch, space-separated), packaging the binary the tests built for
// each, and returns the folder with the archives and checksums.txt.
func buildDist(t *testing.T, env *testenv.Env, platforms string) string {
	t.Helper()
	dist := t.TempDir()
	cmd := exec.Command(filepath.Join(env.RepoRoot, "hack", "dist.sh"))
	cmd.Env = append(os.Environ(), "DIST_DIR="+dist, "DIST_PLATFORMS="+platforms, "DIST_BINARY="+env.Bin(t))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/dist.sh: %v\n%s", err, out)
	}
	return dist
}

// distArchive is the name hack/dist.sh gives the .tar.gz of a platform (and
// the plugin's install hook fetches).
func distArchive(t *testing.T, goos, goarch string) string {
	return "helm-autorecover_" + pluginVersion(t) + "_" + goos + "_" + goarch + ".tar.gz"
}

// pluginRelease lays out the plugin's files as a release's source folder has
// them: no go.mod, no binary.
func pluginRelease(t *testing.T, env *testenv.Env) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "helm-autorecover")
	copyFile(t, filepath.Join(env.RepoRoot, "plugin.yaml"), filepath.Join(dir, "plugin.yaml"), 0o644)
	copyFile(t, filepath.Join(env.RepoRoot, "plugin.complete"), filepath.Join(dir, "plugin.complete"), 0o755)
	copyFile(t, filepath.Join(env.RepoRoot, "hack", "plugin-exec.sh"), filepath.Join(dir, "hack", "plugin-exec.sh"), 0o755)
	return dir
}

// pluginVersion is plugin.yaml's version.
func pluginVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "plugin.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^version:\s*"?([^"\s]+)"?\s*$`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("plugin.yaml has no version line:\n%s", data)
	}
	return string(m[1])
}
