# Shared settings for the hack/ scripts. Source it; do not run it.
# shellcheck shell=bash
HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HACK_DIR/.." && pwd)
# The cache of built control-plane and helm binaries lives outside the clone so
# that fresh clones and CI runs on the same machine reuse it.
CACHE_DIR=${HELM_AUTORECOVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/helm-autorecover}
BIN_CACHE="$CACHE_DIR/bin"
CLUSTER_DIR=${LOCAL_CLUSTER_DIR:-$REPO_ROOT/.local-cluster}
[[ $CLUSTER_DIR == /* ]] || CLUSTER_DIR=$PWD/$CLUSTER_DIR

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# modversion DIR MODULE prints the version of MODULE required by the build module in DIR.
modversion() { (cd "$1" && go list -m -f '{{.Version}}' "$2"); }

# The control plane's and PostgreSQL's listening ports are chosen below the
# kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range, usually
# 32768-60999): an outgoing connection takes its local port from that range,
# so a port there that a stopped server leaves free for a moment can be
# taken by any client and the server cannot bind it again ("address already
# in use"). Below the range only servers bind.
PORT_MIN=${LOCAL_CLUSTER_PORT_MIN:-20000}

# ephemeral_low prints the low end of the kernel's ephemeral port range.
ephemeral_low() {
  local lo _
  read -r lo _ < /proc/sys/net/ipv4/ip_local_port_range
  echo "$lo"
}

# free_ports N KEY [AVOID...] prints N distinct TCP ports on 127.0.0.1 that
# can be listened on now, from PORT_MIN up to below the ephemeral range,
# none of AVOID. The scan starts at a point drawn from KEY (a state folder),
# so two clusters with folders of their own look in different places.
free_ports() {
  local n=$1 key=$2 lo; shift 2
  lo=$(ephemeral_low)
  if ((lo - PORT_MIN < 100)); then
    die "the kernel's ephemeral port range starts at $lo (/proc/sys/net/ipv4/ip_local_port_range), too close to LOCAL_CLUSTER_PORT_MIN=$PORT_MIN: set LOCAL_CLUSTER_PORT_MIN lower or raise the range's low end"
  fi
  python3 - "$n" "$key" "$PORT_MIN" "$lo" "$@" <<'PY'
import socket, sys, zlib
n, key, lo, hi = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
avoid = {int(a) for a in sys.argv[5:]}
span = hi - lo
start = zlib.crc32(key.encode()) % span
out = []
for i in range(span):
    p = lo + (start + i) % span
    if p in avoid:
        continue
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", p))
        s.listen(1)
    except OSError:
        continue
    finally:
        s.close()
    out.append(p)
    if len(out) == n:
        break
if len(out) < n:
    sys.exit("no %d free ports on 127.0.0.1 in %d-%d" % (n, lo, hi - 1))
print(" ".join(map(str, out)))
PY
}

# free_port [KEY] prints one such port (see free_ports).
free_port() { free_ports 1 "${1:-$REPO_ROOT}"; }

# port_bindable PORT: a server could listen on 127.0.0.1:PORT now (as a Go
# server does: SO_REUSEADDR, so connections in TIME_WAIT do not count).
port_bindable() {
  python3 - "$1" <<'PY'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
    s.listen(1)
except OSError:
    sys.exit(1)
finally:
    s.close()
PY
}

# port_holders PORT prints the TCP sockets on local port PORT (any address),
# one a line: state, local and remote address, and the processes that have
# it open (pid and name). It reads /proc, so it needs no ss.
port_holders() {
  python3 - "$1" <<'PY'
import os, socket, struct, sys
port = int(sys.argv[1])
states = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
          "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}
def addr(h):
    ip, p = h.split(":")
    if len(ip) == 8:
        return "%s:%d" % (socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(ip, 16))), int(p, 16))
    return "[%s]:%d" % (socket.inet_ntop(socket.AF_INET6, b"".join(struct.pack("<I", int(ip[k:k + 8], 16)) for k in range(0, 32, 8))), int(p, 16))
socks = {}
for f in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        lines = open(f).read().splitlines()[1:]
    except OSError:
        continue
    for l in lines:
        x = l.split()
        if int(x[1].split(":")[1], 16) == port:
            socks[x[9]] = "%s %s -> %s" % (states.get(x[3], x[3]), addr(x[1]), addr(x[2]))
owners = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        fds = os.listdir("/proc/%s/fd" % pid)
        comm = open("/proc/%s/comm" % pid).read().strip()
    except OSError:
        continue
    for fd in fds:
        try:
            t = os.readlink("/proc/%s/fd/%s" % (pid, fd))
        except OSError:
            continue
        if t.startswith("socket:[") and t[8:-1] in socks:
            owners.setdefault(t[8:-1], set()).add("pid=%s (%s)" % (pid, comm))
for ino, desc in socks.items():
    print(desc, " ".join(sorted(owners.get(ino, ()))) or "(no process: the kernel holds it, as in TIME_WAIT)")
if not socks:
    print("(no TCP socket on port %d seen in /proc/net/tcp)" % port)
PY
}

# wait_port_free PORT TIMEOUT WHAT: waits until PORT can be listened on, at
# most TIMEOUT seconds, else fails naming the port and who holds it.
wait_port_free() {
  local port=$1 timeout=$2 what=$3 deadline=$((SECONDS + $2)) warned=0
  until port_bindable "$port"; do
    if ((SECONDS >= deadline)); then
      log "sockets on port $port:"
      port_holders "$port" | sed 's/^/  /' >&2
      die "port $port on 127.0.0.1 ($what) is still in use ${timeout}s after it stopped; the sockets above hold it (a client's outgoing connection takes its port from the ephemeral range $(tr '\t' '-' < /proc/sys/net/ipv4/ip_local_port_range)); stop their process, or run \`$0 down\` and \`$0 up\` for new ports"
    fi
    if ((!warned)); then
      log "port $port ($what) is still in use; waiting up to ${timeout}s for it to be free"
      warned=1
    fi
    sleep 0.5
  done
}

# build_platforms DIR OS/ARCH... builds ./cmd/helm-autorecover for each
# platform, static (CGO_ENABLED=0) and -trimpath, with $LDFLAGS, into
# DIR/<os>_<arch>/helm-autorecover (.exe on windows): BUILD_JOBS builds at a
# time (default: the number of CPUs; each go build also compiles packages in
# parallel, but its link step runs alone). Prints the time each took; on a
# failure, its output, after the others have ended.
build_platforms() {
  local dir=$1 jobs=${BUILD_JOBS:-$(nproc)} p os arch exe failed=0 running=0 start=$SECONDS
  shift
  mkdir -p "$dir"
  for p in "$@"; do
    os=${p%/*} arch=${p#*/} exe=helm-autorecover
    [[ $os == windows ]] && exe=helm-autorecover.exe
    if ((running >= jobs)); then
      wait -n || failed=1
      running=$((running - 1))
    fi
    (
      t=$SECONDS
      if CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -C "$REPO_ROOT" -trimpath -ldflags "${LDFLAGS:-}" \
        -o "$dir/${os}_${arch}/$exe" ./cmd/helm-autorecover > "$dir/${os}_${arch}.log" 2>&1; then
        log "built $os/$arch in $((SECONDS - t))s"
      else
        log "error: go build for $os/$arch failed:"
        cat "$dir/${os}_${arch}.log" >&2
        exit 1
      fi
    ) &
    running=$((running + 1))
  done
  while ((running > 0)); do
    wait -n || failed=1
    running=$((running - 1))
  done
  ((failed == 0)) || return 1
  log "built $# platforms in $((SECONDS - start))s, $jobs at a time"
}
