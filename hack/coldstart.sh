#!/usr/bin/env bash
# Times a newcomer's first `make demo` as a fresh machine sees it, without
# touching this machine's caches: a clone of HEAD in a temporary folder, with
# an empty HOME, XDG_CACHE_HOME (so an empty binary cache), GOCACHE and
# GOMODCACHE (modules come from the Go module proxy) and a local cluster
# folder of its own. Prints the wall time with the commit, the core count and
# the load average before and after (others' work on the machine slows it)
# and the CPU time spent, then stops its cluster and removes the folder
# (several GB).
#
#   hack/coldstart.sh                       the local control plane path
#   hack/coldstart.sh --kubeconfig FILE     a user whose kubeconfig reaches a cluster
#
# COLDSTART_KEEP=1 keeps the folder; COLDSTART_DIR chooses where it goes.
# docs/benchmarks.md ("Cold start") has its figures.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

kubeconfig=
case "${1:-}" in
  "") ;;
  --kubeconfig) kubeconfig=$(realpath "${2:?--kubeconfig needs a file}") ;;
  *) echo "usage: $0 [--kubeconfig FILE]" >&2; exit 2 ;;
esac

commit=$(git -C "$REPO_ROOT" rev-parse --short HEAD)
tmp=$(mktemp -d "${COLDSTART_DIR:-${TMPDIR:-/tmp}}/coldstart.XXXXXX")
# The log stays beside the folder, which goes.
logfile=$tmp.log
cleanup() {
  if [[ -x $tmp/src/hack/local-cluster.sh ]]; then
    HOME=$tmp/home XDG_CACHE_HOME=$tmp/cache LOCAL_CLUSTER_DIR=$tmp/cluster \
      "$tmp/src/hack/local-cluster.sh" down >/dev/null 2>&1 || true
  fi
  if [[ -z ${COLDSTART_KEEP:-} ]]; then
    chmod -R u+w "$tmp" 2>/dev/null || true
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT

git clone -q "$REPO_ROOT" "$tmp/src"
git -C "$tmp/src" checkout -q "$(git -C "$REPO_ROOT" rev-parse HEAD)"
mkdir -p "$tmp/home" "$tmp/cache"
env=(HOME="$tmp/home" XDG_CACHE_HOME="$tmp/cache" GOCACHE="$tmp/gocache" GOMODCACHE="$tmp/gomod"
  GOPATH="$tmp/gopath" LOCAL_CLUSTER_DIR="$tmp/cluster" HELM_AUTORECOVER_CACHE=)
if [[ -n $kubeconfig ]]; then
  env+=(KUBECONFIG="$kubeconfig")
  what="cold make demo, kubeconfig reaching a cluster ($kubeconfig)"
else
  env+=(KUBECONFIG=)
  what="cold make demo, local control plane"
fi
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
log "$what at $commit in $tmp (log: $logfile); load average $load_before"
start=$(date +%s)
status=0
env "${env[@]}" make -C "$tmp/src" demo > "$logfile" 2>&1 || status=$?
secs=$(($(date +%s) - start))
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
# CPU time (user and system) of every process make waited for, the builds'
# compilers and linkers included (the cluster's servers run on, unwaited):
# on an idle machine of N cores the wall time is at least this over N.
# (times runs in this shell: in a command substitution it would count the
# subshell's children, none.)
times > "$tmp.times"
cpu=$(sed -n 2p "$tmp.times" | awk '{ for (i = 1; i <= 2; i++) { split($i, a, "m"); t += a[1] * 60 + a[2] } } END { printf "%d", t }')
rm -f "$tmp.times"
grep -E '^\[[0-9:]+\] (first run|building|built|using)' "$logfile" >&2 || true
if ((status != 0)); then
  tail -n 30 "$logfile" >&2
  COLDSTART_KEEP=1
  die "make demo failed (exit $status); its log is $logfile, its folder $tmp"
fi
printf '%s at %s: %d min %02d s (%d s) on %d cores; load average (1, 5, 15 min) %s before, %s after; CPU (user + system) %d min %02d s\n' \
  "$what" "$commit" $((secs / 60)) $((secs % 60)) "$secs" "$(nproc)" "$load_before" "$load_after" $((cpu / 60)) $((cpu % 60))
