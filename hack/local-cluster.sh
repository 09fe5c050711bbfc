#!/usr/bin/env bash
# A real, local Kubernetes control plane on loopback for tests and the demo:
# etcd, kube-apiserver (RBAC, generated PKI, audit log), kube-controller-manager,
# kube-scheduler and kwok with one fake node, so Deployments really roll out.
#
#   hack/local-cluster.sh up       build its binaries once (cached), start, wait until ready; idempotent
#   hack/local-cluster.sh down     stop the processes this script started (by recorded PID)
#   hack/local-cluster.sh status   exit 0 when the API server is ready
#   hack/local-cluster.sh env      print `export KUBECONFIG=...`
#   hack/local-cluster.sh restart etcd|kube-apiserver
#                                  stop that one process and start it again with
#                                  the same flags and ports; wait until ready
#
# State lives in $LOCAL_CLUSTER_DIR (default .local-cluster/ in the repo):
# kubeconfig, pki/, logs/ (one per component, plus audit.log), pids/, and
# ports (etcd's client and peer ports and the API server's, on 127.0.0.1).
# The ports are chosen below the kernel's ephemeral range (see lib.sh) and
# kept: `up` after `down` takes the same ones again while they are free, so
# a kubeconfig stays valid. Clusters with folders of their own run side by
# side. LOCAL_CLUSTER_PORT_MIN (default 20000) is the lowest port chosen;
# LOCAL_CLUSTER_PORT_WAIT (default 120) is how many seconds `restart` waits
# for a port of the stopped process to be free (a client's connection that
# happened to take it, or its TIME_WAIT of 60 s) before it gives up, naming
# the port and the process holding it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

PKI="$CLUSTER_DIR/pki"
LOGS="$CLUSTER_DIR/logs"
PIDS="$CLUSTER_DIR/pids"
KUBECONFIG_FILE="$CLUSTER_DIR/kubeconfig"
PORTS_FILE="$CLUSTER_DIR/ports"
# Held by whoever chooses ports or has a listener of its cluster down, so
# that no other cluster takes a port in between (one lock per machine).
PORTS_LOCK="${TMPDIR:-/tmp}/helm-autorecover-local-cluster-ports.lock"
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

# alive NAME: the recorded process for NAME is running and is still our binary.
alive() {
  local f="$PIDS/$1.pid" pid
  [[ -f $f ]] || return 1
  pid=$(cat "$f")
  # No pipe into grep -q here: with pipefail, tr dies of SIGPIPE when grep
  # stops reading after its match, and a long command line (kube-apiserver's)
  # then reads as "not running".
  local cmd
  cmd=$(tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline") || return 1
  [[ $cmd == *"$BIN_CACHE/$1"* ]]
}

etcd_healthy() { curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$1/health" 2>/dev/null; }

server_url() { sed -n 's/^ *server: //p' "$KUBECONFIG_FILE" 2>/dev/null | head -n1; }

ready() {
  [[ -f $KUBECONFIG_FILE ]] || return 1
  curl -fsS --max-time 2 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "$(server_url)/readyz" >/dev/null 2>&1
}

# cert NAME CN O [SANS]: a key pair signed by the cluster CA.
cert() {
  local name=$1 cn=$2 org=$3 sans=${4:-}
  local subj="/CN=$cn"
  [[ -n $org ]] && subj="/O=$org$subj"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [[ -n $sans ]]; then
      echo "extendedKeyUsage=serverAuth,clientAuth"
      echo "subjectAltName=$sans"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } > "$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 3650 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

make_pki() {
  [[ -f $PKI/done ]] && return 0
  log "generating PKI in $PKI"
  rm -rf "$PKI" && mkdir -p "$PKI"
  openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -subj "/CN=helm-autorecover-local-ca" \
    -days 3650 -sha256 -out "$PKI/ca.crt" 2>/dev/null
  cert apiserver kube-apiserver "" "IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
  cert admin admin system:masters
  cert controller-manager system:kube-controller-manager ""
  cert scheduler system:kube-scheduler ""
  cert kwok kwok-admin system:masters
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  touch "$PKI/done"
}

# kubeconfig FILE USER: a kubeconfig for one client certificate.
kubeconfig() {
  local file=$1 user=$2 server=$3
  cat > "$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: $server
    certificate-authority: $PKI/ca.crt
users:
- name: $user
  user:
    client-certificate: $PKI/$user.crt
    client-key: $PKI/$user.key
contexts:
- name: local
  context: {cluster: local, user: $user, namespace: default}
current-context: local
EOF
}

# start NAME ARGS...: runs the cached binary NAME in its own session, logging
# to logs/NAME.log, recording its PID.
start() {
  local name=$1; shift
  setsid "$BIN_CACHE/$name" "$@" >"$LOGS/$name.log" 2>&1 < /dev/null 8>&- 9>&- &
  local pid=$! i
  echo "$pid" > "$PIDS/$name.pid"
  # Until the forked shell has exec'd the binary, its command line is this
  # script's and alive() would call it dead: wait for the exec (or its end).
  for ((i = 0; i < 250; i++)); do
    alive "$name" || [[ ! -d /proc/$pid ]] || { sleep 0.02; continue; }
    break
  done
}

wait_for() {
  local what=$1 timeout=$2; shift 2
  local deadline=$((SECONDS + timeout)) c
  until "$@"; do
    for c in "${COMPONENTS[@]}"; do
      if [[ -f $PIDS/$c.pid ]] && ! alive "$c"; then
        tail -n 5 "$LOGS/$c.log" >&2 || true
        die "$c exited while waiting for $what; see $LOGS/$c.log"
      fi
    done
    if (( SECONDS >= deadline )); then
      die "$what not ready after ${timeout}s; see $LOGS"
    fi
    sleep 0.2
  done
}

write_configs() {
  cat > "$CLUSTER_DIR/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  resources:
  - group: ""
    resources: [secrets, configmaps]
  - group: coordination.k8s.io
    resources: [leases]
  verbs: [create, update, patch, delete, deletecollection]
- level: None
EOF
  # kwok stages: fast node, node heartbeat through a Lease, fast pods. They
  # ship inside the kwok module.
  local kwokdir
  kwokdir=$(cd "$HACK_DIR/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
  {
    for f in stage/node/fast/node-initialize.yaml stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
             stage/pod/fast/pod-ready.yaml stage/pod/fast/pod-complete.yaml stage/pod/fast/pod-delete.yaml; do
      echo "---"
      cat "$kwokdir/kustomize/$f"
    done
  } > "$CLUSTER_DIR/kwok-stages.yaml"
}

# create_node registers the one fake node kwok manages (annotation selector).
create_node() {
  api GET /api/v1/nodes/kwok-node-0 >/dev/null 2>&1 && return 0
  api POST /api/v1/nodes '{
    "apiVersion": "v1", "kind": "Node",
    "metadata": {"name": "kwok-node-0",
      "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
      "labels": {"kubernetes.io/hostname": "kwok-node-0", "kubernetes.io/os": "linux",
                 "kubernetes.io/arch": "amd64", "type": "kwok"}},
    "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "250"},
               "capacity": {"cpu": "32", "memory": "256Gi", "pods": "250"}}}' >/dev/null
}

# api METHOD PATH [JSON]: one request to the local API server as admin.
api() {
  local args=(-fsS --max-time 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" -X "$1")
  [[ -n ${3:-} ]] && args+=(-H 'Content-Type: application/json' --data "$3")
  curl "${args[@]}" "$(server_url)$2"
}

node_ready() {
  api GET /api/v1/nodes/kwok-node-0 2>/dev/null | python3 -c '
import json, sys
n = json.load(sys.stdin)
ok = any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
sys.exit(0 if ok else 1)'
}

sa_ready() {
  api GET /api/v1/namespaces/default/serviceaccounts/default >/dev/null 2>&1
}

# lock_ports takes the machine's ports lock on fd 8 (see PORTS_LOCK), saying
# so when it has to wait for it.
lock_ports() {
  exec 8>"$PORTS_LOCK"
  flock -n 8 && return 0
  log "waiting for $PORTS_LOCK: another local cluster is choosing its ports or restarting a component"
  flock 8
}

# choose_ports prints etcd's client and peer ports and the API server's:
# those of $PORTS_FILE when they are all below the ephemeral range and free,
# else new ones (see free_ports), which it records there.
choose_ports() {
  local lo p ok=1 ports=()
  lo=$(ephemeral_low)
  if [[ -f $PORTS_FILE ]]; then
    read -r -a ports < "$PORTS_FILE" || true
    ((${#ports[@]} == 3)) || ok=0
    for p in "${ports[@]}"; do
      if ! [[ $p =~ ^[0-9]+$ ]] || ((p < PORT_MIN || p >= lo)); then
        log "port $p of $PORTS_FILE is not in $PORT_MIN-$((lo - 1)) (below the ephemeral range): choosing new ports"
        ok=0
        break
      fi
      if ! port_bindable "$p"; then
        log "port $p of $PORTS_FILE is in use: choosing new ports"
        port_holders "$p" | sed 's/^/  /' >&2
        ok=0
        break
      fi
    done
  else
    ok=0
  fi
  if ((!ok)); then
    local chosen
    chosen=$(free_ports 3 "$CLUSTER_DIR")
    read -r -a ports <<< "$chosen"
    echo "${ports[*]}" > "$PORTS_FILE"
  fi
  echo "${ports[*]}"
}

cmd_up() {
  # Test binaries of several packages may call `up` at once: one at a time.
  mkdir -p "$CLUSTER_DIR"
  exec 9>"$CLUSTER_DIR/up.lock"
  flock 9
  if ready && for c in "${COMPONENTS[@]}"; do alive "$c" || exit 1; done; then
    log "local cluster already running"
    cmd_env
    return 0
  fi
  cmd_down >/dev/null 2>&1 || true
  "$HACK_DIR/build-cluster-bins.sh" control-plane
  local t0=$SECONDS
  mkdir -p "$LOGS" "$PIDS"
  make_pki
  write_configs

  local etcd_client etcd_peer api_port
  lock_ports
  local ports
  ports=$(choose_ports)
  read -r etcd_client etcd_peer api_port <<< "$ports"
  local server="https://127.0.0.1:$api_port"

  log "starting etcd on 127.0.0.1:$etcd_client"
  start etcd --name local --data-dir "$CLUSTER_DIR/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "local=http://127.0.0.1:$etcd_peer" --unsafe-no-fsync --log-level warn
  wait_for etcd 30 etcd_healthy "$etcd_client"

  log "starting kube-apiserver on $server"
  start kube-apiserver --etcd-servers "http://127.0.0.1:$etcd_client" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --endpoint-reconciler-type none \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range 10.0.0.0/24 --authorization-mode Node,RBAC \
    --audit-policy-file "$CLUSTER_DIR/audit-policy.yaml" --audit-log-path "$LOGS/audit.log" \
    --audit-log-maxsize 200 --audit-log-maxbackup 2 --audit-log-mode blocking \
    --disable-admission-plugins ServiceAccount
  kubeconfig "$KUBECONFIG_FILE" admin "$server"
  kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" controller-manager "$server"
  kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" scheduler "$server"
  kubeconfig "$CLUSTER_DIR/kwok.kubeconfig" kwok "$server"
  wait_for kube-apiserver 60 ready
  flock -u 8

  log "starting kube-controller-manager, kube-scheduler and kwok"
  start kube-controller-manager --kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" \
    --secure-port 0 --leader-elect=false --use-service-account-credentials=true \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key"
  start kube-scheduler --kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" \
    --authentication-kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" \
    --authorization-kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" \
    --secure-port 0 --leader-elect=false
  start kwok --kubeconfig "$CLUSTER_DIR/kwok.kubeconfig" --config "$CLUSTER_DIR/kwok-stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --cidr 10.244.0.0/16 --node-ip 127.0.0.1 --node-lease-duration-seconds 40

  create_node
  wait_for "node kwok-node-0" 60 node_ready
  wait_for "default service account" 60 sa_ready
  log "local cluster ready in $((SECONDS - t0))s"
  cmd_env
}

# running PID: the process exists and has not exited (a zombie, which
# holds no port or file any more, waits only for init to reap it).
running() {
  local st
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ ${st:0:1} != Z ]]
}

# stop NAME: SIGTERM to the recorded process for NAME, SIGKILL after 5 s;
# returns 1 when it was not running.
stop() {
  local pid
  alive "$1" || return 1
  pid=$(cat "$PIDS/$1.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do running "$pid" || break; sleep 0.1; done
  running "$pid" && kill -9 "$pid" 2>/dev/null || true
  for _ in $(seq 50); do running "$pid" || break; sleep 0.1; done
}

cmd_down() {
  local c stopped=0
  for c in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
    if stop "$c"; then
      stopped=$((stopped + 1))
    fi
    rm -f "$PIDS/$c.pid"
  done
  log "stopped $stopped process(es)"
}

# flag_value NAME ARGS...: the value of --NAME in ARGS ("--NAME V" or "--NAME=V").
flag_value() {
  local name=$1; shift
  while (($#)); do
    case $1 in
      "--$name") echo "${2:-}"; return 0 ;;
      "--$name="*) echo "${1#*=}"; return 0 ;;
    esac
    shift
  done
  return 1
}

# listen_ports NAME ARGS...: the 127.0.0.1 ports NAME listens on, by its
# command line ARGS.
listen_ports() {
  local name=$1 f u urls; shift
  case $name in
    etcd)
      for f in listen-client-urls listen-peer-urls; do
        urls=$(flag_value "$f" "$@") || die "etcd has no --$f"
        for u in ${urls//,/ }; do echo "${u##*:}"; done
      done
      ;;
    kube-apiserver) flag_value secure-port "$@" || die "kube-apiserver has no --secure-port" ;;
  esac
}

# listening PORT: a socket listens on 127.0.0.1:PORT (state 0A of
# /proc/net/tcp; the address in hex, little-endian).
listening() {
  local want
  want=$(printf '0100007F:%04X' "$1")
  awk -v a="$want" '$2 == a && $4 == "0A" { found = 1 } END { exit !found }' /proc/net/tcp
}

# start_again NAME ARGS...: starts NAME on its ports once they are free:
# waits for each (generously: a connection in the way may live for a
# while) and, when NAME still finds one taken (a client took it in
# between), waits and starts it again, three times at most.
start_again() {
  local name=$1 attempt p ports all; shift
  mapfile -t ports < <(listen_ports "$name" "$@")
  ((${#ports[@]})) || die "no ports in the command line of $name"
  for attempt in 1 2 3; do
    for p in "${ports[@]}"; do
      wait_port_free "$p" "${LOCAL_CLUSTER_PORT_WAIT:-120}" "$name"
    done
    start "$name" "$@"
    local deadline=$((SECONDS + 60))
    while alive "$name"; do
      all=1
      for p in "${ports[@]}"; do listening "$p" || { all=0; break; }; done
      ((all)) && return 0
      ((SECONDS < deadline)) || die "$name does not listen on ports ${ports[*]} after 60s; see $LOGS/$name.log"
      sleep 0.2
    done
    if ! grep -q 'address already in use' "$LOGS/$name.log" 2>/dev/null; then
      tail -n 5 "$LOGS/$name.log" >&2 || true
      die "$name exited as it started again; see $LOGS/$name.log"
    fi
    log "$name found a port taken as it started (attempt $attempt of 3):"
    grep 'address already in use' "$LOGS/$name.log" | tail -n 1 >&2
    mv -f "$LOGS/$name.log" "$LOGS/$name.log.attempt$attempt"
  done
  die "$name could not listen on its ports ${ports[*]} in 3 attempts (address already in use); see $LOGS/$name.log.attempt*"
}

# cmd_restart NAME: stops the one component NAME (etcd or kube-apiserver) by
# its recorded PID and starts it again with the same command line (so the
# same flags, ports and data), then waits until it and the API server are
# ready. The other components keep running. It holds the machine's ports
# lock meanwhile, so no other cluster's `up` takes the ports it leaves free
# for a moment.
cmd_restart() {
  local name=${1:-} pid url
  case $name in
    etcd | kube-apiserver) ;;
    *) echo "usage: $0 restart etcd|kube-apiserver" >&2; exit 2 ;;
  esac
  mkdir -p "$CLUSTER_DIR"
  exec 9>"$CLUSTER_DIR/up.lock"
  flock 9
  alive "$name" || die "$name is not running (see $0 up)"
  pid=$(cat "$PIDS/$name.pid")
  local args=()
  mapfile -d '' args < "/proc/$pid/cmdline"
  local t0=$SECONDS
  lock_ports
  log "stopping $name (pid $pid)"
  stop "$name" || true
  log "starting $name again (its earlier log: $LOGS/$name.log.prev)"
  mv -f "$LOGS/$name.log" "$LOGS/$name.log.prev" 2>/dev/null || true
  start_again "$name" "${args[@]:1}"
  flock -u 8
  if [[ $name == etcd ]]; then
    url=$(flag_value listen-client-urls "${args[@]:1}") || die "etcd has no --listen-client-urls"
    wait_for etcd 30 etcd_healthy "${url##*:}"
  fi
  wait_for kube-apiserver 60 ready
  log "$name restarted, API server ready in $((SECONDS - t0))s"
}

cmd_status() {
  if ready; then
    log "API server $(server_url) is ready"
    return 0
  fi
  log "local cluster is not ready"
  return 1
}

cmd_env() { echo "export KUBECONFIG=$KUBECONFIG_FILE"; }

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  restart) cmd_restart "${2:-}" ;;
  *) echo "usage: $0 up|down|status|env|restart etcd|kube-apiserver" >&2; exit 2 ;;
esac
