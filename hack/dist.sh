#!/usr/bin/env bash
# Builds the archives a machine without Go installs from (make dist):
#   $DIST_DIR/helm-autorecover_<version>_<os>_<arch>.tar.gz
#   $DIST_DIR/checksums.txt          (sha256sum's format)
# <version> is plugin.yaml's, the one the plugin's install hook looks for.
# Each archive is the plugin's folder, ready for `helm plugin install`:
# plugin.yaml, plugin.complete, hack/plugin-exec.sh, bin/helm-autorecover
# (.exe on windows), README.md, CHANGELOG.md.
#
#   DIST_PLATFORMS  os/arch pairs, space-separated (default: linux, darwin
#                   and windows on amd64 and arm64)
#   DIST_DIR        where to write them (default: dist)
#   LDFLAGS         the linker flags (the Makefile passes its own)
#   DIST_BINARY     package this binary instead of building one (a single
#                   platform, the binary's own: the tests package the
#                   binary they built)
set -euo pipefail
cd "$(dirname "$0")/.."
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
names=()
for p in $platforms; do
  os=${p%/*}
  arch=${p#*/}
  name="helm-autorecover_${version}_${os}_${arch}"
  exe=helm-autorecover
  [ "$os" = windows ] && exe=helm-autorecover.exe
  dir="$stage/$name"
  mkdir -p "$dir/bin" "$dir/hack"
  echo "dist: $name" >&2
  if [ -n "${DIST_BINARY:-}" ]; then
    cp "$DIST_BINARY" "$dir/bin/$exe"
  else
    CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -ldflags "${LDFLAGS:-}" -o "$dir/bin/$exe" ./cmd/helm-autorecover
  fi
  cp plugin.yaml plugin.complete README.md CHANGELOG.md "$dir/"
  cp hack/plugin-exec.sh "$dir/hack/"
  tar -C "$dir" -czf "$out/$name.tar.gz" .
  names+=("$name.tar.gz")
done
(cd "$out" && sha256sum "${names[@]}" > checksums.txt)
echo "dist: wrote ${#names[@]} archives and checksums.txt to $out" >&2
