#!/usr/bin/env sh
# Entry point of the helm plugin: builds bin/helm-autorecover inside the
# plugin folder when it is missing (plugin install hook), then runs it with
# the arguments helm passes on.
set -e
dir=${HELM_PLUGIN_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
bin="$dir/bin/helm-autorecover"
if [ ! -x "$bin" ]; then
  echo "helm-autorecover: building $bin (needs Go 1.26)" >&2
  (cd "$dir" && make build >&2)
fi
if [ "${1:-}" = "--build-only" ]; then
  exit 0
fi
exec "$bin" "$@"
