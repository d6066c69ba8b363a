#!/usr/bin/env bash
# mkpatch.sh STOCK WORK OUT: writes the patch from STOCK (an unmodified copy of
# Dendrite v0.13.8, e.g. of the module cache's) to WORK (the edited copy) to OUT, in
# the form dendrite-v0.13.8.patch has: unified diffs of every changed .go file, go.mod
# and go.sum, labelled a/PATH and b/PATH, files added or removed against /dev/null.
# go.mod is taken without its replace lines: build.sh adds those for this checkout.
# To change the patch: copy STOCK, apply the patch (patch -p1), edit, run build.sh's
# go mod edit replace lines in the copy, fill go.sum with GOFLAGS=-mod=mod go build
# ./... and go list -deps -test ./..., then run this and check that the patch applies
# to a fresh copy and gives WORK back.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: mkpatch.sh STOCK WORK OUT" >&2; exit 2; }
GO=${GO:-go}
STOCK=$(cd "$1" && pwd) WORK=$(cd "$2" && pwd) OUT=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$WORK/go.mod" "$tmp/go.mod"
for r in $(cd "$tmp" && $GO mod edit -json go.mod |
	python3 -c 'import json,sys; print("\n".join(r["Old"]["Path"] for r in json.load(sys.stdin).get("Replace") or []))'); do
	(cd "$tmp" && $GO mod edit -dropreplace="$r" go.mod)
done
for d in "$WORK" "$STOCK"; do
	(cd "$d" && find . -type f \( -name '*.go' -o -name go.sum \) | sed 's|^\./||')
done | sort -u | grep -v '^go\.mod$' >"$tmp/files"
: >"$OUT"
for f in go.mod $(cat "$tmp/files"); do
	a=$STOCK/$f b=$WORK/$f
	[ "$f" = go.mod ] && b=$tmp/go.mod
	[ -e "$a" ] || a=/dev/null
	[ -e "$b" ] || b=/dev/null
	diff -u --label "a/$f" --label "b/$f" "$a" "$b" >>"$OUT" || [ $? -eq 1 ]
done
