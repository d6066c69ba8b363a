#!/usr/bin/env bash
# check-calls.sh SRC: fails (exit 1, listing file:line) when the Go files of the patched
# Dendrite tree SRC, _test.go files aside, still name one of gomatrixserverlib's state
# resolution functions or its Allowed: with the patch, every resolution and every
# authorisation goes through mtxdb (integration/dendrite/roomrules). The functions are
# read from the gomatrixserverlib source SRC's go.mod selects (every exported func
# named Resolve* and Allowed), so one added upstream is caught too. A line that is
# only a comment does not count; gomatrixserverlib imported under another name (or
# dot-imported) fails, since the names would then not be seen.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: check-calls.sh SRC" >&2; exit 2; }
GO=${GO:-go}
SRC=$(cd "$1" && pwd)
# On a fresh machine the module is not in the cache until something downloads it.
(cd "$SRC" && $GO mod download github.com/matrix-org/gomatrixserverlib)
GMSL=$(cd "$SRC" && $GO list -m -f '{{.Dir}}' github.com/matrix-org/gomatrixserverlib)
[ -d "$GMSL" ] || { echo "check-calls.sh: gomatrixserverlib's source is not in the module cache ($GMSL)" >&2; exit 1; }
funcs=$(grep -hoE '^func (Resolve[A-Za-z0-9_]*|Allowed)\(' "$GMSL"/*.go | sed 's/^func //; s/($//' | sort -u | paste -sd'|')
[ -n "$funcs" ] || { echo "check-calls.sh: no Resolve*/Allowed function found in $GMSL" >&2; exit 1; }

nontest() { { grep -v -E '^[^:]+_test\.go:' || true; } | { grep -v -E '^[^:]+:[0-9]+:[[:space:]]*//' || true; }; }
calls=$(cd "$SRC" && { grep -rnE --include='*.go' "\\bgomatrixserverlib\\.($funcs)\\b" . || true; } | nontest)
aliases=$(cd "$SRC" && { grep -rnE --include='*.go' '^[[:space:]]*(import[[:space:]]+)?[A-Za-z_.][A-Za-z0-9_]*[[:space:]]+"github.com/matrix-org/gomatrixserverlib"' . || true; } |
	{ grep -v -E ':[[:space:]]*import[[:space:]]+"' || true; } | nontest)
if [ -n "$calls$aliases" ]; then
	echo "check-calls.sh: the patched Dendrite still calls gomatrixserverlib's state resolution or Allowed ($funcs) outside tests:" >&2
	[ -z "$calls" ] || echo "$calls" >&2
	[ -z "$aliases" ] || { echo "gomatrixserverlib imported under another name:" >&2; echo "$aliases" >&2; }
	exit 1
fi
echo "== no call of gomatrixserverlib's $(echo "$funcs" | tr '|' ' ') outside _test.go files"
