#!/usr/bin/env bash
# suite.sh SRC PG_DIR PACKAGES...: Dendrite's own tests in SRC (the patched copy that
# build.sh made: its roomserver opens mtxdb state tables through statetables.Swap), with
# both databases Dendrite's tests know (test.WithAllDatabases: SQLite, and PostgreSQL on
# a throwaway server from scripts/pgserver.sh, stopped after). Installs Debian's
# libolm-dev (clientapi's tests link libolm) when missing. A package that fails is run
# once more on its own: Dendrite's suite has timing-dependent tests that fail under
# load on stock builds too; a package failing twice fails the suite. go vet is off
# (-vet=off): Go 1.26's printf check rejects a Dendrite v0.13.8 test file
# (syncapi/storage/tables/relations_test.go:57, %q of a struct), which is not a test.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: suite.sh SRC PG_DIR PACKAGES..." >&2; exit 2; }
GO=${GO:-go}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
SRC=$(cd "$1" && pwd)
PG_DIR=$2
shift 2
[ -f "$SRC/.mtxdb-stamp" ] || { echo "suite.sh: $SRC is not a patched Dendrite copy (run make dendrite)" >&2; exit 1; }

if ! dpkg -s libolm-dev >/dev/null 2>&1; then
	[ "$(id -u)" -eq 0 ] || { echo "suite.sh: libolm-dev is missing and installing it needs root (apt-get install libolm-dev)" >&2; exit 1; }
	echo "== apt-get install libolm-dev"
	DEBIAN_FRONTEND=noninteractive apt-get -q -y install libolm-dev >/dev/null 2>&1 ||
		{ DEBIAN_FRONTEND=noninteractive apt-get -q update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get -q -y install libolm-dev >/dev/null; }
fi

url=$("$REPO/scripts/pgserver.sh" start "$PG_DIR")
trap '"$REPO/scripts/pgserver.sh" stop "$PG_DIR"' EXIT
# Dendrite's test/db.go reads POSTGRES_*; lib/pq reads PGPORT.
# shellcheck disable=SC1091
. "$PG_DIR/env"
export POSTGRES_USER=$PGUSER POSTGRES_PASSWORD=$PGPASSWORD POSTGRES_HOST=$PGHOST POSTGRES_DB=$PGDATABASE PGPORT
# A PostgreSQL roomserver keeps its mtxdb state in its own database; SQLite ones in a
# directory beside their file. statetables.Swap logs every store it opens to
# MTXDB_DENDRITE_STATE_LOG (the test databases are gone when the suite ends), and no
# store directory may appear under MTXDB_DENDRITE_STATE_BASE (where PostgreSQL
# stores were kept before they moved into the database).
STATE_BASE=$(mktemp -d /tmp/mtxdb-dendrite-suite-state.XXXXXX)
trap 'rm -rf "$STATE_BASE"; "$REPO/scripts/pgserver.sh" stop "$PG_DIR"' EXIT
export MTXDB_DENDRITE_STATE_BASE=$STATE_BASE/base MTXDB_DENDRITE_STATE_LOG=$STATE_BASE/opened.log
unset MTXDB_DENDRITE_STATE_DIR

cd "$SRC"
pkgs=$($GO list "$@")
n=$(echo "$pkgs" | wc -l)
echo "== Dendrite's tests: $n packages, SQLite and PostgreSQL (server on $PGHOST:$PGPORT)"
log=$(mktemp /tmp/mtxdb-dendrite-suite.XXXXXX.log)
start=$(date +%s)
set +e
$GO test -vet=off -count=1 -p 2 -timeout 30m $pkgs >"$log" 2>&1
set -e
grep -E '^(ok|FAIL|---|panic)' "$log" | grep -v -- '--- PASS' || true
failed=$(grep -E '^FAIL[[:space:]]+github.com/' "$log" | awk '{print $2}' | sort -u || true)
retried=
for p in $failed; do
	echo "== $p failed: running it once more on its own (log of the first run: $log)"
	if $GO test -vet=off -count=1 -timeout 30m "$p" >"$log.retry" 2>&1; then
		echo "ok (second run) $p"
		retried="$retried $p"
	else
		cat "$log.retry"
		echo "== FAIL: $p failed twice"
		exit 1
	fi
done
pg=$(grep -c '^postgres ' "$STATE_BASE/opened.log" 2>/dev/null || true)
dirs=$(grep -c '^directory ' "$STATE_BASE/opened.log" 2>/dev/null || true)
tested=$(grep -c -E '^ok[[:space:]]' "$log" || true)
echo "== all $tested packages with tests passed (of $n listed; $(($(date +%s) - start)) s)${retried:+; passed on the second run:$retried}; mtxdb state stores opened: ${pg:-0} in PostgreSQL roomserver databases, ${dirs:-0} SQLite store directories"
[ "${pg:-0}" -gt 0 ] && [ "${dirs:-0}" -gt 0 ] || { echo "== FAIL: no test opened an mtxdb state store on one of the databases: the swap is not in effect there" >&2; exit 1; }
[ ! -d "$STATE_BASE/base" ] || { echo "== FAIL: a PostgreSQL roomserver kept its state in a directory: $(ls "$STATE_BASE/base")" >&2; exit 1; }
