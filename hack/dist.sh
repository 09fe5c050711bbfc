#!/usr/bin/env bash
# Builds the archives a machine without Go installs from (make dist):
#   $DIST_DIR/helm-autorecover_<version>_<os>_<arch>.tar.gz  (linux, darwin)
#   $DIST_DIR/helm-autorecover_<version>_windows_<arch>.zip
#   $DIST_DIR/checksums.txt          (sha256sum's format)
# <version> is plugin.yaml's, the one the plugin's install hook looks for.
# Each archive holds the plugin's files at its top level, with no folder
# around them and no "./" entry: plugin.yaml, plugin.complete,
# hack/plugin-exec.sh, bin/helm-autorecover (.exe on windows), README.md,
# CHANGELOG.md, docs/*.md (--help points at docs/exit-codes.md); each
# folder's entry comes before the files in it. That is
# the layout `helm plugin install <URL of the .tar.gz>` takes on helm v3
# (which looks for plugin.yaml at the top and creates folders one by one)
# and helm v4 (README.md, "Install", says which ways work).
#
#   DIST_PLATFORMS  os/arch pairs, space-separated (default: linux, darwin
#                   and windows on amd64 and arm64)
#   DIST_DIR        where to write them (default: dist)
#   LDFLAGS         the linker flags (the Makefile passes its own)
#   DIST_BINARY     package this binary instead of building one for each
#                   platform (the tests package the binary they built)
#   BUILD_JOBS      platforms built at a time (default: the number of CPUs;
#                   build_platforms in hack/lib.sh)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
platforms=${DIST_PLATFORMS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64 windows/arm64}
out=${DIST_DIR:-dist}
version=$(sed -n 's/^version: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' plugin.yaml)
if [ -z "$version" ]; then
  echo "dist: no version in plugin.yaml" >&2
  exit 1
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
# The archive's entries, in this order: tar and zip write a folder's entry
# before its files.
entries=(plugin.yaml plugin.complete README.md CHANGELOG.md docs hack bin)
names=()
if [ -z "${DIST_BINARY:-}" ]; then
  # shellcheck disable=SC2086 # platforms is a list
  build_platforms "$stage/build" $platforms
fi
for p in $platforms; do
  os=${p%/*}
  arch=${p#*/}
  name="helm-autorecover_${version}_${os}_${arch}"
  exe=helm-autorecover
  [ "$os" = windows ] && exe=helm-autorecover.exe
  dir="$stage/$name"
  mkdir -p "$dir/bin" "$dir/hack" "$dir/docs"
  echo "dist: $name" >&2
  if [ -n "${DIST_BINARY:-}" ]; then
    cp "$DIST_BINARY" "$dir/bin/$exe"
  else
    mv "$stage/build/${os}_${arch}/$exe" "$dir/bin/$exe"
  fi
  cp plugin.yaml plugin.complete README.md CHANGELOG.md "$dir/"
  cp hack/plugin-exec.sh "$dir/hack/"
  # The docs --help and the README point at (docs/exit-codes.md among
  # them), without the benchmarks' plots and data.
  cp docs/*.md "$dir/docs/"
  if [ "$os" = windows ]; then
    # A .zip, as Windows users (and helm's own releases) have them; python3
    # is one of the build's requirements, zip is not.
    rm -f "$out/$name.zip"
    (cd "$dir" && python3 - "$out/$name.zip" "${entries[@]}" <<'EOF'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as z:
    for top in sys.argv[2:]:
        z.write(top)
        for root, dirs, files in os.walk(top):
            dirs.sort()
            for d in dirs:
                z.write(os.path.join(root, d))
            for f in sorted(files):
                z.write(os.path.join(root, f))
EOF
    )
    names+=("$name.zip")
  else
    tar -C "$dir" -czf "$out/$name.tar.gz" "${entries[@]}"
    names+=("$name.tar.gz")
  fi
done
(cd "$out" && sha256sum "${names[@]}" > checksums.txt)
echo "dist: wrote ${#names[@]} archives and checksums.txt to $out" >&2
