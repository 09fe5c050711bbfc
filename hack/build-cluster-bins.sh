#!/usr/bin/env bash
# Builds (once) the binaries the local control plane and the interop tests
# need, from the Go module proxy, into $BIN_CACHE: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok, and upstream helm v4 and v3.
# A binary is rebuilt only when its build module (go.mod/go.sum) changes.
# A cold build takes about 20-30 minutes on 2 cores; warm it takes a second.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
mkdir -p "$BIN_CACHE"
# One builder at a time per cache (a test run and `make cluster-up` may both
# start cold): the second waits, then finds every binary built.
exec 9>"$BIN_CACHE/.build.lock"
flock 9

# build NAME MODDIR PKG LDFLAGS: builds PKG from MODDIR into $BIN_CACHE/NAME
# unless the stamp of MODDIR's go.mod+go.sum matches the last build.
build() {
  local name=$1 dir=$2 pkg=$3 ldflags=$4
  local stamp; stamp=$(cat "$dir/go.mod" "$dir/go.sum" | sha256sum | cut -c1-16)
  if [[ -x "$BIN_CACHE/$name" && "$(cat "$BIN_CACHE/$name.stamp" 2>/dev/null)" == "$stamp" ]]; then
    return 0
  fi
  log "building $name ($pkg) ... (cold builds of kube-* take 10-20 min each on 2 cores)"
  local start=$SECONDS
  (cd "$dir" && go build -ldflags "-s -w $ldflags" -o "$BIN_CACHE/$name.tmp" "$pkg")
  mv "$BIN_CACHE/$name.tmp" "$BIN_CACHE/$name"
  echo "$stamp" > "$BIN_CACHE/$name.stamp"
  log "built $name in $((SECONDS - start))s"
}

k8s_ver=$(modversion "$HACK_DIR/k8s" k8s.io/kubernetes)
k8s_minor=$(echo "$k8s_ver" | cut -d. -f2)
k8s_ld="-X k8s.io/component-base/version.gitVersion=$k8s_ver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$k8s_minor -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$k8s_ver"
etcd_ver=$(modversion "$HACK_DIR/etcd" go.etcd.io/etcd/server/v3)
kwok_ver=$(modversion "$HACK_DIR/kwok" sigs.k8s.io/kwok)
helm4_ver=$(modversion "$HACK_DIR/helm4" helm.sh/helm/v4)
helm3_ver=$(modversion "$HACK_DIR/helm3" helm.sh/helm/v3)

build etcd "$HACK_DIR/etcd" go.etcd.io/etcd/server/v3 "-X go.etcd.io/etcd/api/v3/version.GitSHA=$etcd_ver"
build kwok "$HACK_DIR/kwok" sigs.k8s.io/kwok/cmd/kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=${kwok_ver#v}"
build helm-v4 "$HACK_DIR/helm4" helm.sh/helm/v4/cmd/helm "-X helm.sh/helm/v4/internal/version.version=$helm4_ver -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
build helm-v3 "$HACK_DIR/helm3" helm.sh/helm/v3/cmd/helm "-X helm.sh/helm/v3/internal/version.version=$helm3_ver -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for c in kube-apiserver kube-controller-manager kube-scheduler; do
  build "$c" "$HACK_DIR/k8s" "k8s.io/kubernetes/cmd/$c" "$k8s_ld"
done
log "binaries ready in $BIN_CACHE (kubernetes $k8s_ver, etcd $etcd_ver, kwok $kwok_ver, helm $helm4_ver and $helm3_ver)"
