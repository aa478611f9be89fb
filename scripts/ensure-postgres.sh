#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the catalog tests, installing PostgreSQL first if needed.
#
#   scripts/ensure-postgres.sh [--dir DIR] [--port PORT]   start; prints the database URL on stdout
#   scripts/ensure-postgres.sh --stop DIR                  stop the server of DIR and remove DIR
#
# The cluster lives in DIR (default: a new temp dir), listens on 127.0.0.1 only (PORT default: a free
# one) with trust authentication, and runs with fsync off: it is for tests, never for data you keep.
# PostgreSQL refuses to run as root, so as root the server runs as the `postgres` system user (created
# by the Debian package). Everything but the URL goes to stderr.
set -euo pipefail

log() { echo "ensure-postgres: $*" >&2; }
die() { log "error: $*"; exit 1; }

dir=""
port=""
stop=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=${2:?--dir needs a directory}; shift 2 ;;
    --port) port=${2:?--port needs a number}; shift 2 ;;
    --stop) stop=${2:?--stop needs the directory given to --dir}; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" >&2; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

find_bindir() {
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4,4 -n -r); do
    if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then echo "$d"; return 0; fi
  done
  if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(command -v initdb)"; return 0
  fi
  return 1
}

run_as_owner() {
  # Run a command as the cluster's owner (postgres when we are root).
  if [ "$(id -u)" = 0 ]; then
    if command -v runuser >/dev/null 2>&1; then
      runuser -u postgres -- "$@"
    else
      su postgres -s /bin/sh -c "$(printf '%q ' "$@")"
    fi
  else
    "$@"
  fi
}

if [ -n "$stop" ]; then
  bindir=$(find_bindir) || die "PostgreSQL binaries not found"
  if [ -f "$stop/data/postmaster.pid" ]; then
    run_as_owner "$bindir/pg_ctl" -D "$stop/data" -m immediate -w stop >&2 || log "pg_ctl stop failed"
  fi
  rm -rf -- "$stop"
  exit 0
fi

if ! bindir=$(find_bindir); then
  command -v apt-get >/dev/null 2>&1 || die "PostgreSQL is not installed and apt-get is not available: install PostgreSQL (initdb, pg_ctl) or set STATEKEEPER_TEST_PG_URL"
  [ "$(id -u)" = 0 ] || die "PostgreSQL is not installed; run as root to apt-get install it, or set STATEKEEPER_TEST_PG_URL"
  log "installing PostgreSQL with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends postgresql >&2 || die "apt-get install postgresql failed"
  bindir=$(find_bindir) || die "PostgreSQL installed but initdb/pg_ctl not found"
fi

if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  log "creating the postgres system user"
  useradd --system --home-dir /var/lib/postgresql --shell /bin/sh postgres
fi

if [ -z "$dir" ]; then
  dir=$(mktemp -d "${TMPDIR:-/tmp}/statekeeper-pg.XXXXXX")
fi
mkdir -p "$dir"
[ -z "$(ls -A "$dir")" ] || die "directory $dir is not empty"
if [ "$(id -u)" = 0 ]; then
  chown postgres: "$dir"
  # The server must be able to reach its directory: every parent needs o+x.
  p=$(dirname "$dir")
  while [ "$p" != / ]; do
    run_as_owner test -x "$p" 2>/dev/null || die "the postgres user cannot enter $p; pass --dir under /tmp"
    p=$(dirname "$p")
  done
fi
chmod 700 "$dir"

if [ -z "$port" ]; then
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
fi

user=statekeeper
db=statekeeper
run_as_owner "$bindir/initdb" -D "$dir/data" -U "$user" -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
  || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
opts="-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
if ! run_as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -o "$opts" -w -t 60 start >&2; then
  cat "$dir/server.log" >&2 || true
  die "the server did not start (log above)"
fi
run_as_owner "$bindir/createdb" -h 127.0.0.1 -p "$port" -U "$user" "$db" >&2 || die "createdb failed"

log "PostgreSQL $("$bindir/pg_ctl" --version | awk '{print $3}') running on 127.0.0.1:$port in $dir; stop: $0 --stop $dir"
echo "postgresql+psycopg://$user@127.0.0.1:$port/$db"
