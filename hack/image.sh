#!/usr/bin/env bash
# Builds the controller's image (make image): helm-autorecover for each
# platform, then one OCI image index over them, written as an OCI archive by
# hack/image (go-containerregistry, no container daemon):
#   $IMAGE_OUT (default dist/helm-autorecover-image.tar)
# tagged <IMAGE_REPOSITORY>:<version>, where <version> is plugin.yaml's, the
# project version (internal/version.Version), which the chart's appVersion,
# its default image tag, repeats. The same commit gives the same archive,
# byte for byte.
#
#   IMAGE_PLATFORMS   linux os/arch pairs (default: linux/amd64 linux/arm64);
#                     the first is the one an old docker tags (hack/image)
#   IMAGE_REPOSITORY  default ghcr.io/helm-autorecover/helm-autorecover, the
#                     chart's image.repository
#   IMAGE_SOURCE      org.opencontainers.image.source (default: Chart.yaml's home)
#   IMAGE_REVISION    org.opencontainers.image.revision (default: the commit,
#                     with -dirty after it when tracked files are changed)
#   SOURCE_DATE_EPOCH the image's time (default: the commit's time)
#   IMAGE_BIN_DIR     where the binaries are built (default: bin/image)
#   LDFLAGS           the linker flags (the Makefile passes its own)
#   BUILD_JOBS        builds at a time (default: the number of CPUs)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
platforms=${IMAGE_PLATFORMS:-linux/amd64 linux/arm64}
out=${IMAGE_OUT:-dist/helm-autorecover-image.tar}
bindir=${IMAGE_BIN_DIR:-bin/image}
version=$(sed -n 's/^version: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' plugin.yaml)
[[ -n $version ]] || die "image: no version in plugin.yaml"
revision=${IMAGE_REVISION:-}
if [[ -z $revision || -z ${SOURCE_DATE_EPOCH:-} ]] && ! git rev-parse --verify -q HEAD >/dev/null; then
  die "image: not a git checkout: set IMAGE_REVISION (the commit) and SOURCE_DATE_EPOCH (its time)"
fi
if [[ -z $revision ]]; then
  revision=$(git rev-parse HEAD)
  git diff --quiet HEAD -- || revision+=-dirty
fi
created=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct HEAD)}
source_url=${IMAGE_SOURCE:-$(sed -n 's/^home: *//p' charts/helm-autorecover/Chart.yaml)}

[[ $bindir == /* ]] || bindir=$REPO_ROOT/$bindir
[[ $out == /* ]] || out=$REPO_ROOT/$out

# shellcheck disable=SC2086 # platforms is a list
build_platforms "$bindir" $platforms
args=()
for p in $platforms; do
  args+=(-binary "$p=$bindir/${p%/*}_${p#*/}/helm-autorecover")
done
go -C hack/image run . -out "$out" -repository "${IMAGE_REPOSITORY:-ghcr.io/helm-autorecover/helm-autorecover}" \
  -version "$version" -revision "$revision" -source "$source_url" -created "$created" "${args[@]}"
