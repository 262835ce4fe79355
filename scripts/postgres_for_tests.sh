#!/bin/sh
# A throwaway PostgreSQL for the SQLAlchemySession tests (tests/sdk/test_sessions*.py), on 127.0.0.1.
#
#   sh scripts/postgres_for_tests.sh run CMD...     # start, run CMD with PARLEY_TEST_POSTGRES_URL set, stop
#   url=$(sh scripts/postgres_for_tests.sh start)   # prints the URL the tests read (PARLEY_TEST_POSTGRES_URL)
#   sh scripts/postgres_for_tests.sh stop
#
# run with PARLEY_TEST_POSTGRES_URL already set (a server of your own) just runs CMD.
# start: install the server where this machine allows it (root with apt-get: package postgresql), make a
# cluster in a temporary folder (trust auth, listening on 127.0.0.1 only, its socket in that folder),
# start it, print its URL. PostgreSQL refuses to run as root, so as root the cluster belongs to the
# `postgres` user the package creates (run with runuser). Never fails the build: when the server cannot
# be had, it says why in one line (stderr) and still prints the URL, so the tests skip naming the server.
# Progress goes to stderr; stdout carries only the URL.
set -u
PORT="${PARLEY_TEST_POSTGRES_PORT:-54329}"
DIR="${PARLEY_TEST_POSTGRES_DIR:-${TMPDIR:-/tmp}/parley-test-postgres-$(id -u)}"
URL="postgresql+psycopg://postgres@127.0.0.1:$PORT/postgres"

say() { echo "postgres_for_tests: $*" >&2; }
bindir() {
    for candidate in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        [ -x "$candidate/initdb" ] && [ -x "$candidate/pg_ctl" ] && { echo "$candidate"; return 0; }
    done
    command -v pg_ctl >/dev/null 2>&1 && dirname "$(command -v pg_ctl)" && return 0
    return 1
}
as_owner() {  # run a server command as the cluster's owner (not root)
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "${1:-start}" in
run)
    shift
    [ -n "${PARLEY_TEST_POSTGRES_URL:-}" ] && exec "$@"
    PARLEY_TEST_POSTGRES_URL=$(sh "$0" start)
    export PARLEY_TEST_POSTGRES_URL
    "$@"
    status=$?
    sh "$0" stop
    exit $status
    ;;
stop)
    BIN=$(bindir) || exit 0
    [ -f "$DIR/data/PG_VERSION" ] && as_owner "$BIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null 2>&1
    rm -rf "$DIR"
    exit 0
    ;;
start) ;;
*) say "usage: $0 run CMD... | start | stop"; exit 2 ;;
esac

BIN=$(bindir)
if [ -z "$BIN" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing PostgreSQL for the SQLAlchemy tests (apt-get install -y postgresql)"
    export DEBIAN_FRONTEND=noninteractive
    apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@" >/dev/null 2>&1; }
    apt_get install -y -qq --no-install-recommends postgresql ||
        { apt_get update -qq && apt_get install -y -qq --no-install-recommends postgresql; }
    BIN=$(bindir)
fi
if [ -z "$BIN" ]; then
    say "NOTE: PostgreSQL is not installed, so its session tests will skip; fix: apt-get install -y postgresql"
    echo "$URL"
    exit 0
fi
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    say "NOTE: no 'postgres' user to run the server as (PostgreSQL refuses root); its session tests will skip"
    echo "$URL"
    exit 0
fi

if as_owner "$BIN/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; then
    echo "$URL"  # already running (an earlier start without a stop): reuse it
    exit 0
fi
rm -rf "$DIR"
mkdir -p "$DIR"
[ "$(id -u)" = 0 ] && chown postgres "$DIR"
if ! as_owner "$BIN/initdb" -D "$DIR/data" -U postgres --auth=trust -E UTF8 --no-sync >"$DIR.initdb.log" 2>&1; then
    say "NOTE: initdb failed, so the PostgreSQL session tests will skip: $(tail -n 3 "$DIR.initdb.log" | tr '\n' ' ')"
    echo "$URL"
    exit 0
fi
rm -f "$DIR.initdb.log"
# fsync off: a test cluster, thrown away; the SIGKILL tests kill clients, never this server
options="-c listen_addresses=127.0.0.1 -p $PORT -c unix_socket_directories=$DIR -c fsync=off -c max_connections=100"
if ! as_owner "$BIN/pg_ctl" -D "$DIR/data" -o "$options" -l "$DIR/server.log" -w -t 60 start >/dev/null 2>&1; then
    say "NOTE: the PostgreSQL server did not start, so its session tests will skip: $(tail -n 3 "$DIR/server.log" 2>/dev/null | tr '\n' ' ')"
    echo "$URL"
    exit 0
fi
say "PostgreSQL $(basename "$(dirname "$BIN")") on 127.0.0.1:$PORT (data in $DIR)"
echo "$URL"
