# Shared settings for the hack/ scripts. Source it; do not run it.
# shellcheck shell=bash
HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HACK_DIR/.." && pwd)
# The cache of built control-plane and helm binaries lives outside the clone so
# that fresh clones and CI runs on the same machine reuse it.
CACHE_DIR=${HELM_AUTORECOVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/helm-autorecover}
BIN_CACHE="$CACHE_DIR/bin"
CLUSTER_DIR=${LOCAL_CLUSTER_DIR:-$REPO_ROOT/.local-cluster}

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# modversion DIR MODULE prints the version of MODULE required by the build module in DIR.
modversion() { (cd "$1" && go list -m -f '{{.Version}}' "$2"); }

# free_port prints a TCP port on 127.0.0.1 that nothing listens on now.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
