#!/usr/bin/env sh
# Entry point of the helm plugin (plugin.yaml, plugin.complete):
#   plugin-exec.sh ARGS...             runs bin/helm-autorecover ARGS... in
#                                      place of this shell (exec), so that its
#                                      parent process is helm itself
#   plugin-exec.sh --build-only        install and update hook: puts
#                                      bin/helm-autorecover in place when it
#                                      is missing (see below)
#   plugin-exec.sh --complete ARGS...  shell completion (plugin.complete):
#                                      the binary's own completions of ARGS
#
# Where the binary comes from, when it is missing:
#   - HELM_AUTORECOVER_DIST set: the archive for this machine's OS and
#     architecture (make dist) from that location, a release URL (http or
#     https) or a local folder, checked against its checksums.txt. A
#     checksum that does not match stops the install; nothing is built.
#   - otherwise, in a source checkout (go.mod beside plugin.yaml): make build.
#   - otherwise: the archive from this version's GitHub release.
set -e
dir=${HELM_PLUGIN_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
bin="$dir/bin/helm-autorecover"
if [ "${1:-}" = "--complete" ]; then
  shift
  # Never build while a shell waits for completions. helm v4 reads the
  # command's stderr as completions too: cobra's closing note on stderr
  # ("Completion ended with directive: ...") must not reach it.
  [ -x "$bin" ] || exit 0
  exec "$bin" __complete "$@" 2>/dev/null
fi

die() {
  echo "helm-autorecover: $*" >&2
  exit 1
}

# fetch copies $1 (a URL or a path) to $2.
fetch() {
  case $1 in
    http://* | https://*)
      if command -v curl >/dev/null 2>&1; then
        curl -fsSL -o "$2" "$1"
      else
        wget -q -O "$2" "$1"
      fi
      ;;
    *) cp "$1" "$2" ;;
  esac
}

# install_archive puts the binary of this machine's archive of $version
# from $1 in place.
install_archive() {
  from=${1%/}
  os=$(uname -s | tr '[:upper:]' '[:lower:]')
  case $(uname -m) in
    x86_64 | amd64) arch=amd64 ;;
    aarch64 | arm64) arch=arm64 ;;
    *) die "no archive for the $(uname -m) architecture; build from source: make build" ;;
  esac
  name="helm-autorecover_${version}_${os}_${arch}.tar.gz"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "helm-autorecover: installing $name from $from" >&2
  fetch "$from/$name" "$tmp/$name" || die "cannot get $from/$name"
  fetch "$from/checksums.txt" "$tmp/checksums.txt" || die "cannot get $from/checksums.txt"
  want=$(awk -v f="$name" '$2 == f || $2 == "*" f { print $1 }' "$tmp/checksums.txt")
  if command -v sha256sum >/dev/null 2>&1; then
    have=$(sha256sum "$tmp/$name" | cut -d' ' -f1)
  else
    have=$(shasum -a 256 "$tmp/$name" | cut -d' ' -f1)
  fi
  [ -n "$want" ] || die "$from/checksums.txt lists no checksum for $name"
  [ "$want" = "$have" ] || die "checksum mismatch for $name from $from: checksums.txt says $want, the archive is $have; nothing was installed"
  mkdir -p "$tmp/x"
  tar -xzf "$tmp/$name" -C "$tmp/x" ./bin/helm-autorecover || die "$name has no bin/helm-autorecover"
  mkdir -p "$dir/bin"
  mv "$tmp/x/bin/helm-autorecover" "$bin.tmp"
  chmod 755 "$bin.tmp"
  mv "$bin.tmp" "$bin"
}

if [ ! -x "$bin" ]; then
  version=$(sed -n 's/^version: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$dir/plugin.yaml")
  if [ -n "${HELM_AUTORECOVER_DIST:-}" ]; then
    install_archive "$HELM_AUTORECOVER_DIST"
  elif [ -f "$dir/go.mod" ]; then
    echo "helm-autorecover: building $bin (needs Go 1.26)" >&2
    (cd "$dir" && make build >&2)
  else
    install_archive "https://github.com/helm-autorecover/helm-autorecover/releases/download/v$version"
  fi
fi
if [ "${1:-}" = "--build-only" ]; then
  exit 0
fi
exec "$bin" "$@"
