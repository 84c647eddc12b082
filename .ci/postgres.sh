#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the store tests; print its SQLAlchemy URL.
#
#   export FEDLITE_TEST_POSTGRES_URL="$(bash .ci/postgres.sh start)"
#   bash .ci/postgres.sh stop
#
# Debian's postgresql package is installed when its server binaries are missing (CI runs as
# root on a fresh machine). The cluster lives in a temporary directory owned by the postgres
# user, listens on 127.0.0.1 only, trusts local connections, and touches no system cluster.
set -euo pipefail
PGPORT="${FEDLITE_PG_PORT:-54329}"
PGDATA="${FEDLITE_PG_DIR:-/tmp/fedlite-ci-postgres}"

bindir() {
    local found
    found="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    if [[ -z "$found" || ! -x "$found/postgres" ]]; then
        echo "installing PostgreSQL from Debian packages" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2
        apt-get install -y -qq --no-install-recommends postgresql >&2
        found="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
    fi
    echo "$found"
}

as_postgres() {
    if [[ "$(id -u)" == 0 ]]; then
        su postgres -s /bin/sh -c "$*"
    else
        sh -c "$*"
    fi
}

case "${1:-start}" in
start)
    BIN="$(bindir)"
    if [[ ! -f "$PGDATA/PG_VERSION" ]]; then
        mkdir -p "$PGDATA"
        [[ "$(id -u)" == 0 ]] && chown postgres: "$PGDATA"
        as_postgres "'$BIN/initdb' -D '$PGDATA' -U postgres --auth=trust -E UTF8 >/dev/null"
    fi
    if ! as_postgres "'$BIN/pg_ctl' -D '$PGDATA' status" >/dev/null 2>&1; then
        as_postgres "'$BIN/pg_ctl' -D '$PGDATA' -w -l '$PGDATA/server.log' \
            -o \"-c listen_addresses=127.0.0.1 -p $PGPORT -k '$PGDATA'\" start" >&2
    fi
    echo "postgresql+psycopg://postgres@127.0.0.1:$PGPORT/postgres"
    ;;
stop)
    BIN="$(bindir)"
    as_postgres "'$BIN/pg_ctl' -D '$PGDATA' -m fast stop" >&2 || true
    ;;
*)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
