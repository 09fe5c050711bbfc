#!/usr/bin/env sh
# Entry point of the helm plugin (plugin.yaml, plugin.complete):
#   plugin-exec.sh ARGS...             runs bin/helm-autorecover ARGS... in
#                                      place of this shell (exec), so that its
#                                      parent process is helm itself
#   plugin-exec.sh --install-hook      install hook: puts bin/helm-autorecover
#                                      in place when it is missing (see
#                                      below); when that fails, takes the
#                                      plugin out of helm's plugins folder
#                                      again, so that nothing stays installed
#   plugin-exec.sh --build-only        update hook: puts bin/helm-autorecover
#                                      in place when it is missing
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
#
# helm v3 and v4 keep a plugin whose install hook failed: `helm plugin
# list` shows it and a second install says "plugin already exists". So the
# install hook undoes the install itself when it cannot put the binary in
# place: it removes what helm has just put at HELM_PLUGIN_DIR, the link to
# the folder given to `helm plugin install` (the folder itself is left as
# it is) or the copy helm made of an archive or repository, and says so.
# When it cannot, it names the command that does (helm plugin uninstall).
#
# helm v3 installs an archive from a URL by extracting it into its cache
# ($HELM_CACHE_HOME/plugins/<the URL as a name>) and copying that; it keeps
# the extracted copy, and a second install of the same URL then fails
# ("mkdir ...: file exists"). The install hook removes such copies of this
# project's archives, which nothing reads again.
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
name=${HELM_PLUGIN_NAME:-autorecover}

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

# version_of prints the version in the plugin.yaml of the folder $1.
version_of() {
  sed -n 's/^version: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$1/plugin.yaml"
}

# install_archive puts the binary of this machine's archive of $version
# from $1 in place. Run in a subshell: die ends the subshell.
install_archive() {
  from=${1%/}
  case $(uname -s) in
    Linux) os=linux ;;
    Darwin) os=darwin ;;
    MINGW* | MSYS* | CYGWIN*)
      die "helm on Windows does not run the plugin's shell entry point; use helm-autorecover.exe from helm-autorecover_${version}_windows_<arch>.zip as a command of its own instead"
      ;;
    *) die "no archive for $(uname -s); build from source: make build" ;;
  esac
  case $(uname -m) in
    x86_64 | amd64) arch=amd64 ;;
    aarch64 | arm64) arch=arm64 ;;
    *) die "no archive for the $(uname -m) architecture; build from source: make build" ;;
  esac
  # The name hack/dist.sh gives this platform's archive.
  archive="helm-autorecover_${version}_${os}_${arch}.tar.gz"
  tmp=$(mktemp -d) || die "cannot make a temporary folder"
  trap 'rm -rf "$tmp"' EXIT
  echo "helm-autorecover: installing $archive from $from" >&2
  fetch "$from/$archive" "$tmp/$archive" || die "cannot get $from/$archive"
  fetch "$from/checksums.txt" "$tmp/checksums.txt" || die "cannot get $from/checksums.txt"
  want=$(awk -v f="$archive" '$2 == f || $2 == "*" f { print $1 }' "$tmp/checksums.txt")
  if command -v sha256sum >/dev/null 2>&1; then
    have=$(sha256sum "$tmp/$archive" | cut -d' ' -f1)
  else
    have=$(shasum -a 256 "$tmp/$archive" | cut -d' ' -f1)
  fi
  [ -n "$want" ] || die "$from/checksums.txt lists no checksum for $archive"
  [ "$want" = "$have" ] || die "checksum mismatch for $archive from $from: checksums.txt says $want, the archive is $have"
  mkdir -p "$tmp/x" || die "cannot make a temporary folder"
  tar -xzf "$tmp/$archive" -C "$tmp/x" bin/helm-autorecover || die "$archive has no bin/helm-autorecover"
  mkdir -p "$dir/bin" || die "cannot write to $dir/bin"
  mv "$tmp/x/bin/helm-autorecover" "$bin.tmp" || die "cannot write to $dir/bin"
  chmod 755 "$bin.tmp" || die "cannot write to $dir/bin"
  mv "$bin.tmp" "$bin" || die "cannot write to $dir/bin"
}

# put_in_place gets the binary from where the header says. Run in a
# subshell: a failure says why on stderr and ends the subshell with 1.
put_in_place() {
  version=$(version_of "$dir")
  if [ -n "${HELM_AUTORECOVER_DIST:-}" ]; then
    install_archive "$HELM_AUTORECOVER_DIST"
  elif [ -f "$dir/go.mod" ]; then
    echo "helm-autorecover: building $bin (needs Go 1.26)" >&2
    (cd "$dir" && make build >&2) || die "make build failed in $dir"
  else
    install_archive "https://github.com/helm-autorecover/helm-autorecover/releases/download/v$version"
  fi
}

# is_this_plugin tells whether the folder $1 holds this plugin (its
# plugin.yaml names it).
is_this_plugin() {
  grep -q "^name: *\"\{0,1\}$name\"\{0,1\} *\$" "$1/plugin.yaml" 2>/dev/null
}

# in_plugins_folder tells whether the folder $1 is one helm installs
# plugins into: one named plugins (helm's own, $HELM_DATA_HOME/plugins) or
# one of HELM_PLUGINS.
in_plugins_folder() {
  [ "$(basename "$1")" = plugins ] && return 0
  rest=${HELM_PLUGINS:-}
  while [ -n "$rest" ]; do
    entry=${rest%%:*}
    case $rest in
      *:*) rest=${rest#*:} ;;
      *) rest= ;;
    esac
    while [ "$entry" != "${entry%/}" ]; do entry=${entry%/}; done
    [ -n "$entry" ] && [ "$entry" = "$1" ] && return 0
  done
  return 1
}

# undo_install removes what `helm plugin install` has just put at
# HELM_PLUGIN_DIR, and prints what it removed; it fails, removing nothing,
# unless helm named that place and it is this plugin in a plugins folder.
undo_install() {
  p=${HELM_PLUGIN_DIR:-}
  [ -n "$p" ] || return 1
  in_plugins_folder "$(dirname "$p")" || return 1
  if [ -L "$p" ]; then
    rm -f "$p" || return 1
    echo "the link $p (the folder it pointed to is left as it is)"
  elif [ -d "$p" ] && is_this_plugin "$p"; then
    # helm v4 also keeps the archive it installed from beside the folder,
    # as NAME-VERSION.tgz (and .prov); helm plugin uninstall removes both.
    tgz="$(dirname "$p")/$name-$(version_of "$p").tgz"
    rm -rf "$p" || return 1
    rm -f "$tgz" "$tgz.prov"
    echo "the folder $p"
  else
    return 1
  fi
}

# forget_downloads removes helm v3's extracted copies of this project's
# archives from its cache (see the header).
forget_downloads() {
  [ -n "${HELM_CACHE_HOME:-}" ] || return 0
  for d in "$HELM_CACHE_HOME"/plugins/*helm-autorecover_*.tar.gz; do
    if [ -d "$d" ] && is_this_plugin "$d"; then
      rm -rf "$d" || true
    fi
  done
}

if [ "${1:-}" = --install-hook ]; then
  forget_downloads
fi
if [ ! -x "$bin" ]; then
  if ! (put_in_place); then
    case ${1:-} in
      --install-hook)
        if removed=$(undo_install); then
          die "nothing stays installed: removed $removed; fix the cause above and run \`helm plugin install\` again"
        fi
        die "the plugin \"$name\" stays installed without its binary ($bin): remove it with \`helm plugin uninstall $name\`, fix the cause above, then install it again"
        ;;
      *)
        die "the plugin \"$name\" has no binary ($bin): remove it with \`helm plugin uninstall $name\`, fix the cause above, then install it again"
        ;;
    esac
  fi
fi
case ${1:-} in
  --install-hook | --build-only) exit 0 ;;
esac
exec "$bin" "$@"
