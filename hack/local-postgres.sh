#!/usr/bin/env bash
# A throwaway PostgreSQL server on loopback, for HELM_DRIVER=sql (helm's SQL
# storage driver): Debian's postgresql package, a data directory of its own,
# trust authentication for the user helm, no fsync.
#
#   hack/local-postgres.sh up       create (once) and start it; idempotent
#   hack/local-postgres.sh down     stop it
#   hack/local-postgres.sh status   exit 0 when it accepts connections
#   hack/local-postgres.sh env      print HELM_DRIVER and
#                                   HELM_DRIVER_SQL_CONNECTION_STRING exports
#
# State lives in $LOCAL_POSTGRES_DIR (default .local-postgres/ in the repo):
# the port, logs/; the server's data, socket and log are there too, except
# as root. PostgreSQL refuses to run as root: as root the server runs as the
# user postgres (the package creates it), with its files in a directory of
# its own under /tmp. A missing package is installed by .ci/run; here it is an error that
# names the command.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

PG_DIR=${LOCAL_POSTGRES_DIR:-$REPO_ROOT/.local-postgres}
PORT_FILE="$PG_DIR/port"
# The server's own files (data, socket, log) must be reachable by the user
# it runs as: as root that is postgres, which may not enter the checkout
# (under /root, say), so they go to a directory of their own under /tmp,
# named after PG_DIR.
if ((EUID == 0)); then
  RUN_DIR=${TMPDIR:-/tmp}/helm-autorecover-postgres-$(printf %s "$PG_DIR" | md5sum | cut -c1-12)
else
  RUN_DIR=$PG_DIR
fi
DATA="$RUN_DIR/data"
LOG="$RUN_DIR/postgres.log"

pg_bin() {
  if [[ -n ${PG_BIN:-} ]]; then
    echo "$PG_BIN"
    return
  fi
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
  [[ -n $d && -x $d/postgres ]] || die "no PostgreSQL server found; install it: apt-get install -y postgresql (or set PG_BIN)"
  echo "$d"
}

# as_owner CMD...: runs CMD as the owner of the data directory (postgres
# when we are root, else ourselves).
as_owner() {
  if ((EUID == 0)); then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

port() { cat "$PORT_FILE" 2>/dev/null; }

ready() {
  local p
  p=$(port) || return 1
  [[ -n $p ]] || return 1
  "$(pg_bin)/pg_isready" -q -h 127.0.0.1 -p "$p" -U helm -d postgres >/dev/null 2>&1
}

cmd_up() {
  local bin t0=$SECONDS
  bin=$(pg_bin)
  mkdir -p "$PG_DIR/logs"
  exec 9>"$PG_DIR/up.lock"
  flock 9
  if ready; then
    log "PostgreSQL on port $(port) is already running"
    return 0
  fi
  mkdir -p "$RUN_DIR"
  if ((EUID == 0)); then
    getent passwd postgres >/dev/null || die "running as root needs the user postgres (the postgresql package creates it)"
    chown postgres "$RUN_DIR"
    chmod 700 "$RUN_DIR"
  fi
  if [[ ! -f $DATA/PG_VERSION ]]; then
    as_owner rm -rf "$DATA"
    log "creating the database cluster in $DATA"
    as_owner "$bin/initdb" -D "$DATA" -U helm --auth=trust -E UTF8 --no-sync >"$PG_DIR/logs/initdb.log" 2>&1 ||
      die "initdb failed; see $PG_DIR/logs/initdb.log"
  fi
  local p
  p=$(free_port)
  echo "$p" >"$PORT_FILE"
  log "starting PostgreSQL on 127.0.0.1:$p"
  as_owner "$bin/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start \
    -o "-k $RUN_DIR -p $p -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" >/dev/null 9>&- ||
    die "PostgreSQL did not start; see $LOG"
  ready || die "PostgreSQL started but does not accept connections; see $LOG"
  log "PostgreSQL ready in $((SECONDS - t0))s"
}

cmd_down() {
  [[ -f $DATA/postmaster.pid ]] || { log "PostgreSQL is not running"; return 0; }
  as_owner "$(pg_bin)/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null || die "PostgreSQL did not stop; see $LOG"
  log "PostgreSQL stopped"
}

cmd_status() {
  if ready; then
    log "PostgreSQL on 127.0.0.1:$(port) is ready"
    return 0
  fi
  log "local PostgreSQL is not ready"
  return 1
}

cmd_env() {
  local p
  p=$(port) || die "local PostgreSQL was never started (see $0 up)"
  echo "export HELM_DRIVER=sql"
  echo "export HELM_DRIVER_SQL_CONNECTION_STRING='host=127.0.0.1 port=$p user=helm dbname=postgres sslmode=disable'"
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  *) echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
esac
