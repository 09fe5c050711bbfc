#!/usr/bin/env sh
# Entry point of the helm plugin (plugin.yaml, plugin.complete):
#   plugin-exec.sh ARGS...             runs bin/helm-autorecover ARGS... in
#                                      place of this shell (exec), so that its
#                                      parent process is helm itself
#   plugin-exec.sh --build-only        install and update hook: builds
#                                      bin/helm-autorecover when it is missing
#   plugin-exec.sh --complete ARGS...  shell completion (plugin.complete):
#                                      the binary's own completions of ARGS
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
if [ ! -x "$bin" ]; then
  echo "helm-autorecover: building $bin (needs Go 1.26)" >&2
  (cd "$dir" && make build >&2)
fi
if [ "${1:-}" = "--build-only" ]; then
  exit 0
fi
exec "$bin" "$@"
