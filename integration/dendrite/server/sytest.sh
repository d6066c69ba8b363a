#!/usr/bin/env bash
# sytest.sh STOCK_BIN PATCHED_BIN [TEST_FILE...]: Sytest (Matrix's homeserver suite, branch dendrite)
# against a stock and a patched Dendrite v0.13.8, each BIN a directory holding dendrite,
# generate-config and generate-keys (make dendrite: bin/stock and bin). Sytest drives
# them through its own harness (-I Dendrite::Monolith -d BIN), with Dendrite's
# sytest-whitelist and sytest-blacklist (from the module cache's v0.13.8), on SQLite,
# PostgreSQL or both (SYTEST_DB=sqlite|postgres|all, default all). TEST_FILEs (paths in
# Sytest's tree, tests/50federation/36state.pl) run only those; default: every test.
#
# Pass rule, per database: the patched build has no unexpected failure and passes
# (ok, or ok although listed as an expected failure) every test the stock build passes.
# Exit 0 when it holds on every database run, 1 otherwise.
#
# Outputs, in SYTEST_OUT (default SYTEST_WORK/results):
#   DB-BUILD.tap      Sytest's TAP output (DB sqlite|postgres, BUILD stock|patched)
#   DB-BUILD.log      its progress on stderr
#   DB-BUILD.results  one line per test, "STATUS<TAB>NAME", sorted by name; STATUS is
#                     pass, skip, xfail (expected failure), xpass (listed as expected
#                     failure, passed) or FAIL (unexpected failure)
#   DB.diff           diff -u of DB-stock.results and DB-patched.results
#   summary.txt       the summary printed at the end: counts per build and DB
# The servers' working files and logs are in SYTEST_WORK/work/DB-BUILD/server-N
# (dendrite-logs/, dendrite.yaml), kept until the next run.
#
# Requires: go (to find Dendrite's module directory), perl, Debian's apt-get and dpkg
# (the Perl packages below are installed when missing; that needs root), the Sytest
# tarball (SYTEST_TARBALL, default ../shared/peer-suites/sytest-dendrite-058c625f.tar.gz
# beside the repository; from github.com/matrix-org/sytest, branch dendrite) and the
# Perl modules Debian lacks (SYTEST_PERL5LIB, default ../shared/peer-suites/perl5).
# PostgreSQL: Sytest's Dendrite harness connects to 127.0.0.1:5432 only, so a
# throwaway server (scripts/pgserver.sh, cluster in PG_DIR) is started on port 5432 and
# stopped after; when another process holds 5432 the PostgreSQL runs are skipped,
# with a message. TIMEOUT_FACTOR (Sytest's own: test timeouts are multiplied by it)
# passes through to Sytest, and SYTEST_ARGS are added to its command line (-p 8900:8999,
# the ports for its servers, lets two runs share the machine).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: sytest.sh STOCK_BIN PATCHED_BIN [TEST_FILE...]" >&2; exit 2; }
GO=${GO:-go}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
SHARED=$REPO/../shared/peer-suites
TARBALL=${SYTEST_TARBALL:-$SHARED/sytest-dendrite-058c625f.tar.gz}
PERLLIB=${SYTEST_PERL5LIB:-$SHARED/perl5}
WORK=${SYTEST_WORK:-$REPO/.build/sytest}
OUT=${SYTEST_OUT:-$WORK/results}
PG_DIR=${PG_DIR:-/tmp/mtxdb-pg-$(basename "$REPO")-sytest}
PG_PORT=5432
case ${SYTEST_DB:-all} in
sqlite | postgres) DBS=$SYTEST_DB ;;
all) DBS="sqlite postgres" ;;
*) echo "sytest.sh: SYTEST_DB must be sqlite, postgres or all, not '$SYTEST_DB'" >&2; exit 2 ;;
esac
declare -A BIN=([stock]=$1 [patched]=$2)
shift 2
TESTS=("$@")
for b in stock patched; do
	for f in dendrite generate-config generate-keys; do
		[ -x "${BIN[$b]}/$f" ] || { echo "sytest.sh: no ${BIN[$b]}/$f (run make dendrite)" >&2; exit 1; }
	done
	BIN[$b]=$(cd "${BIN[$b]}" && pwd)
done
[ -f "$TARBALL" ] || {
	echo "sytest.sh: no Sytest tarball at $TARBALL: get Sytest's branch dendrite from github.com/matrix-org/sytest (a tarball of its tree, top folder sytest/) and set SYTEST_TARBALL=FILE" >&2
	exit 1
}
[ -d "$PERLLIB" ] || { echo "sytest.sh: no $PERLLIB (SYTEST_PERL5LIB: Net::Async::HTTP::Server and Crypt::Ed25519 for Sytest)" >&2; exit 1; }
PERLLIB=$(cd "$PERLLIB" && pwd)

# Debian's Perl modules Sytest needs.
PKGS="libclass-method-modifiers-perl libdata-dump-perl libdbi-perl libdbd-pg-perl
libdigest-hmac-perl libemail-address-xs-perl libemail-mime-perl libfile-slurper-perl
libfuture-perl libhttp-message-perl libio-async-perl libio-async-ssl-perl
libio-socket-ip-perl libio-socket-ssl-perl libjson-perl liblist-utilsby-perl
libmodule-pluggable-perl libnet-async-http-perl libnet-ssleay-perl libstruct-dumb-perl
liburi-perl libyaml-libyaml-perl libcryptx-perl libmetrics-any-perl"
missing=
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
	[ "$(id -u)" -eq 0 ] || { echo "sytest.sh: missing Debian packages (installing them needs root):$missing" >&2; exit 1; }
	echo "== apt-get install$missing"
	apt="env DEBIAN_FRONTEND=noninteractive apt-get -q -y"
	# shellcheck disable=SC2086
	$apt install --no-install-recommends $missing >"$WORK.apt.log" 2>&1 ||
		{ $apt update >>"$WORK.apt.log" 2>&1 && $apt install --no-install-recommends $missing >>"$WORK.apt.log" 2>&1; } ||
		{ tail -n 20 "$WORK.apt.log" >&2; exit 1; }
fi

# Sytest, unpacked once per tarball.
mkdir -p "$WORK" "$OUT"
stamp=$(sha256sum "$TARBALL" | cut -c1-16)
SYTEST=$WORK/sytest
if [ "$(cat "$SYTEST/.mtxdb-stamp" 2>/dev/null)" != "$stamp" ]; then
	rm -rf "$SYTEST" "$WORK/unpack"
	mkdir "$WORK/unpack"
	tar -xzf "$TARBALL" -C "$WORK/unpack"
	[ -x "$WORK/unpack/sytest/run-tests.pl" ] || { echo "sytest.sh: $TARBALL holds no sytest/run-tests.pl" >&2; exit 1; }
	mv "$WORK/unpack/sytest" "$SYTEST"
	rm -rf "$WORK/unpack"
	echo "$stamp" >"$SYTEST/.mtxdb-stamp"
fi
export PERL5LIB=$PERLLIB
(cd "$SYTEST" && perl -Ilib -c run-tests.pl >/dev/null 2>"$WORK/perl-check.log") ||
	{ cat "$WORK/perl-check.log" >&2; echo "sytest.sh: Sytest's Perl modules do not load" >&2; exit 1; }

# Dendrite's lists of the tests it passes (whitelist) and of flaky ones (blacklist).
D=$(cd "$REPO/integration/dendrite" && $GO mod download -json github.com/matrix-org/dendrite@v0.13.8 |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -f "$D/sytest-whitelist" ] || { echo "sytest.sh: no sytest-whitelist in Dendrite v0.13.8's module directory '$D'" >&2; exit 1; }

# results TAP: the top-level test lines of Sytest's TAP as "STATUS<TAB>NAME", by name.
results() {
	perl -ne '
		next unless /^(not )?ok \d+ (.*)$/;
		my ($not, $t) = ($1, $2);
		my $st = $t =~ s/ # skip\b.*$//            ? "skip"
		       : $t =~ s/ # TODO passed but expected fail$// ? "xpass"
		       : $t =~ s/ # TODO expected fail$//   ? "xfail"
		       : $not                               ? "FAIL" : "pass";
		$t =~ s/^\(expected fail\) //;
		$t =~ s/ \(\d+ subtests\)$//;
		print "$st\t$t\n";' "$1" | LC_ALL=C sort -t "$(printf '\t')" -k2,2 -k1,1
}

counts() {
	awk -F '\t' '{ n[$1]++ } END { printf "pass=%d skip=%d xfail=%d xpass=%d unexpected=%d (%d tests)",
		n["pass"], n["skip"], n["xfail"], n["xpass"], n["FAIL"], NR }' "$1"
}

# run DB BUILD: Sytest against BUILD on DB; writes OUT/DB-BUILD.{tap,log,results}.
run() {
	local db=$1 build=$2 w=$WORK/work/$1-$2 start i
	w_now=$w
	stop_servers "$w"
	rm -rf "$w"
	for i in 0 1 2; do
		mkdir -p "$w/server-$i"
		if [ "$db" = sqlite ]; then
			printf 'name: sqlite3\nargs:\n  database: %s\n' "$w/server-$i/sytest.db" >"$w/server-$i/database.yaml"
		else
			pg_sql "DROP DATABASE IF EXISTS sytest$i WITH (FORCE)" "CREATE DATABASE sytest$i"
			printf 'name: psycopg2\nargs:\n  dbname: sytest%s\n  user: %s\n  password: %s\n  host: 127.0.0.1\n  sslmode: disable\n' \
				"$i" "$PGUSER" "$PGPASSWORD" >"$w/server-$i/database.yaml"
		fi
	done
	echo "== sytest $db $build: ${BIN[$build]} (load $(cut -d' ' -f1-3 /proc/loadavg))"
	start=$(date +%s)
	(
		cd "$SYTEST"
		[ "$db" = postgres ] && export POSTGRES=1 || unset POSTGRES
		./run-tests.pl -I Dendrite::Monolith -d "${BIN[$build]}" -W "$D/sytest-whitelist" -B "$D/sytest-blacklist" \
			-O tap --all --work-directory="$w" --exclude-deprecated ${SYTEST_ARGS:-} "${TESTS[@]}" >"$OUT/$db-$build.tap" 2>"$OUT/$db-$build.log"
	) || true
	stop_servers "$w"
	grep -q '^1\.\.[0-9]' "$OUT/$db-$build.tap" || {
		tail -n 20 "$OUT/$db-$build.log" >&2
		echo "sytest.sh: Sytest did not finish on $db $build (TAP without a plan line: $OUT/$db-$build.tap)" >&2
		exit 1
	}
	results "$OUT/$db-$build.tap" >"$OUT/$db-$build.results"
	echo "$db $build: $(counts "$OUT/$db-$build.results"), $(($(date +%s) - start)) s, load $(cut -d' ' -f1-3 /proc/loadavg)" |
		tee -a "$OUT/summary.txt"
}

# stop_servers DIR: end the Dendrite processes whose config is in DIR (an interrupted
# Sytest can leave one behind, holding ports the next run needs).
stop_servers() {
	local pid
	for pid in $(pgrep -f -- "--config $1/server-" || true); do kill "$pid" 2>/dev/null || true; done
}

pg_sql() {
	local q
	for q in "$@"; do
		PGOPTIONS='-c client_min_messages=warning' psql -X -q -h 127.0.0.1 -p "$PG_PORT" -d postgres -c "$q" >/dev/null
	done
}

# port_busy PORT: a socket listens on PORT (IPv4 or IPv6).
port_busy() {
	awk -v p="$(printf ':%04X' "$1")" '$4 == "0A" && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
		/proc/net/tcp /proc/net/tcp6 2>/dev/null
}

: >"$OUT/summary.txt"
status=0
pg_started=
trap '[ -z "${w_now:-}" ] || stop_servers "$w_now"; [ -z "$pg_started" ] || "$REPO/scripts/pgserver.sh" stop "$PG_DIR"' EXIT
for db in $DBS; do
	if [ "$db" = postgres ]; then
		if ! PGSERVER_PORT=$PG_PORT "$REPO/scripts/pgserver.sh" url "$PG_DIR" >/dev/null 2>&1 && port_busy $PG_PORT; then
			echo "postgres: skipped: 127.0.0.1:$PG_PORT is in use by another process (Sytest's Dendrite harness connects to port $PG_PORT only)" |
				tee -a "$OUT/summary.txt"
			continue
		fi
		PGSERVER_FAST=1 PGSERVER_PORT=$PG_PORT "$REPO/scripts/pgserver.sh" start "$PG_DIR" >/dev/null
		pg_started=1
		# shellcheck disable=SC1091
		. "$PG_DIR/env"
		export PGUSER PGPASSWORD
	fi
	run "$db" stock
	run "$db" patched
	diff -u "$OUT/$db-stock.results" "$OUT/$db-patched.results" >"$OUT/$db.diff" || true
	echo "== $db: diff of the sorted results, stock -> patched ($OUT/$db.diff):"
	if [ -s "$OUT/$db.diff" ]; then cat "$OUT/$db.diff"; else echo "(none: identical)"; fi
	lost=$(awk -F '\t' 'NR == FNR { if ($1 == "pass" || $1 == "xpass") p[$2] = 1; next }
		($1 == "pass" || $1 == "xpass") { delete p[$2] } END { for (t in p) print t }' \
		"$OUT/$db-stock.results" "$OUT/$db-patched.results" | LC_ALL=C sort)
	unexpected=$(awk -F '\t' '$1 == "FAIL" { print $2 }' "$OUT/$db-patched.results")
	if [ -n "$unexpected$lost" ]; then
		status=1
		{
			echo "$db: FAIL"
			[ -z "$unexpected" ] || echo "$unexpected" | sed 's/^/  patched, unexpected failure: /'
			[ -z "$lost" ] || echo "$lost" | sed 's/^/  stock passes, patched does not: /'
		} | tee -a "$OUT/summary.txt"
	else
		echo "$db: ok (patched: no unexpected failure, passes every test stock passes)" | tee -a "$OUT/summary.txt"
	fi
done
echo "== summary ($OUT/summary.txt):"
cat "$OUT/summary.txt"
exit $status
