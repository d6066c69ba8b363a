#!/bin/sh
# Mutation check of state resolution: each mutant breaks resolver/ (or authrules/) one
# way, in a copy of the working tree, and the checks below must fail on it. A
# mutant that no longer applies (the code it edits changed) is reported as such
# and fails the run, so the list is kept up to date with the code.
#
#   scripts/mutate-resolver.sh [MUTANT...]     (default: all)
#
# Environment: MUTATE_ROOMS, the rooms of the differential fuzzer run per mutant
# (default 3000); GO (default go).
set -eu
GO=${GO:-go}
ROOMS=${MUTATE_ROOMS:-3000}
top=$(cd "$(dirname "$0")/.." && pwd)
case $ROOMS in
''|*[!0-9]*|0) echo "mutate-resolver: MUTATE_ROOMS=$ROOMS: want a positive number of rooms" >&2; exit 2 ;;
esac
work=$(mktemp -d "${TMPDIR:-/tmp}/mtxdb-mutate.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 130' HUP INT TERM

# mutant NAME FILE PERL-SUBSTITUTION: what each mutant does, one line each.
mutants='
offmainline|resolver/statres.go|s/(\t\t\twalked = append\(walked, cur\)\n)/\t\t\tif cur != id {\n\t\t\t\tbreak\n\t\t\t}\n$1/
offmainline-index|resolver/resolver.go|s/(\tm := g\.lineageMeet\(j, i\)\n)/$1\tif m != j {\n\t\tm = -1\n\t}\n/
tiebreak-ts|resolver/statres.go|s/(\tif a\.ts != b\.ts \{\n\t\treturn a\.ts )< (b\.ts)/$1> $2/
tiebreak-level|resolver/statres.go|s/items\[id\] = orderItem\{id: id, major: -pl,/items[id] = orderItem{id: id, major: pl,/
authdiff-maps|resolver/maps.go|s/(\t\t\tfor _, o := range chains) \{/$1\[:1\] {/
authdiff-index|resolver/conflicts.go|s/(\t\tif !in \{\n\t\t\tdiff = append\(diff, idx\.ID\(x\)\)\n\t\t\})/$1\n\t\tif len(diff) > 0 \&\& len(diff)%2 == 0 {\n\t\t\tdiff = diff[1:]\n\t\t}/
subgraph|resolver/maps.go|s/w\.forSeenReaching\(func\(id string\) \{ out\[id\] = true \}\)/w.forSeenReaching(func(id string) {})/
handle-walk-targets|resolver/handlewalk.go|s/(\t\tif f\&flagTarget != 0) \{/$1 \&\& w.down {/
receipt-rules|resolver/statres.go|s/(\t\t\tok = st\.cache\.check\(fp, byKey\) == nil\n)/$1\t\t\tif ok {\n\t\t\t\tvar own []gomatrixserverlib.PDU\n\t\t\t\tfor _, a := range p.AuthEventIDs() {\n\t\t\t\t\tif ae, err := st.full(a); err == nil {\n\t\t\t\t\t\town = append(own, ae)\n\t\t\t\t\t}\n\t\t\t\t}\n\t\t\t\tok = authrules.CheckAuthEvents(fp, own, st.src.Rejected, nil) == nil\n\t\t\t}\n/
v21-unconflicted|resolver/statres.go|s/if st\.in\.algo == gomatrixserverlib\.StateResV2_1 \|\| st\.in\.unconflicted == nil \{/if st.in.unconflicted == nil {/
rejected-auth|resolver/statres.go|s/(\t\tfor _, a := range p\.AuthEventIDs\(\) \{\n)\t\t\tif st\.src\.Rejected\(a\) \{\n\t\t\t\tcontinue\n\t\t\t\}\n/$1/
sender-level-state|resolver/statres.go|s/(\tvar plEvent, createEvent gomatrixserverlib\.PDU\n)/$1\tif id, ok, _ := st.lookup(Key{Type: spec.MRoomPowerLevels, StateKey: ""}); ok {\n\t\tif e, err := st.event(id); err == nil {\n\t\t\tplEvent = e\n\t\t}\n\t}\n/
create-power-event|resolver/statres.go|s/(\tcase spec\.MRoomPowerLevels, spec\.MRoomJoinRules):\n\t\treturn p\.StateKeyEquals/$1, spec.MRoomCreate:\n\t\treturn p.StateKeyEquals/
rules-memo-shared|authrules/check.go|s/(func newRuleMemo\(\) \*ruleMemo \{\n)/var sharedMemo = func() *ruleMemo {\n\tl, _ := lru.New[string, *levels](memoLevels)\n\tc, _ := lru.New[string, createFacts](memoCreate)\n\treturn \&ruleMemo{pl: l, create: c}\n}()\n\n$1\treturn sharedMemo\n/
far-cursor-member|resolver/cursor.go|s/(\t\tif errors\.Is\(err, errCursorFar\) \{\n)(\t\t\tid, ok, err := r\.lookupHAMT\(root, k\))/$1\t\t\tif k.Type == "m.room.member" {\n\t\t\t\treturn "", findIndex, false, nil\n\t\t\t}\n$2/
'

checks() {
	# The differential fuzzer (ours against the reference; also with every state
	# cursor move given up), the peer vectors, the rooms with reused IDs, and
	# storage against whole maps.
	( cd "$1" && MTXDB_FUZZ_SEEDS=$ROOMS timeout 900 $GO test -count=1 -timeout 900s ./resolver \
		-run '^(TestResolverDifferential|TestResolverDifferentialFarCursors|TestResolverDifferentialKept|TestPeerVectors|TestResolutionIgnoresEarlierRooms|TestStorageMatchesMaps|TestScriptedRooms|TestSenderLevelFromItsAuthEvents)$' ) >"$2" 2>&1
}

want=${*:-}
names=$(printf '%s\n' "$mutants" | sed -n 's/^\([a-z0-9-]*\)|.*/\1/p')
for w in $want; do
	if ! printf '%s\n' "$names" | grep -qx -- "$w"; then
		echo "mutate-resolver: unknown mutant $w (known: $(echo $names))" >&2
		exit 2
	fi
done
printf '%s\n' "$mutants" | while IFS='|' read -r name file subst; do
	[ -n "$name" ] || continue
	if [ -n "$want" ] && ! echo " $want " | grep -q " $name "; then continue; fi
	dir=$work/$name
	mkdir -p "$dir"
	(cd "$top" && tar --exclude=./.git --exclude=./bin --exclude=./.build --exclude=./bench/.work -cf - .) | tar -xf - -C "$dir"
	before=$(cksum <"$dir/$file")
	perl -0pi -e "$subst" "$dir/$file"
	if [ "$(cksum <"$dir/$file")" = "$before" ]; then
		echo "mutant $name: does not apply to $file (the code changed: update scripts/mutate-resolver.sh)"
		echo fail >"$work/failed"
		continue
	fi
	if ! (cd "$dir" && $GO build ./resolver/ >"$dir.build" 2>&1); then
		echo "mutant $name: does not build:"; sed 's/^/  /' "$dir.build"
		echo fail >"$work/failed"
		continue
	fi
	start=$(date +%s)
	if checks "$dir" "$dir.log"; then
		echo "mutant $name: SURVIVED (every check passed) in $(( $(date +%s) - start )) s"
		echo fail >"$work/failed"
	else
		# Killed only by a test that ran and failed: a build error, a refused
		# setting or the timeout is the run's failure, not the mutant's.
		failing=$(grep -E '^--- FAIL' "$dir.log" | sed 's/--- FAIL: //; s/ (.*//' | sort -u | tr '\n' ' ')
		if [ -z "$failing" ] && grep -q '^panic: ' "$dir.log"; then
			failing="a panic: $(grep -m1 '^panic: ' "$dir.log")"
		fi
		if [ -n "$failing" ]; then
			echo "mutant $name: killed in $(( $(date +%s) - start )) s by: $failing"
		else
			echo "mutant $name: the checks did not run to a test failure:"; tail -5 "$dir.log" | sed 's/^/  /'
			echo fail >"$work/failed"
		fi
	fi
	rm -rf "$dir"
done
[ ! -f "$work/failed" ]
