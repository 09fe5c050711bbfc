// Command image packs helm-autorecover binaries, already built for Linux,
// into one multi-platform OCI image and writes it as an archive that
// `docker load`, `kind load image-archive` and containerd's import take
// (make image, through hack/image.sh). No container daemon is involved: the
// layers, configs, manifests and the index are made in this process with
// go-containerregistry.
//
// The archive is reproducible: the same binaries and flags give the same
// bytes, so the same commit and toolchain give the same image digest. Every
// time in it is -created; nothing reads the clock, the user or the host.
//
// What the archive holds:
//
//	oci-layout, index.json, blobs/sha256/...   an OCI image layout; index.json
//	    names one image index (annotations io.containerd.image.name and
//	    org.opencontainers.image.ref.name), which names one image per platform
//	manifest.json   the same images in `docker save`'s format, for a docker
//	    whose image store is not containerd's (it reads only this file)
//
// Each image is one layer over nothing (no base image): the binary at
// /usr/local/bin/helm-autorecover, /etc/passwd and /etc/group naming the
// user nonroot (65532), its home, and /tmp. The binary is static
// (CGO_ENABLED=0) and talks to the API server with the service account's CA,
// so the image carries no CA bundle, time zone data or libc.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	binaryPath = "/usr/local/bin/helm-autorecover"
	// user is distroless's nonroot: numeric, so that the kubelet can check
	// the chart's runAsNonRoot without reading /etc/passwd.
	user     = "65532:65532"
	userID   = 65532
	userHome = "/home/nonroot"
)

// binaries is the repeated -binary flag: os/arch=path, in the order given.
type binaries []platformBinary

type platformBinary struct {
	platform v1.Platform
	path     string
}

func (b *binaries) String() string { return fmt.Sprint(*b) }

func (b *binaries) Set(s string) error {
	plat, path, ok := strings.Cut(s, "=")
	goos, arch, ok2 := strings.Cut(plat, "/")
	if !ok || !ok2 || goos != "linux" || arch == "" || path == "" {
		return fmt.Errorf("-binary %q: want linux/<arch>=<path of the binary built for it>", s)
	}
	p := v1.Platform{OS: goos, Architecture: arch}
	if arch == "arm64" {
		// What docker buildx and containerd write for arm64.
		p.Variant = "v8"
	}
	*b = append(*b, platformBinary{platform: p, path: path})
	return nil
}

type options struct {
	out        string
	repository string
	version    string
	revision   string
	source     string
	created    time.Time
	binaries   binaries
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var o options
	var created string
	flags := flag.NewFlagSet("image", flag.ContinueOnError)
	flags.StringVar(&o.out, "out", "", "the archive to write")
	flags.StringVar(&o.repository, "repository", "", "the image's repository, e.g. ghcr.io/helm-autorecover/helm-autorecover")
	flags.StringVar(&o.version, "version", "", "the project version: the tag and the org.opencontainers.image.version label")
	flags.StringVar(&o.revision, "revision", "", "the commit (org.opencontainers.image.revision)")
	flags.StringVar(&o.source, "source", "", "the source repository's URL (org.opencontainers.image.source)")
	flags.StringVar(&created, "created", "", "the image's time, in seconds since 1970 (SOURCE_DATE_EPOCH; make image uses the commit's time)")
	flags.Var(&o.binaries, "binary", "linux/<arch>=<path>, once per platform")
	if err := flags.Parse(args); err != nil {
		return err
	}
	secs, err := strconv.ParseInt(created, 10, 64)
	if err != nil {
		return fmt.Errorf("-created %q: want seconds since 1970: %w", created, err)
	}
	o.created = time.Unix(secs, 0).UTC()
	if o.out == "" || o.repository == "" || o.version == "" || o.revision == "" || len(o.binaries) == 0 {
		return errors.New("-out, -repository, -version, -revision and at least one -binary are required")
	}
	return build(o)
}

func build(o options) error {
	labels := map[string]string{
		"org.opencontainers.image.title":    "helm-autorecover",
		"org.opencontainers.image.source":   o.source,
		"org.opencontainers.image.version":  o.version,
		"org.opencontainers.image.revision": o.revision,
		"org.opencontainers.image.created":  o.created.Format(time.RFC3339),
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var images []v1.Image
	for _, b := range o.binaries {
		img, err := platformImage(o, b, labels)
		if err != nil {
			return err
		}
		images = append(images, img)
		p := b.platform
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	idx = mutate.Annotations(idx, labels).(v1.ImageIndex)

	dir, err := os.MkdirTemp("", "helm-autorecover-image-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	ref := o.repository + ":" + o.version
	// containerd (kind, docker's containerd store) names the image after
	// io.containerd.image.name; the OCI annotation holds the tag alone, as
	// `docker save` writes it.
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          ref,
		"org.opencontainers.image.ref.name": o.version,
	})); err != nil {
		return fmt.Errorf("writing the OCI layout: %w", err)
	}
	manifest, err := dockerManifest(images, ref)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), manifest, 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	tmp := o.out + ".tmp"
	if err := tarFolder(dir, tmp, o.created); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, o.out); err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s %s@%s\n", o.out, ref, digest)
	return nil
}

// platformImage is one platform's image: its layer and a config that runs
// the binary as nonroot.
func platformImage(o options, b platformBinary, labels map[string]string) (v1.Image, error) {
	raw, err := rootfs(b.path, o.created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression), tarball.WithCompressedCaching)
	if err != nil {
		return nil, err
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer})
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS = b.platform.OS
	cfg.Architecture = b.platform.Architecture
	cfg.Variant = b.platform.Variant
	cfg.Created = v1.Time{Time: o.created}
	cfg.History = []v1.History{{Created: v1.Time{Time: o.created}, CreatedBy: "make image (hack/image)", Comment: "helm-autorecover " + o.version}}
	cfg.Config = v1.Config{
		User:       user,
		Entrypoint: []string{binaryPath},
		Env:        []string{"PATH=/usr/local/bin"},
		WorkingDir: "/",
		Labels:     labels,
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.path, err)
	}
	return img, nil
}

// rootfs is the layer's tar: every entry owned by root but nonroot's home,
// every time the image's, in a fixed order.
func rootfs(binary string, created time.Time) ([]byte, error) {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, fmt.Errorf("the binary for the image: %w (make image builds it)", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string, mode int64, id int) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: id, Gid: id, ModTime: created, Format: tar.FormatUSTAR})
	}
	file := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: created, Format: tar.FormatUSTAR}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	steps := []func() error{
		func() error { return dir("etc", 0o755, 0) },
		func() error {
			return file("etc/group", 0o644, []byte("root:x:0:\nnonroot:x:65532:\n"))
		},
		func() error {
			return file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:"+userHome+":/sbin/nologin\n"))
		},
		func() error { return dir("home", 0o755, 0) },
		func() error { return dir(strings.TrimPrefix(userHome, "/"), 0o700, userID) },
		// /tmp for helm's folders when nothing is mounted there (the chart
		// mounts an emptyDir), sticky and writable by all as usual.
		func() error { return dir("tmp", 0o1777, 0) },
		func() error { return dir("usr", 0o755, 0) },
		func() error { return dir("usr/local", 0o755, 0) },
		func() error { return dir("usr/local/bin", 0o755, 0) },
		func() error { return file(strings.TrimPrefix(binaryPath, "/"), 0o755, bin) },
		tw.Close,
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}

// dockerManifest is manifest.json as `docker save` writes it, one entry per
// image, each tagged ref. A docker without the containerd store loads every
// entry and the last one keeps the tag, so the first platform given (the
// usual one, linux/amd64) comes last; `docker load --platform` loads one.
func dockerManifest(images []v1.Image, ref string) ([]byte, error) {
	type entry struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	var entries []entry
	for _, img := range slices.Backward(images) {
		name, err := img.ConfigName()
		if err != nil {
			return nil, err
		}
		e := entry{Config: blobPath(name), RepoTags: []string{ref}}
		layers, err := img.Layers()
		if err != nil {
			return nil, err
		}
		for _, l := range layers {
			d, err := l.Digest()
			if err != nil {
				return nil, err
			}
			e.Layers = append(e.Layers, blobPath(d))
		}
		entries = append(entries, e)
	}
	return json.Marshal(entries)
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// tarFolder writes the layout folder as a tar: oci-layout, index.json and
// manifest.json first, then the blobs, folders before their files, names
// sorted, one owner and one time.
func tarFolder(dir, out string, created time.Time) error {
	var names []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		names = append(names, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return err
	}
	first := map[string]int{"oci-layout": 0, "index.json": 1, "manifest.json": 2}
	slices.SortFunc(names, func(a, b string) int {
		ra, oka := first[a]
		rb, okb := first[b]
		switch {
		case oka && okb:
			return ra - rb
		case oka:
			return -1
		case okb:
			return 1
		}
		return strings.Compare(a, b)
	})
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	err = writeTar(f, dir, names, created)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func writeTar(w io.Writer, dir string, names []string, created time.Time) error {
	tw := tar.NewWriter(w)
	for _, name := range names {
		path := filepath.Join(dir, filepath.FromSlash(name))
		info, err := os.Stat(path)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: name, Mode: 0o644, ModTime: created, Format: tar.FormatUSTAR}
		if info.IsDir() {
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, name+"/", 0o755
		} else {
			hdr.Typeflag, hdr.Size = tar.TypeReg, info.Size()
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.IsDir() {
			if err := copyFile(tw, path); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

func copyFile(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	_, err = io.Copy(w, f)
	return err
}
