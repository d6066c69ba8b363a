#!/usr/bin/env bash
# build.sh BIN WORK: builds Dendrite v0.13.8 from the Go module proxy twice:
#   BIN/dendrite, BIN/generate-config, BIN/generate-keys, BIN/create-account
#       with dendrite-v0.13.8.patch applied (state snapshots and blocks in mtxdb,
#       state resolution and authorisation by mtxdb's resolver),
#       and BIN/mtxdb-dendrite-migrate (statetables' migration command);
#   BIN/stock/{dendrite,generate-config,generate-keys,create-account}
#       unmodified, for comparisons (the end-to-end test, the benchmark).
# WORK/src is a writable copy of the module cache's v0.13.8 with the patch applied
# (../README.md, "The patched server": gomatrixserverlib raised to the core's pin, the
# state tables swapped in roomserver/storage/storage.go, every state resolution and
# authorisation through roomrules; go.mod/go.sum pinned: no `go mod tidy`, nothing
# resolved @latest) and go.mod's replace lines pointing at this repository's core,
# roomrules, statetables, packstore, hamtstore, pgstore and internal modules; it is
# reused while the patch is unchanged. Before building, check-calls.sh fails the
# build if the tree still calls gomatrixserverlib's state resolution or Allowed
# outside _test.go files.
# Dendrite's own tests run in WORK/src (make test-dendrite-suite). Nothing of Dendrite's
# source is kept in the repository: only the patch.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: build.sh BIN WORK" >&2; exit 2; }
GO=${GO:-go}
VERSION=v0.13.8
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
mkdir -p "$1" "$2"
BIN=$(cd "$1" && pwd)
WORK=$(cd "$2" && pwd)
PATCH=$HERE/dendrite-$VERSION.patch

# The module, from the proxy into the module cache.
MOD=$(cd "$REPO/integration/dendrite/statetables" && $GO mod download -json "github.com/matrix-org/dendrite@$VERSION" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$MOD" ] || { echo "build.sh: github.com/matrix-org/dendrite@$VERSION not in the module cache" >&2; exit 1; }

stamp=$( (cat "$PATCH" "$HERE/build.sh"; echo "$REPO") | sha256sum | cut -c1-16)
SRC=$WORK/src
if [ "$(cat "$SRC/.mtxdb-stamp" 2>/dev/null)" != "$stamp" ]; then
	echo "== copy $MOD to $SRC and apply $(basename "$PATCH")"
	rm -rf "$SRC"
	cp -r "$MOD" "$SRC"
	chmod -R u+w "$SRC"
	(cd "$SRC" && patch -s -p1 <"$PATCH")
	(cd "$SRC" && $GO mod edit \
		-require=github.com/mtxdb/mtxdb/integration/dendrite/statetables@v0.0.0 \
		-replace=github.com/mtxdb/mtxdb/integration/dendrite/statetables="$REPO/integration/dendrite/statetables" \
		-replace=github.com/mtxdb/mtxdb/integration/dendrite/roomrules="$REPO/integration/dendrite/roomrules" \
		-replace=github.com/mtxdb/mtxdb="$REPO" \
		-replace=github.com/mtxdb/mtxdb/packstore="$REPO/packstore" \
		-replace=github.com/mtxdb/mtxdb/hamtstore="$REPO/hamtstore" \
		-replace=github.com/mtxdb/mtxdb/pgstore="$REPO/pgstore" \
		-replace=github.com/mtxdb/mtxdb/internal="$REPO/internal")
	echo "$stamp" >"$SRC/.mtxdb-stamp"
fi

# With the patch no state resolution and no authorisation is left to
# gomatrixserverlib: check-calls.sh fails the build when a call remains.
"$HERE/check-calls.sh" "$SRC"

CMDS="./cmd/dendrite ./cmd/generate-config ./cmd/generate-keys ./cmd/create-account"
echo "== build patched Dendrite $VERSION into $BIN"
(cd "$SRC" && GOFLAGS=-mod=readonly $GO build -trimpath -o "$BIN/" $CMDS)
echo "== build mtxdb-dendrite-migrate into $BIN"
(cd "$REPO/integration/dendrite/statetables" && $GO build -trimpath -o "$BIN/" ./cmd/mtxdb-dendrite-migrate)
echo "== build stock Dendrite $VERSION into $BIN/stock"
mkdir -p "$BIN/stock"
(cd "$MOD" && GOFLAGS=-mod=readonly $GO build -trimpath -o "$BIN/stock/" $CMDS)

# Versions the patched build takes above stock's (minimal version selection with
# packstore's requirements), for the README.
(cd "$MOD" && $GO list -m all) | sort >"$WORK/stock-modules.txt"
(cd "$SRC" && $GO list -m all) | sort >"$WORK/patched-modules.txt"
join -j1 <(awk '{print $1, $2}' "$WORK/stock-modules.txt") <(awk '{print $1, $2}' "$WORK/patched-modules.txt") |
	awk '$2 != $3 {print $1, $2, "->", $3}' >"$WORK/bumps.txt"
echo "== module versions raised by the patched build: $(wc -l <"$WORK/bumps.txt") ($WORK/bumps.txt)"
