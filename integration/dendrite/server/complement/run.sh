#!/usr/bin/env bash
# Complement against the stock and the mtxdb-patched Dendrite of make dendrite, with
# Dendrite processes on 127.0.0.1 (this module's deploy package) instead of Docker.
#
#   run.sh PATCHED_BIN STOCK_BIN BUILD_DIR
#
# PATCHED_BIN and STOCK_BIN hold dendrite, generate-config and generate-keys.
# Environment:
#   COMPLEMENT_TARBALL  a .tar.gz of github.com/matrix-org/complement (one top
#                       directory holding its go.mod); required
#   COMPLEMENT_RUN      state (default): the federation, state and auth tests named
#                       in STATE_TESTS below; all: the packages tests and tests/csapi
#                       (the two Complement's CI runs for Dendrite) but the tests in
#                       excluded.txt
#   COMPLEMENT_EXCLUDED run: with COMPLEMENT_RUN=all, run the excluded tests too
#   COMPLEMENT_TIMEOUT  go test -timeout per build (default 30m for state, 120m for all)
#
# What it does, under BUILD_DIR (never in the repository's tree):
#   src/      the tarball unpacked afresh, with main_test.go of tests and tests/csapi
#             written from main_test.go.in (TestMain with deploy.New);
#   go.work   uses src and this module, so each imports the other;
#   results/  go test -json of each build (stock.json, patched.json) and of
#             TestInboundFederationRejectsEventsWithRejectedAuthEvents, built without
#             the dendrite_blacklist tag that leaves it out (rejected-auth-*.json);
#   work/     the servers' directories, kept for failed tests (server.log).
# Then complement-compare applies the pass rule (patched passes every test and
# subtest stock passes), prints the differences and exits 1 when it fails; tests
# that break it run once more on both builds first (stock-rerun.json,
# patched-rerun.json), whose results replace theirs. The rejected-auth-events test
# is one stock fails and the patched build must pass (the spec's rule that an event
# citing a rejected auth event is rejected): run.sh exits 1 when the patched build
# does not pass it, after the pass rule has run.
set -euo pipefail

patched_bin=$(cd "$1" && pwd)
stock_bin=$(cd "$2" && pwd)
build=$3
here=$(cd "$(dirname "$0")" && pwd)
run=${COMPLEMENT_RUN:-state}
tarball=${COMPLEMENT_TARBALL:-}
GO=${GO:-go}

if [ -z "$tarball" ] || [ ! -f "$tarball" ]; then
	echo "run.sh: no Complement tarball${tarball:+ at $tarball}. Set COMPLEMENT_TARBALL to a .tar.gz of" >&2
	echo "  github.com/matrix-org/complement (a GitHub archive of its main branch will do; 50044edb was" >&2
	echo "  measured here): the Go module proxy does not serve Complement." >&2
	exit 1
fi
for b in "$patched_bin" "$stock_bin"; do
	for f in dendrite generate-config generate-keys; do
		[ -x "$b/$f" ] || { echo "run.sh: $b/$f is missing: run make dendrite" >&2; exit 1; }
	done
done

STATE_TESTS='TestGetMissingEventsGapFilling|TestInboundCanReturnMissingEvents|TestOutboundFederationEventSizeGetMissingEvents|TestEventAuth|TestUnrejectRejectedEvents|TestJoinFederatedRoomWithUnverifiableEvents|TestBannedUserCannotSendJoin|TestCannotSendNon.*'
REJECTED_AUTH=TestInboundFederationRejectsEventsWithRejectedAuthEvents
case $run in
state)
	pkgs=(./tests)
	run_args=(-run "^($STATE_TESTS)\$")
	timeout=${COMPLEMENT_TIMEOUT:-30m}
	;;
all)
	pkgs=(./tests ./tests/csapi)
	run_args=()
	timeout=${COMPLEMENT_TIMEOUT:-120m}
	;;
*)
	echo "run.sh: COMPLEMENT_RUN is state or all, not '$run'" >&2
	exit 1
	;;
esac

mkdir -p "$build"
build=$(cd "$build" && pwd)

# Unpack afresh (half a megabyte; go's build cache keys on content, so nothing is
# compiled again for it).
rm -rf "$build/src"
mkdir -p "$build/src"
tar -xzf "$tarball" -C "$build/src" --strip-components=1
if ! grep -qx 'module github.com/matrix-org/complement' "$build/src/go.mod" 2>/dev/null; then
	echo "run.sh: $tarball does not hold github.com/matrix-org/complement in one top directory" >&2
	exit 1
fi
for dir in tests tests/csapi; do
	orig="$build/src/$dir/main_test.go"
	pkg=$(sed -n 's/^package \([A-Za-z0-9_]*\)$/\1/p' "$orig")
	ns=$(sed -n 's/.*complement\.TestMain(m, "\([^"]*\)".*/\1/p' "$orig")
	if [ -z "$pkg" ] || [ -z "$ns" ]; then
		echo "run.sh: $orig has no 'package' line or complement.TestMain(m, \"NAMESPACE\") call to replace" >&2
		exit 1
	fi
	sed -e "s/@PACKAGE@/$pkg/" -e "s/@NAMESPACE@/$ns/" "$here/main_test.go.in" >"$orig"
done
printf 'go 1.26.0\n\nuse (\n\t./src\n\t%s\n)\n' "$here" >"$build/go.work"
export GOWORK="$build/go.work"

echo "== complement: vet and test of $here"
(cd "$here" && $GO vet ./... && $GO test -count=1 ./cmd/...)
$GO build -o "$build/complement-compare" "$here/cmd/complement-compare"

rm -rf "$build/results"
skip_args=()
if [ "$run" = all ] && [ "${COMPLEMENT_EXCLUDED:-}" != run ]; then
	skip_args=(-skip "$("$build/complement-compare" -skip-regex "$here/excluded.txt")")
fi

# Complement's configuration: no Docker image (the deployer starts processes), its
# own federation servers on 127.0.0.1, a Docker socket that does not exist (its
# clean-up of containers finds no daemon and only logs that).
export COMPLEMENT_BASE_IMAGE=none COMPLEMENT_HOSTNAME_RUNNING_COMPLEMENT=127.0.0.1
export DOCKER_HOST="unix://$build/no-docker.sock"
export COMPLEMENT_SPAWN_HS_TIMEOUT_SECS=${COMPLEMENT_SPAWN_HS_TIMEOUT_SECS:-120}

# run_build NAME BIN OUT.json ARGS...: go test -json of Complement on one build.
run_build() {
	local name=$1 bin=$2 out=$3
	shift 3
	rm -rf "$build/work/$name"
	mkdir -p "$build/work/$name" "$build/results"
	local start load0 rc=0
	start=$(date +%s)
	load0=$(cut -d' ' -f1-3 /proc/loadavg)
	(cd "$build/src" && MTXDB_COMPLEMENT_BIN=$bin MTXDB_COMPLEMENT_WORK=$build/work/$name \
		$GO test -count=1 -json -p 1 -timeout "$timeout" "$@") >"$out" 2>"$out.stderr" || rc=$?
	echo "$name: go test exit $rc, $(($(date +%s) - start)) s, load $load0 -> $(cut -d' ' -f1-3 /proc/loadavg); $out"
	if [ -s "$out.stderr" ]; then sed 's/^/  stderr: /' "$out.stderr" | head -20; fi
}

echo "== complement ($run): ${pkgs[*]} on bin/stock, then on the patched build"
run_build stock "$stock_bin" "$build/results/stock.json" -tags dendrite_blacklist "${run_args[@]}" "${skip_args[@]}" "${pkgs[@]}"
run_build patched "$patched_bin" "$build/results/patched.json" -tags dendrite_blacklist "${run_args[@]}" "${skip_args[@]}" "${pkgs[@]}"

echo "== $REJECTED_AUTH (built without dendrite_blacklist, which leaves it out for Dendrite)"
run_build rejected-auth-stock "$stock_bin" "$build/results/rejected-auth-stock.json" -run "^$REJECTED_AUTH\$" ./tests
run_build rejected-auth-patched "$patched_bin" "$build/results/rejected-auth-patched.json" -run "^$REJECTED_AUTH\$" ./tests
"$build/complement-compare" -report stock="$build/results/rejected-auth-stock.json" patched="$build/results/rejected-auth-patched.json"
for name in stock patched; do
	kept=$(find "$build/work/rejected-auth-$name" -name server.log 2>/dev/null | sort)
	[ -z "$kept" ] || echo "rejected-auth $name: server logs kept: $kept"
done
fixed=ok
grep -qE "\"Action\":\"pass\".*\"Test\":\"$REJECTED_AUTH\"[,}]" "$build/results/rejected-auth-patched.json" || fixed=failed

# The pass rule; a test that stock passed and patched did not runs once more on
# both builds (timing under load), and its second results replace its first.
echo "== pass rule ($run)"
stock_runs=$build/results/stock.json
patched_runs=$build/results/patched.json
rerun=$("$build/complement-compare" -rerun-regex "$stock_runs" "$patched_runs")
if [ -n "$rerun" ]; then
	"$build/complement-compare" -excluded "$here/excluded.txt" "$stock_runs" "$patched_runs" || true
	echo "== rerun on both builds: $rerun"
	run_build stock-rerun "$stock_bin" "$build/results/stock-rerun.json" -tags dendrite_blacklist -run "$rerun" "${skip_args[@]}" "${pkgs[@]}"
	run_build patched-rerun "$patched_bin" "$build/results/patched-rerun.json" -tags dendrite_blacklist -run "$rerun" "${skip_args[@]}" "${pkgs[@]}"
	stock_runs+=,$build/results/stock-rerun.json
	patched_runs+=,$build/results/patched-rerun.json
	echo "== pass rule ($run), with the rerun"
fi
rc=0
"$build/complement-compare" -excluded "$here/excluded.txt" "$stock_runs" "$patched_runs" || rc=$?
if [ "$fixed" != ok ]; then
	echo "FAIL: the patched build did not pass $REJECTED_AUTH ($build/results/rejected-auth-patched.json)"
	rc=1
fi
exit $rc
