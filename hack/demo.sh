#!/usr/bin/env bash
# The demo: a release gets stuck with stock helm when the helm process dies,
# then helm-autorecover recovers it by itself. Uses the cluster of $KUBECONFIG
# when one is reachable, the local control plane otherwise. It builds what
# it runs and nothing more (this tool, stock helm v4, and the control plane
# only for the local cluster), saying first how long that takes cold.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

HAR="$REPO_ROOT/bin/helm-autorecover"
HELM="$BIN_CACHE/helm-v4"
NS=helm-autorecover-demo
REL=demo
CHART="$REPO_ROOT/internal/testenv/testdata/charts/app"

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }
# pending: the latest revision's status is pending-upgrade.
pending() { "$HELM" status "$REL" -n "$NS" -o json 2>/dev/null | grep -q '"status":"pending-upgrade"'; }

# The cold build of bin/helm-autorecover with its module downloads on an
# idle 2-core machine, as issue 33 measured it (docs/benchmarks.md, "Cold
# start"; hack/build-cluster-bins.sh has the others').
TOOL_COLD_SECONDS=229
minutes() { if (($1 >= 90)); then echo "about $((($1 + 30) / 60)) min"; else echo "about $1 s"; fi; }

configured=0
[[ -n ${KUBECONFIG:-} || -f $HOME/.kube/config ]] && configured=1
tool=0
[[ -x $HAR ]] || tool=$TOOL_COLD_SECONDS
helm=$("$HACK_DIR/build-cluster-bins.sh" --estimate helm-v4)
plane=$("$HACK_DIR/build-cluster-bins.sh" --estimate control-plane)
if ((tool + helm + plane > 0)); then
  if ((configured && plane > 0)); then
    log "first run: building this tool and stock helm v4 takes $(minutes $((tool + helm))) on 2 cores with cold Go caches; if \$KUBECONFIG reaches no cluster, the local control plane adds $(minutes "$plane")"
  else
    log "first run: building what the demo needs takes $(minutes $((tool + helm + plane))) on 2 cores with cold Go caches"
  fi
fi

# Without a kubeconfig the control plane is needed for sure: it builds
# beside this tool (they share no compiled package).
plane_pid=
if ((!configured && plane > 0)); then
  "$HACK_DIR/build-cluster-bins.sh" control-plane &
  plane_pid=$!
fi
make -C "$REPO_ROOT" --no-print-directory build
if [[ -n $plane_pid ]]; then
  wait "$plane_pid" || die "building the local control plane failed (its error is above)"
fi
"$HACK_DIR/build-cluster-bins.sh" helm-v4

if ((configured)) && "$HAR" list -A >/dev/null 2>&1; then
  log "using the configured cluster ($(${HAR} env 2>/dev/null | sed -n 's/^HELM_KUBECONTEXT=//p'))"
else
  "$HACK_DIR/local-cluster.sh" up >/dev/null
  eval "$("$HACK_DIR/local-cluster.sh" env)"
  export KUBECONFIG
fi
export HELM_CACHE_HOME=${HELM_CACHE_HOME:-$(mktemp -d)} HELM_CONFIG_HOME=${HELM_CONFIG_HOME:-$(mktemp -d)}

"$HELM" uninstall "$REL" -n "$NS" --ignore-not-found >/dev/null 2>&1 || true

step "stock helm $("$HELM" version --short) installs a release"
run "$HELM" install "$REL" "$CHART" -n "$NS" --create-namespace --wait --timeout 60s

step "an upgrade is killed (SIGKILL) while it waits for pods that never schedule"
printf '$ %s &\n' "helm upgrade $REL ... --wait --set nodeSelector.never=matches"
"$HELM" upgrade "$REL" "$CHART" -n "$NS" --wait --timeout 5m --set nodeSelector.never=matches --set message=v2 >/dev/null 2>&1 &
pid=$!
until pending; do sleep 0.2; done
kill -9 "$pid"; wait "$pid" 2>/dev/null || true
echo "killed helm (pid $pid)"
run "$HELM" history "$REL" -n "$NS"

step "every later upgrade with stock helm fails"
run "$HELM" upgrade "$REL" "$CHART" -n "$NS" --set message=v3 || true
echo "With stock helm the release is stuck until someone edits its Secrets by hand."


step "helm-autorecover refuses to touch a young pending revision stock helm may still be writing (exit 5)"
run "$HAR" upgrade "$REL" "$CHART" -n "$NS" --set message=v3 --recover-legacy-after 10s || echo "(exit $?)"

step "once the revision is older than --recover-legacy-after (in API-server time), it is recovered"
sleep 12
run "$HAR" upgrade "$REL" "$CHART" -n "$NS" --set message=v3 --recover-legacy-after 10s --wait --timeout 60s
run "$HAR" history "$REL" -n "$NS"

step "helm-autorecover's own upgrade is killed (SIGKILL); its lock (lease 5s) stops being renewed"
printf '$ %s &\n' "helm-autorecover upgrade $REL ... --wait --lease-duration 5s --set nodeSelector.never=matches"
"$HAR" upgrade "$REL" "$CHART" -n "$NS" --wait --timeout 5m --lease-duration 5s --set nodeSelector.never=matches --set message=v4 >/dev/null 2>&1 &
pid=$!
until pending; do sleep 0.2; done
kill -9 "$pid"; wait "$pid" 2>/dev/null || true
killed=$(date +%s%N)
echo "killed helm-autorecover (pid $pid)"

step "a second client is refused at once while the lock is live (exit 3) ..."
run "$HAR" upgrade "$REL" "$CHART" -n "$NS" --set message=v5 || echo "(exit $?)"

step "... and with --lock-timeout it waits for the dead holder's lock to expire, then recovers by itself"
run "$HAR" upgrade "$REL" "$CHART" -n "$NS" --set message=v5 --lock-timeout 60s --wait --timeout 60s
echo "recovered $(( ($(date +%s%N) - killed) / 1000000 )) ms after the kill"
run "$HAR" history "$REL" -n "$NS"

echo
echo "No human step: history keeps every revision and says who abandoned what, and when."
