// Package image tests `make image` (issue 33 item 1): the archive it writes
// is one OCI index over linux/amd64 and linux/arm64, each image running the
// binary as a non-root user, labelled with the source, version, commit and
// time, tagged as the chart expects; the same inputs give the same bytes; the
// binary in it runs and reports the commit it was built from; and a registry
// takes it the way docs/controller.md says (crane push --index). It reads the
// archive with archive/tar and encoding/json only, so that
// go-containerregistry stays in hack/image's module.
package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	yamlutil "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/helm-autorecover/helm-autorecover/internal/testenv"
	"github.com/helm-autorecover/helm-autorecover/internal/version"
)

const (
	// The commit `make image` stamps into the binaries (COMMIT=) and the
	// revision and time it labels the images with: none of them this
	// checkout's, so that the test sees they come from its inputs.
	commit   = "0123abc"
	revision = "0123abcdef0123abcdef0123abcdef0123abcdef"
	epoch    = 1700000000
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
	Platform    *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
		Variant      string `json:"variant"`
	} `json:"platform"`
}

type index struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	Manifests     []descriptor      `json:"manifests"`
	Annotations   map[string]string `json:"annotations"`
}

type manifest struct {
	MediaType string       `json:"mediaType"`
	Config    descriptor   `json:"config"`
	Layers    []descriptor `json:"layers"`
}

type config struct {
	OS           string    `json:"os"`
	Architecture string    `json:"architecture"`
	Created      time.Time `json:"created"`
	Config       struct {
		User       string            `json:"User"`
		Entrypoint []string          `json:"Entrypoint"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
	RootFS struct {
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// archive is an image archive read into memory: its entries in order and the
// contents of its files.
type archive struct {
	names []string
	files map[string][]byte
}

func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds helm-autorecover for two platforms")
	}
	root := testenv.RepoRoot()
	tmp := t.TempDir()
	repo, tag := chartImage(t, root)
	ref := repo + ":" + tag

	first := filepath.Join(tmp, "first.tar")
	makeImage(t, root, filepath.Join(tmp, "bin1"), first)
	a := readArchive(t, first)

	// The layout: oci-layout, index.json and manifest.json first, then the
	// blobs, each named by its digest.
	if got := a.names[:min(3, len(a.names))]; !slices.Equal(got, []string{"oci-layout", "index.json", "manifest.json"}) {
		t.Errorf("the archive starts with %q; want oci-layout, index.json, manifest.json", got)
	}
	var ociLayout struct {
		ImageLayoutVersion string `json:"imageLayoutVersion"`
	}
	if a.json(t, "oci-layout", &ociLayout); ociLayout.ImageLayoutVersion != "1.0.0" {
		t.Errorf("oci-layout is %q; want imageLayoutVersion 1.0.0", a.files["oci-layout"])
	}
	for name, data := range a.files {
		if hexdigest, ok := strings.CutPrefix(name, "blobs/sha256/"); ok {
			if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != hexdigest {
				t.Errorf("%s holds content of digest sha256:%x", name, sum)
			}
		}
	}

	// index.json names one image index, tagged as the chart's default image.
	var top index
	a.json(t, "index.json", &top)
	if len(top.Manifests) != 1 {
		t.Fatalf("index.json names %d manifests; want 1 (the image index)", len(top.Manifests))
	}
	desc := top.Manifests[0]
	if desc.MediaType != "application/vnd.oci.image.index.v1+json" {
		t.Errorf("index.json names a %s; want an OCI image index", desc.MediaType)
	}
	if got := desc.Annotations["io.containerd.image.name"]; got != ref {
		t.Errorf("io.containerd.image.name is %q; want %q (the chart's image.repository and appVersion)", got, ref)
	}
	if got := desc.Annotations["org.opencontainers.image.ref.name"]; got != tag {
		t.Errorf("org.opencontainers.image.ref.name is %q; want %q", got, tag)
	}
	var idx index
	a.blob(t, desc, &idx)
	wantLabels := map[string]string{
		"org.opencontainers.image.title":    "helm-autorecover",
		"org.opencontainers.image.source":   "https://github.com/helm-autorecover/helm-autorecover",
		"org.opencontainers.image.version":  version.Version,
		"org.opencontainers.image.revision": revision,
		"org.opencontainers.image.created":  time.Unix(epoch, 0).UTC().Format(time.RFC3339),
	}
	if !maps.Equal(idx.Annotations, wantLabels) {
		t.Errorf("the index's annotations are %v; want %v", idx.Annotations, wantLabels)
	}

	// One image per platform, each running the binary as nonroot.
	var platforms []string
	configs := map[string]string{} // platform -> config blob
	layers := map[string]descriptor{}
	for _, d := range idx.Manifests {
		if d.Platform == nil {
			t.Fatalf("the index names %s without a platform", d.Digest)
		}
		plat := d.Platform.OS + "/" + d.Platform.Architecture
		platforms = append(platforms, plat)
		var m manifest
		a.blob(t, d, &m)
		if m.MediaType != "application/vnd.oci.image.manifest.v1+json" || len(m.Layers) != 1 {
			t.Fatalf("%s: a %s of %d layers; want an OCI manifest of one layer", plat, m.MediaType, len(m.Layers))
		}
		var c config
		a.blob(t, m.Config, &c)
		configs[plat] = "blobs/sha256/" + strings.TrimPrefix(m.Config.Digest, "sha256:")
		layers[plat] = m.Layers[0]
		if c.OS+"/"+c.Architecture != plat {
			t.Errorf("%s: the config is for %s/%s", plat, c.OS, c.Architecture)
		}
		uid, _, _ := strings.Cut(c.Config.User, ":")
		if n, err := strconv.Atoi(uid); err != nil || n == 0 {
			t.Errorf("%s: the image runs as user %q; want a numeric non-root user (the chart's runAsNonRoot)", plat, c.Config.User)
		}
		if !slices.Equal(c.Config.Entrypoint, []string{"/usr/local/bin/helm-autorecover"}) {
			t.Errorf("%s: the entrypoint is %q; want the binary", plat, c.Config.Entrypoint)
		}
		if !maps.Equal(c.Config.Labels, wantLabels) {
			t.Errorf("%s: the labels are %v; want %v", plat, c.Config.Labels, wantLabels)
		}
		if !c.Created.Equal(time.Unix(epoch, 0)) {
			t.Errorf("%s: created %s; want %s (SOURCE_DATE_EPOCH)", plat, c.Created, time.Unix(epoch, 0).UTC())
		}
	}
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Fatalf("the index holds %v; want linux/amd64 and linux/arm64", platforms)
	}

	// manifest.json, for a docker without the containerd store: both images,
	// tagged, linux/amd64 last (the one such a docker keeps the tag on).
	var legacy []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	a.json(t, "manifest.json", &legacy)
	if len(legacy) != 2 || legacy[0].Config != configs["linux/arm64"] || legacy[1].Config != configs["linux/amd64"] {
		t.Errorf("manifest.json is %+v; want the linux/arm64 image, then the linux/amd64 one (configs %v)", legacy, configs)
	}
	for _, e := range legacy {
		if !slices.Equal(e.RepoTags, []string{ref}) {
			t.Errorf("manifest.json tags %s as %q; want [%q]", e.Config, e.RepoTags, ref)
		}
		for _, l := range append([]string{e.Config}, e.Layers...) {
			if _, ok := a.files[l]; !ok {
				t.Errorf("manifest.json names %s, which the archive does not hold", l)
			}
		}
	}

	// The binary of this machine's platform runs and reports the commit.
	t.Run("runs", func(t *testing.T) {
		plat := runtime.GOOS + "/" + runtime.GOARCH
		layer, ok := layers[plat]
		if !ok {
			t.Skipf("the image has no %s binary", plat)
		}
		fsys := a.layer(t, layer)
		if passwd := string(fsys["etc/passwd"].data); !strings.Contains(passwd, ":65532:65532:") {
			t.Errorf("/etc/passwd has no entry for 65532:\n%s", passwd)
		}
		if tmpDir, ok := fsys["tmp/"]; !ok || tmpDir.mode != 0o1777 {
			t.Errorf("/tmp: %+v; want a folder of mode 1777", tmpDir)
		}
		bin := filepath.Join(t.TempDir(), "helm-autorecover")
		f, ok := fsys["usr/local/bin/helm-autorecover"]
		if !ok || f.mode != 0o755 {
			t.Fatalf("usr/local/bin/helm-autorecover: %+v; want an executable", f.mode)
		}
		if err := os.WriteFile(bin, f.data, 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "version").CombinedOutput()
		want := fmt.Sprintf("helm-autorecover %s (commit %q,", version.Version, commit)
		if err != nil || !strings.HasPrefix(string(out), want) {
			t.Errorf("%s version: %v\n%s\nwant it to start with %s", plat, err, out, want)
		}
	})

	// The same commit gives the same archive: built again from the start
	// (the binaries linked again, in a folder of their own), byte for byte.
	second := filepath.Join(tmp, "second.tar")
	makeImage(t, root, filepath.Join(tmp, "bin2"), second)
	if a, b := fileSum(t, first), fileSum(t, second); a != b {
		t.Errorf("two builds of one commit differ: sha256 %s and %s", a, b)
	}

	// A registry takes it as docs/controller.md says: the archive unpacked,
	// then crane push (which pushes the one image index index.json names;
	// --index would push index.json itself, an index of that index); the
	// registry then serves that index, both platforms.
	t.Run("crane push", func(t *testing.T) {
		dir := t.TempDir()
		crane := filepath.Join(dir, "crane")
		build := exec.Command("go", "-C", filepath.Join(root, "hack", "image"), "build", "-o", crane, "github.com/google/go-containerregistry/cmd/crane")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building crane (hack/image/go.mod's tool): %v\n%s", err, out)
		}
		host := serveRegistry(t, crane)
		layout := filepath.Join(dir, "layout")
		if err := os.Mkdir(layout, 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("tar", "-xf", first, "-C", layout).CombinedOutput(); err != nil {
			t.Fatalf("tar -xf: %v\n%s", err, out)
		}
		dst := host + "/helm-autorecover:" + tag
		if out, err := exec.Command(crane, "push", layout, dst).CombinedOutput(); err != nil {
			t.Fatalf("crane push: %v\n%s", err, out)
		}
		out, err := exec.Command(crane, "digest", dst).Output()
		if got := strings.TrimSpace(string(out)); err != nil || got != desc.Digest {
			t.Errorf("crane digest %s: %q, %v; want %s (the archive's index)", dst, got, err, desc.Digest)
		}
		out, err = exec.Command(crane, "config", "--platform", "linux/arm64", dst).Output()
		if err != nil || !bytes.Contains(out, []byte(`"architecture":"arm64"`)) {
			t.Errorf("crane config --platform linux/arm64: %v\n%s", err, out)
		}
	})
}

// chartImage returns the image the chart runs by default: values.yaml's
// image.repository and Chart.yaml's appVersion (image.tag is empty).
func chartImage(t *testing.T, root string) (repo, tag string) {
	t.Helper()
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	var values struct {
		Image struct {
			Repository string `json:"repository"`
			Tag        string `json:"tag"`
		} `json:"image"`
	}
	for file, into := range map[string]any{"Chart.yaml": &chart, "values.yaml": &values} {
		raw, err := os.ReadFile(filepath.Join(root, "charts", "helm-autorecover", file))
		if err != nil {
			t.Fatal(err)
		}
		if err := yamlutil.Unmarshal(raw, into); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	if values.Image.Tag != "" || chart.AppVersion != version.Version {
		t.Fatalf("the chart's default image tag is %q (image.tag) or %q (appVersion); want appVersion, equal to internal/version.Version %q", values.Image.Tag, chart.AppVersion, version.Version)
	}
	return values.Image.Repository, chart.AppVersion
}

// makeImage runs `make image` with this test's commit, revision and time,
// building the binaries in bin and writing the archive out.
func makeImage(t *testing.T, root, bin, out string) {
	t.Helper()
	cmd := exec.Command("make", "image", "COMMIT="+commit)
	cmd.Dir = root
	cmd.Env = append(os.Environ(),
		"IMAGE_OUT="+out,
		"IMAGE_BIN_DIR="+bin,
		"IMAGE_REVISION="+revision,
		"SOURCE_DATE_EPOCH="+strconv.Itoa(epoch),
		"IMAGE_PLATFORMS=", // the default
		"IMAGE_REPOSITORY=",
		"IMAGE_SOURCE=",
	)
	start := time.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, b)
	} else {
		t.Logf("make image (%s):\n%s", time.Since(start).Round(time.Second), b)
	}
}

func readArchive(t *testing.T, path string) archive {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	a := archive{files: map[string][]byte{}}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return a
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		a.names = append(a.names, hdr.Name)
		if hdr.Typeflag == tar.TypeReg {
			if a.files[hdr.Name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func (a archive) json(t *testing.T, name string, into any) {
	t.Helper()
	data, ok := a.files[name]
	if !ok {
		t.Fatalf("the archive has no %s", name)
	}
	if err := json.Unmarshal(data, into); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// blob decodes the blob d names, after checking its size.
func (a archive) blob(t *testing.T, d descriptor, into any) {
	t.Helper()
	name := "blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:")
	if got := int64(len(a.files[name])); got != d.Size {
		t.Fatalf("%s: %d bytes; the descriptor says %d", name, got, d.Size)
	}
	a.json(t, name, into)
}

type entry struct {
	mode int64
	data []byte
}

// layer returns the files and folders of a gzipped layer by name.
func (a archive) layer(t *testing.T, d descriptor) map[string]entry {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(a.files["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]))
	if err != nil {
		t.Fatalf("layer %s: %v", d.Digest, err)
	}
	fsys := map[string]entry{}
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return fsys
		}
		if err != nil {
			t.Fatalf("layer %s: %v", d.Digest, err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		fsys[hdr.Name] = entry{mode: hdr.Mode, data: data}
	}
}

// serveRegistry starts `crane registry serve` on a free loopback port,
// stopped (killed) when the test ends, and returns its host:port.
func serveRegistry(t *testing.T, crane string) string {
	t.Helper()
	cmd := exec.Command(crane, "registry", "serve", "--address", "127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	serving := regexp.MustCompile(`serving on port (\d+)`)
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if m := serving.FindStringSubmatch(sc.Text()); m != nil {
			go func() { _, _ = io.Copy(io.Discard, stderr) }()
			return "127.0.0.1:" + m[1]
		}
	}
	t.Fatalf("crane registry serve ended without saying its port: %v", sc.Err())
	return ""
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
