#!/usr/bin/env bash
# Builds (once) the upstream binaries that the local control plane, the demo
# and the interop tests run, from the Go module proxy, into $BIN_CACHE:
#
#   hack/build-cluster-bins.sh [--estimate] [NAME...]
#
# NAME is etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok
# (control-plane names these five), helm-v4 or helm-v3; no NAME means all of
# them (make cluster-bins). Each is built when something first needs it:
# `hack/local-cluster.sh up` the control plane, hack/demo.sh helm-v4, the
# tests (internal/testenv) helm-v4 and helm-v3. A binary is rebuilt only
# when its build module (go.mod/go.sum) changes; warm, this takes a second.
# Before a cold build it says what it builds and about how long that takes
# on 2 cores; --estimate only prints that number of seconds (0: all built).
# The three kube-* are built by one `go build` (their links overlap), and
# etcd and kwok, which share no compiled package with them (other versions
# of the same modules), build beside it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

CONTROL_PLANE=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
ALL=("${CONTROL_PLANE[@]}" helm-v4 helm-v3)

# cold_seconds NAME: the cold build of NAME with its module downloads on an
# idle 2-core machine, one binary after another, as issue 33 measured them
# (docs/benchmarks.md, "Cold start"); helm-v4's is its time after
# bin/helm-autorecover, whose packages it shares; kube-scheduler's was not
# timed apart (a guess: most of its packages are the other kube-*'s).
cold_seconds() {
  case $1 in
    kube-apiserver) echo 347 ;;
    kube-controller-manager) echo 114 ;;
    kube-scheduler) echo 30 ;;
    kwok) echo 109 ;;
    etcd) echo 39 ;;
    helm-v4) echo 8 ;;
    helm-v3) echo 87 ;;
    *) die "unknown binary $1 (one of: control-plane ${ALL[*]})" ;;
  esac
}

# module NAME: the build module folder and the package of NAME.
module() {
  case $1 in
    etcd) echo "$HACK_DIR/etcd go.etcd.io/etcd/server/v3" ;;
    kwok) echo "$HACK_DIR/kwok sigs.k8s.io/kwok/cmd/kwok" ;;
    helm-v4) echo "$HACK_DIR/helm4 helm.sh/helm/v4/cmd/helm" ;;
    helm-v3) echo "$HACK_DIR/helm3 helm.sh/helm/v3/cmd/helm" ;;
    kube-*) echo "$HACK_DIR/k8s k8s.io/kubernetes/cmd/$1" ;;
    *) die "unknown binary $1 (one of: control-plane ${ALL[*]})" ;;
  esac
}

stamp() { cat "$1/go.mod" "$1/go.sum" | sha256sum | cut -c1-16; }

# built NAME: NAME is in the cache, built from its module as it is now.
built() {
  local dir _
  read -r dir _ <<< "$(module "$1")"
  [[ -x "$BIN_CACHE/$1" && "$(cat "$BIN_CACHE/$1.stamp" 2>/dev/null)" == "$(stamp "$dir")" ]]
}

estimate=0
names=()
for a in "$@"; do
  case $a in
    --estimate) estimate=1 ;;
    control-plane) names+=("${CONTROL_PLANE[@]}") ;;
    -*) die "usage: $0 [--estimate] [control-plane|${ALL[*]// /|}]..." ;;
    *) module "$a" >/dev/null; names+=("$a") ;;
  esac
done
((${#names[@]})) || names=("${ALL[@]}")

# missing: the names asked for that are not built, in ALL's order, once each.
missing=()
for n in "${ALL[@]}"; do
  [[ " ${names[*]} " == *" $n "* ]] || continue
  built "$n" || missing+=("$n")
done
total=0
for n in "${missing[@]}"; do total=$((total + $(cold_seconds "$n"))); done
if ((estimate)); then
  echo "$total"
  exit 0
fi
((${#missing[@]})) || exit 0

mkdir -p "$BIN_CACHE"
# One builder at a time per cache (a test run and `make cluster-up` may both
# start cold): the second waits, then finds what it needs built.
exec 9>"$BIN_CACHE/.build.lock"
flock 9
still=()
for n in "${missing[@]}"; do built "$n" || still+=("$n"); done
missing=("${still[@]}")
((${#missing[@]})) || exit 0
total=0
for n in "${missing[@]}"; do total=$((total + $(cold_seconds "$n"))); done
if ((total >= 90)); then
  took="about $(((total + 30) / 60)) min"
else
  took="about $total s"
fi
log "building ${missing[*]} into $BIN_CACHE: $took on 2 cores when the Go caches are cold (docs/benchmarks.md, \"Cold start\")"

k8s_ld() {
  local v minor
  v=$(modversion "$HACK_DIR/k8s" k8s.io/kubernetes)
  minor=$(echo "$v" | cut -d. -f2)
  echo "-X k8s.io/component-base/version.gitVersion=$v -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$v"
}

ldflags() {
  local v
  case $1 in
    etcd) v=$(modversion "$HACK_DIR/etcd" go.etcd.io/etcd/server/v3); echo "-X go.etcd.io/etcd/api/v3/version.GitSHA=$v" ;;
    kwok) v=$(modversion "$HACK_DIR/kwok" sigs.k8s.io/kwok); echo "-X sigs.k8s.io/kwok/pkg/consts.Version=${v#v}" ;;
    helm-v4) v=$(modversion "$HACK_DIR/helm4" helm.sh/helm/v4); echo "-X helm.sh/helm/v4/internal/version.version=$v -X helm.sh/helm/v4/internal/version.gitTreeState=clean" ;;
    helm-v3) v=$(modversion "$HACK_DIR/helm3" helm.sh/helm/v3); echo "-X helm.sh/helm/v3/internal/version.version=$v -X helm.sh/helm/v3/internal/version.gitTreeState=clean" ;;
    kube-*) k8s_ld ;;
  esac
}

# build NAME...: builds NAMEs, all from one module, with one `go build` into
# the cache, and stamps them.
build() {
  local dir pkg pkgs=() n start=$SECONDS tmp
  for n in "$@"; do
    read -r dir pkg <<< "$(module "$n")"
    pkgs+=("$pkg")
  done
  tmp=$(mktemp -d "$BIN_CACHE/.build.XXXXXX")
  log "building $* ..."
  if (($# == 1)); then
    (cd "$dir" && go build -ldflags "-s -w $(ldflags "$1")" -o "$tmp/$1" "${pkgs[0]}") || return 1
  else
    # go build -o DIR names each binary after its package's last element.
    (cd "$dir" && go build -ldflags "-s -w $(ldflags "$1")" -o "$tmp/" "${pkgs[@]}") || return 1
  fi
  # (Calls under || turn set -e off: each step says its failure itself.)
  for n in "$@"; do
    mv "$tmp/$n" "$BIN_CACHE/$n" || return 1
    stamp "$dir" > "$BIN_CACHE/$n.stamp" || return 1
  done
  rmdir "$tmp"
  log "built $* in $((SECONDS - start))s"
}

kube=() side=() after=()
for n in "${missing[@]}"; do
  case $n in
    kube-*) kube+=("$n") ;;
    etcd | kwok) side+=("$n") ;;
    *) after+=("$n") ;;
  esac
done
pid=
if ((${#kube[@]})); then
  build "${kube[@]}" &
  pid=$!
fi
status=0
for n in "${side[@]}"; do build "$n" || status=1; done
if [[ -n $pid ]]; then wait "$pid" || status=1; fi
((status == 0)) || die "a build failed (its error is above)"
for n in "${after[@]}"; do build "$n"; done
log "built ${missing[*]} in $BIN_CACHE"
