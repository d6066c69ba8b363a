# mtxdb-go. `make demo` runs the main job on the bundled real rooms; `make test` is
# what CI runs (.ci/run). Both fetch the Go modules they need first.
GO       ?= go
FUZZTIME ?= 30s
FUZZMINTIME ?= 3s

.PHONY: bench-import-synapse mutate-resolver dendrite test-dendrite-e2e test-dendrite-kill bench-state-cost bench-state-latency bench-dendrite-scale test-dendrite-v12 test-dendrite-partition test-dendrite-suite test-sytest test-complement bench-dendrite bench-replay bench-repack plots docs all deps deps-all build demo test test-pgserver-install test-dendrite vet fuzz fuzz-resolver bench bench-micro bench-resolver crash crash-bitflips clean

all: build

# Every Go module of the repository but bench/ (the cross-engine benchmark's, with cgo
# engines: `make bench`), integration/dendrite/server/e2e (it needs the built servers:
# `make test-dendrite-e2e`) and integration/dendrite/server/complement (it builds only
# in the go.work beside an unpacked Complement: `make test-complement`), which are in
# PARTIAL_MODULES below: the core, its
# storage modules (packstore, hamtstore, pgstore, internal: modules of their own so
# that a Dendrite fork links them without the core's gomatrixserverlib requirement),
# integration/dendrite and its statetables.
MODULES := $(sort $(patsubst ./%,%,$(patsubst %/go.mod,%,$(shell find . -name go.mod -not -path './.git/*' -not -path './.build/*' -not -path './bench/*' -not -path './integration/dendrite/server/e2e/*' -not -path './integration/dendrite/server/complement/*' -not -path '*/testdata/*'))))
# Modules whose tests need what make test does not build, tested in part by make test:
# bench's commands (not its cgo engines), integration/dendrite/server/e2e (its tests
# skip without the built servers; compiled and vetted) and the Complement deployer's
# result comparer (the deployer itself needs Complement's source: make test-complement).
# Each entry is MODULE:PACKAGES.
PARTIAL_MODULES := bench:./cmd/... integration/dendrite/server/e2e:./... integration/dendrite/server/complement:./cmd/...

deps:
	$(GO) mod download

deps-all:
	@set -e; for m in $(MODULES) $(foreach t,$(PARTIAL_MODULES),$(firstword $(subst :, ,$(t)))); do (cd $$m && GOWORK=off $(GO) mod download); done

build: deps
	$(GO) build -o bin/mtxdb ./cmd/mtxdb

# Import every room under testrooms/real into a fresh temporary store, replay state
# resolution, compare with the recorded state, repack, reopen, verify again; the last
# line is the summary.
demo: build
	./bin/mtxdb demo --rooms testrooms/real

vet: deps-all
	@set -e; for m in $(MODULES); do echo "== vet $$m"; (cd $$m && $(GO) vet ./...); done

# The tests of every module in MODULES (the Dendrite seam's pulls Dendrite v0.13.8,
# which the core module does not require), then PARTIAL_MODULES' packages. They get a throwaway PostgreSQL
# (scripts/pgserver.sh: installs Debian's postgresql if missing, loopback only,
# fsync off, stopped and removed at the end) through MTXDB_TEST_POSTGRES; if it
# cannot start, make test fails under CI and otherwise runs the rest with the
# PostgreSQL tests skipped (each says why). -timeout 40m: the resolver package takes
# 100-600 s depending on load, and go's default 10 minutes has cut it off.
test: vet
	@set -e; dir=$$(mktemp -d "$${TMPDIR:-/tmp}/mtxdb-pgtest.XXXXXX"); \
	trap 'scripts/pgserver.sh stop "'"$$dir"'" >/dev/null 2>&1 || true; rm -rf "'"$$dir"'"' EXIT; trap 'exit 1' HUP INT TERM; \
	if url=$$(PGSERVER_FAST=1 scripts/pgserver.sh start "$$dir"); then export MTXDB_TEST_POSTGRES="$$url"; \
	elif [ -n "$$CI" ]; then echo "make test: PostgreSQL did not start (scripts/pgserver.sh); CI needs it" >&2; exit 1; \
	else echo "make test: PostgreSQL did not start: its tests will be skipped" >&2; fi; \
	for m in $(MODULES); do echo "== test $$m"; (cd $$m && $(GO) test -count=1 -timeout 40m ./...); done; \
	for t in $(PARTIAL_MODULES); do m=$${t%%:*}; p=$${t#*:}; echo "== test $$m $$p"; \
	  (cd $$m && GOWORK=off $(GO) vet $$p && GOWORK=off $(GO) test -count=1 -timeout 40m $$p); done

# scripts/pgserver.sh's install path as on a fresh machine, in a throwaway
# overlay of / where postgresql and apt's lists are removed (root, network).
test-pgserver-install:
	scripts/pgserver-install-test.sh

test-dendrite:
	cd integration/dendrite && $(GO) mod download && $(GO) vet ./... && $(GO) test -count=1 ./...

# Each fuzz target for FUZZTIME (go test runs one -fuzz target per invocation).
# FUZZMINTIME bounds the minimisation of each new interesting input: at go's
# default (60 s) minimising one 4 KiB shard header took a whole 30 s run (17
# executions in all), so the header target fuzzed nothing.
fuzz: deps-all
	@set -e; for m in $(MODULES); do ( cd $$m; \
	  for pkg in $$($(GO) list ./...); do \
	    for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	      echo "== $$pkg $$t"; $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINTIME) $$pkg; \
	    done; \
	  done ); \
	done

# The differential fuzzer of state resolution (resolver/fuzzdiff_test.go):
# FUZZROOMS random small rooms (testrooms/smallroom) from seed FUZZSEED, room
# versions 1-12 in turn, replayed by the reference (resolver/specres) and by ours
# (storage path and ResolveMaps), hashed and fixture renderings, on every core.
# Prints a progress line every 5000 rooms, then rooms/s, the rooms per version, the
# differences (the first of each kind minimised, as fixture JSON lines to keep in
# resolver/testdata/fuzzdiff) and the elapsed time; FUZZKEEP=DIR also writes the
# minimised rooms there. Differences of a kind known to be open (the open-* rooms
# there) are counted apart; MTXDB_FUZZ_STRICT=1 fails them too. Measured on this
# 2-core machine: the default 200000 rooms took 1 h 27 min (38 rooms/s, part of it
# beside other jobs); FUZZROOMS=5000 is a few minutes.
FUZZROOMS ?= 200000
FUZZSEED ?= 1
FUZZKEEP ?=
fuzz-resolver: deps
	@n='$(FUZZROOMS)'; case $$n in ''|*[!0-9]*) n=;; esac; n=$${n#"$${n%%[!0]*}"}; \
	  [ -n "$$n" ] && [ $${#n} -le 12 ] || { echo "make fuzz-resolver: FUZZROOMS=$(FUZZROOMS): want a number of rooms from 1 to 999999999999" >&2; exit 2; }
	@n='$(FUZZSEED)'; case $$n in ''|*[!0-9]*) n=x;; esac; n=$${n#"$${n%%[!0]*}"}; \
	  case $$n in x) false;; *) [ $${#n} -le 18 ];; esac || { echo "make fuzz-resolver: FUZZSEED=$(FUZZSEED): want a number from 0 to 999999999999999999" >&2; exit 2; }
	MTXDB_FUZZ_SEEDS=$(FUZZROOMS) MTXDB_FUZZ_SEED=$(FUZZSEED) MTXDB_FUZZ_KEEP=$(abspath $(FUZZKEEP)) MTXDB_FUZZ_SUMMARY=1 \
	  $(GO) -C resolver test -count=1 -timeout 0 -run '^TestResolverDifferential$$'

# packstore's real-process crash loop with CRASHPOINTS SIGKILLs during appends,
# syncs and small repacks (a fresh store every CRASHSEGMENT kills), REPACKKILLS
# SIGKILLs during large repacks, and the
# exhaustive versions of the crash-at-every-frame-boundary and index-file
# truncation tests; prints the kill points and the lost/corrupt record counts.
# The exhaustive index-file bit flips (>35 min) are crash-bitflips; go test runs
# a sample of them.
CRASHPOINTS ?= 1000
CRASHSEGMENT ?= 100
REPACKKILLS ?= 100
# REUSEROUNDS rounds of put, sync, repack with the shard limit lowered to 16
# and SIGKILLs at random moments, so that pack IDs are reused.
REUSEROUNDS ?= 10000
crash: deps
	PACKSTORE_CRASH_POINTS=$(CRASHPOINTS) PACKSTORE_CRASH_SEGMENT=$(CRASHSEGMENT) PACKSTORE_REPACKKILL_POINTS=$(REPACKKILLS) PACKSTORE_REUSE_ROUNDS=$(REUSEROUNDS) PACKSTORE_LONG=1 \
	  $(GO) -C packstore test -count=1 -timeout 120m \
	  -run '^(TestCrashProcess|TestRepackKillProcess|TestPackIDReuseKill|TestRepackCrashAtEveryFrameBoundary|TestCheckpointTruncatedEveryOffset|TestDeltaTruncatedEveryOffset)$$' \
	  -v . | grep -E '^(crash summary|repack kill summary|reuse summary|--- |ok|FAIL)'

# Mutation check of state resolution: scripts/mutate-resolver.sh breaks resolver/
# one way per mutant (in a copy of the tree) and requires the differential fuzzer
# (MUTATE_ROOMS rooms) or another resolver test to fail on each. Minutes per mutant.
MUTATE_ROOMS ?= 3000
mutate-resolver: deps
	GO=$(GO) MUTATE_ROOMS=$(MUTATE_ROOMS) scripts/mutate-resolver.sh

crash-bitflips: deps
	PACKSTORE_LONG=1 $(GO) -C packstore test -count=1 -timeout 90m -run '^TestIndexFileBitFlips$$' -v . | grep -E '^(--- |ok|FAIL)'

# Go micro-benchmarks of the hot paths, in their packages (go test -bench . in every
# module). Not `make bench`, which is the cross-engine run below.
bench-micro: deps-all
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) test -run '^$$' -bench . -benchmem ./...); done

# Cross-engine benchmark: packstore (checksum none/writeonly/full),
# bbolt, pebble v2, badger v4, SQLite (mattn/go-sqlite3, WAL, synchronous=FULL),
# libmdbx (mdbx-go) and PostgreSQL (pgstore), 1 and 32 collections, fsync per batch, with the disk's
# limits measured in the same run. Its own module in bench/ (cgo: the first
# build compiles SQLite and libmdbx, minutes on 2 cores), out of `make test`'s
# path. Writes docs/bench/results-<sizes>.{json,md} and PNG plots.
# BENCH_SIZES in MB, e.g. BENCH_SIZES=64,256,1024; BENCH_FLAGS for more.
BENCH_SIZES ?= 64
BENCH_FLAGS ?=
# The postgres engine (pgstore) runs on a throwaway server (scripts/pgserver.sh,
# durable settings) whose cluster lives under bench/.work beside the others' files.
bench:
	cd bench && $(GO) build -o ../bin/mtxdb-bench .
	@set -e; mkdir -p bench/.work; dir=$$(mktemp -d "$$(pwd)/bench/.work/pgserver.XXXXXX"); \
	trap 'scripts/pgserver.sh stop "'"$$dir"'" >/dev/null 2>&1 || true; rm -rf "'"$$dir"'"' EXIT; trap 'exit 1' HUP INT TERM; \
	scripts/pgserver.sh start "$$dir" >/dev/null; \
	cd bench && MTXDB_BENCH_PGDIR="$$dir" MTXDB_BENCH_PGSERVER="$$(pwd)/../scripts/pgserver.sh" \
	  ../bin/mtxdb-bench -sizes $(BENCH_SIZES) -out ../docs/bench -dir .work $(BENCH_FLAGS)

# The generated documentation: docs/cli.md from the command tree and the package
# diagram in docs/design.md from go list. go test fails when either is stale.
docs:
	$(GO) test -count=1 -run '^TestCLIDoc$$' ./cmd/mtxdb -update-docs
	$(GO) test -count=1 -run '^TestPackageDiagram$$' ./docs -update-docs

# Every published benchmark plot under docs/bench, drawn again from the JSON beside
# it, measuring nothing: the cross-engine runs (results-*.json; their generated
# results-*.md too, which come out the same), replay at room scale (replay.json:
# only replay.png), repack locality (repack-*.json) and the Dendrite benchmark
# (dendrite.json). bin/mtxdb-bench is the cross-engine harness (cgo: its first build
# compiles SQLite and libmdbx, minutes on 2 cores).
plots:
	cd bench && $(GO) build -o ../bin/mtxdb-bench .
	@set -e; for j in $(wildcard docs/bench/results-*.json docs/bench/*/results-*.json); do \
	  echo "== $$j"; bin/mtxdb-bench -report $$j -out $$(dirname $$j) >/dev/null; done
	@set -e; for j in $(wildcard docs/bench/replay.json docs/bench/*/replay.json); do \
	  echo "== $$j"; (cd bench && $(GO) run ./cmd/benchreplay -plot ../$$j -out ../$$(dirname $$j)); done
	@echo "== $(wildcard docs/bench/repack-*.json)"
	cd bench && $(GO) run ./cmd/plotrepack $(addprefix ../,$(wildcard docs/bench/repack-*.json)) >/dev/null
	cd bench && $(GO) run ./cmd/plotdendrite ../docs/bench/dendrite.json

# State resolution on a generated 100k-event, 10k-member room with forks: ours per
# resolution beside the naive full-state path (EVENTS, MEMBERS to resize).
EVENTS  ?= 100000
MEMBERS ?= 10000
bench-resolver: build
	./bin/mtxdb bench-resolver --events $(EVENTS) --members $(MEMBERS) --room-version 10 --naive-samples 50

clean:
	rm -rf bin

# Repack benchmark: the server walks (current state, auth chain, backfill of 1000
# events, state resolution at the extremities) before and after each repack plan,
# on a store built as a homeserver builds it (the real rooms and a generated room of REPACK_EVENTS
# events in backfill order, interleaved into one pool): read budget by kind, pages,
# seeks, bytes and cold-cache wall time. Writes docs/bench/repack-$(REPACK_EVENTS).{json,md}
# and, through the bench module's plotrepack (gonum/plot), one PNG per measured room
# (docs/bench/repack-$(REPACK_EVENTS)-<room>.png: pages, seeks, cold ms per walk and
# layout); the generated room is kept in REPACK_GEN (generating 100k events takes a
# long while).
REPACK_EVENTS ?= 100000
REPACK_GEN    ?= /tmp/mtxdb-repack-gen-$(REPACK_EVENTS)
REPACK_RUNS   ?= 5
# Replay at room scale: gen, import, replay and verify --expected of
# generated rooms (VERSION:EVENTS), each a process of its own, measured side by
# side; writes docs/bench/replay.{json,md,png} with the replay targets
# (bench/cmd/benchreplay) stated as met or NOT met. The measured replay runs with
# --cpuprofile (100 Hz): replay.md and replay.json summarise each room's profile,
# the files themselves stay in bench/.work-replay, removed after a completed run. The default set includes the
# 1M-event room: about 40 minutes here (the interleaved replays below included),
# 2.7 GB of memory for its generation and about 5 GB of disk for its room and stores.
# The published run is the default set; other sets write to BENCH_REPLAY_OUT
# (default: a directory of their own under docs/bench, untracked unless added).
BENCH_REPLAY_ROOMS ?= 12:10000,12:100000,12:1000000,10:100000
BENCH_REPLAY_OUT ?= $(if $(filter 12:10000$(comma)12:100000$(comma)12:1000000$(comma)10:100000,$(BENCH_REPLAY_ROOMS)),docs/bench,docs/bench/replay-custom)
comma := ,
# BENCH_REPLAY_PG_ROOMS are also imported, replayed and verified on PostgreSQL
# (a throwaway durable server, scripts/pgserver.sh; empty: none). Replay there
# waits on a round trip per read: a 100k-event room ran for more than 8 minutes
# (load 13-18) before the run was stopped, so the default is the 10k room when
# BENCH_REPLAY_ROOMS has it (else none).
BENCH_REPLAY_PG_ROOMS ?= $(if $(filter 12:10000,$(subst $(comma), ,$(BENCH_REPLAY_ROOMS))),12:10000,)
# After the rooms, BENCH_REPLAY_PAIRS replays of the large room of
# BENCH_REPLAY_RATIO (SMALL,LARGE, both among BENCH_REPLAY_ROOMS), each between
# two of the small one, give the per-event cost ratio side by side (about 7
# minutes more for the default pair). Default: 3 for the default set, else 0.
BENCH_REPLAY_RATIO ?= 12:100000,12:1000000
BENCH_REPLAY_PAIRS ?= $(if $(filter 12:10000$(comma)12:100000$(comma)12:1000000$(comma)10:100000,$(BENCH_REPLAY_ROOMS)),3,0)
bench-replay: build
	@set -e; root=$$(pwd); mkdir -p bench/.work; dir=$$(mktemp -d "$$root/bench/.work/replay-pg.XXXXXX"); \
	trap '"$$root"/scripts/pgserver.sh stop "'"$$dir"'" >/dev/null 2>&1 || true; rm -rf "'"$$dir"'"' EXIT; trap 'exit 1' HUP INT TERM; \
	pg=; if [ -n "$(BENCH_REPLAY_PG_ROOMS)" ]; then pg="-postgres $$(scripts/pgserver.sh start "$$dir")"; fi; \
	cd bench && $(GO) run ./cmd/benchreplay -mtxdb ../bin/mtxdb -rooms "$(BENCH_REPLAY_ROOMS)" -ratio-rooms "$(BENCH_REPLAY_RATIO)" \
	  -ratio-pairs "$(BENCH_REPLAY_PAIRS)" -postgres-rooms "$(BENCH_REPLAY_PG_ROOMS)" -out "$(abspath $(BENCH_REPLAY_OUT))" $$pg

# bench-import-synapse: mtxdb import --from synapse: on a Synapse-layout SQLite
# database of about 1 GB (39 generated v12 rooms of 10,000 events, seed 100;
# built once into BENCH_IMPORT_DB by mtxdb gen and
# testrooms/synapsedb/cmd/synapsedb-build, about 3 minutes), BENCH_IMPORT_RUNS
# runs into fresh stores: docs/bench/import-synapse.{md,json}.
BENCH_IMPORT_DB   ?= bench/.work/synapse-390k.db
BENCH_IMPORT_RUNS ?= 3
bench-import-synapse: build
	@set -e; if [ ! -f $(BENCH_IMPORT_DB) ]; then \
	  mkdir -p $$(dirname $(BENCH_IMPORT_DB)); rooms=$$(mktemp -d "$$(pwd)/bench/.work/synapse-rooms.XXXXXX"); \
	  trap 'rm -rf "'"$$rooms"'"' EXIT; \
	  ./bin/mtxdb gen --out $$rooms --rooms 39 --events 10000 --no-reference --seed 100; \
	  $(GO) run ./testrooms/synapsedb/cmd/synapsedb-build $(BENCH_IMPORT_DB).tmp $$rooms/room*; \
	  mv $(BENCH_IMPORT_DB).tmp $(BENCH_IMPORT_DB); fi
	cd bench && $(GO) run ./cmd/benchimport -mtxdb ../bin/mtxdb -db ../$(BENCH_IMPORT_DB) -runs $(BENCH_IMPORT_RUNS) -out ../docs/bench

bench-repack: build
	test -f $(REPACK_GEN)/backfill_order.jsonl || ./bin/mtxdb gen --out $(REPACK_GEN) --events $(REPACK_EVENTS) --seed 1 --backfill
	./bin/mtxdb bench-repack --gen $(REPACK_GEN) --real testrooms/real --runs $(REPACK_RUNS) --out docs/bench --label -$(REPACK_EVENTS)
	cd bench && $(GO) run ./cmd/plotrepack ../docs/bench/repack-$(REPACK_EVENTS).json

# Dendrite v0.13.8 from the module proxy with integration/dendrite/server's patch
# (gomatrixserverlib at the core's pin; state snapshots and blocks in mtxdb:
# statetables; every state resolution and authorisation through mtxdb's resolver:
# roomrules), as bin/dendrite, bin/generate-config, bin/generate-keys,
# bin/create-account, and the stock build in bin/stock/. It fails when the patched
# tree still calls gomatrixserverlib's Resolve* or Allowed outside _test.go files
# (server/check-calls.sh). DENDRITE_WORK holds the patched copy of Dendrite's source
# (reused while the patch is unchanged) where make test-dendrite-suite runs
# Dendrite's own tests. Cold: about 5-9 minutes on 2 cores; warm: under a minute.
DENDRITE_WORK ?= $(CURDIR)/.build/dendrite
DENDRITE_BIN  ?= $(CURDIR)/bin
# A throwaway PostgreSQL (scripts/pgserver.sh) for the Dendrite targets, stopped after.
PG_DIR ?= /tmp/mtxdb-pg-$(notdir $(CURDIR))-dendrite
dendrite:
	integration/dendrite/server/build.sh $(DENDRITE_BIN) $(DENDRITE_WORK)

# Stock and mtxdb Dendrite on loopback, SQLite and PostgreSQL, driven through the
# client-server API with mautrix; answers compared, SQL state tables checked empty, a
# PostgreSQL Dendrite's state rows found in mtxdb_records in its own database; and the
# patched server's /metrics scraped for the state store's and its engine's metrics.
test-dendrite-e2e: dendrite
	@set -e; url=$$(scripts/pgserver.sh start $(PG_DIR)); rc=0; \
	  (cd integration/dendrite/server/e2e && MTXDB_DENDRITE_BIN=$(DENDRITE_BIN) MTXDB_PG_URL=$$url \
	    $(GO) test -count=1 -v -run '^(TestStockAndMtxdbAgree|TestMetricsScraped)$$' .) || rc=$$?; \
	  scripts/pgserver.sh stop $(PG_DIR); exit $$rc

# The patched build SIGKILLed at random moments during joins, leaves, renames, topic
# and power level changes, DENDRITE_KILLS times on SQLite and on PostgreSQL; after
# each kill mtxdb-dendrite-migrate -check must pass and every acknowledged state
# change must be in /state after the restart (TestKillDuringStateChanges).
DENDRITE_KILLS ?= 50
test-dendrite-kill: dendrite
	@set -e; url=$$(scripts/pgserver.sh start $(PG_DIR)-kill); rc=0; \
	  (cd integration/dendrite/server/e2e && MTXDB_DENDRITE_BIN=$(DENDRITE_BIN) MTXDB_PG_URL=$$url MTXDB_KILLS=$(DENDRITE_KILLS) \
	    $(GO) test -count=1 -v -timeout 120m -run '^TestKillDuringStateChanges$$' .) || rc=$$?; \
	  scripts/pgserver.sh stop $(PG_DIR)-kill; exit $$rc

# Room version 12 on the patched build (TestRoomV12Federation): two servers federating
# over verified TLS on loopback, SQLite and PostgreSQL. A v12 room is created on one
# and joined from the other; messages, state, an invitation, kicks and a fork resolved
# by both go both ways; creator rules and the stored events' room_id/auth_events are
# checked. About a minute per database once built.
test-dendrite-v12: dendrite
	@set -e; url=$$(scripts/pgserver.sh start $(PG_DIR)-v12); rc=0; \
	  (cd integration/dendrite/server/e2e && MTXDB_DENDRITE_BIN=$(DENDRITE_BIN) MTXDB_PG_URL=$$url \
	    $(GO) test -count=1 -v -timeout 30m -run '^TestRoomV12Federation$$' .) || rc=$$?; \
	  scripts/pgserver.sh stop $(PG_DIR)-v12; exit $$rc

# Three patched Dendrite servers (SQLite) federating over TLS on loopback through a
# partitioning proxy in the test; four scenarios of conflicting changes made on both
# sides of a cut, healed, then every server's /state compared with each other and
# with mtxdb replay of the room's exported events; the same on three stock servers,
# reported only. Writes PARTITION_OUT; keeps the servers' directories (logs,
# databases) and the replays in PARTITION_WORK. 2-17 minutes of test here (load 8-17).
PARTITION_OUT  ?= $(CURDIR)/docs/bench/partition.md
PARTITION_WORK ?= $(CURDIR)/.build/partition
test-dendrite-partition: dendrite
	cd integration/dendrite/server/e2e && MTXDB_DENDRITE_BIN=$(DENDRITE_BIN) MTXDB_PARTITION_OUT=$(PARTITION_OUT) \
	  MTXDB_PARTITION_WORK=$(PARTITION_WORK) $(GO) test -count=1 -v -timeout 60m -run '^TestFederationPartition$$' .

# Dendrite's own tests (DENDRITE_SUITE packages) against the swapped build, SQLite and
# PostgreSQL; installs libolm-dev, starts and stops PostgreSQL; a failed package is run
# once more (Dendrite's suite is timing-dependent under load, stock builds too).
DENDRITE_SUITE ?= ./roomserver/... ./clientapi/... ./syncapi/... ./federationapi/...
test-dendrite-suite: dendrite
	integration/dendrite/server/suite.sh $(DENDRITE_WORK)/src $(PG_DIR) $(DENDRITE_SUITE)

# Sytest (branch dendrite, SYTEST_TARBALL) against the stock and the patched build
# with Dendrite's sytest-whitelist and sytest-blacklist, on SYTEST_DB=sqlite|postgres|all
# (PostgreSQL: a throwaway server on 127.0.0.1:5432, Sytest's fixed port; skipped when
# 5432 is taken). Fails unless the patched build has no unexpected failure and passes
# every test stock passes; TAP, sorted results and their diff in SYTEST_OUT. Installs
# Sytest's Debian Perl packages when missing. About 5 minutes per build on SQLite.
# SYTEST_TESTS: Sytest test files to run instead of all (tests/50federation/36state.pl).
SYTEST_DB ?= all
test-sytest: dendrite
	SYTEST_DB=$(SYTEST_DB) PG_DIR=$(PG_DIR)-sytest integration/dendrite/server/sytest.sh $(DENDRITE_BIN)/stock $(DENDRITE_BIN) $(SYTEST_TESTS)

# Complement (COMPLEMENT_TARBALL: the module proxy does not serve it) against the stock
# and the patched build, Dendrite processes on 127.0.0.1 started by the deployer in
# integration/dendrite/server/complement (its run.sh unpacks Complement under
# .build/complement). COMPLEMENT_RUN=state (default): the federation, state and auth
# tests; all: Complement's tests and tests/csapi packages but its excluded.txt. Fails
# unless the patched build passes every test and subtest stock passes, and
# TestInboundFederationRejectsEventsWithRejectedAuthEvents (which stock fails). About a
# minute (state) or four (all) on a quiet machine; see integration/dendrite/README.md.
COMPLEMENT_TARBALL ?= $(abspath $(CURDIR)/../shared/peer-suites/complement-50044edb.tar.gz)
COMPLEMENT_RUN ?= state
test-complement: dendrite
	COMPLEMENT_TARBALL=$(COMPLEMENT_TARBALL) COMPLEMENT_RUN=$(COMPLEMENT_RUN) GO=$(GO) \
	  integration/dendrite/server/complement/run.sh $(DENDRITE_BIN) $(DENDRITE_BIN)/stock $(CURDIR)/.build/complement

# Stock against mtxdb Dendrite by room size (TestBenchDendriteScale): rooms of
# BENCH_MEMBERS members (joins in batches, display name and avatar changes, leaves
# and rejoins, topic and power level edits, messages between), BENCH_RUNS runs per
# (size, database, build), medians in docs/bench/dendrite-scale.{json,md,png}.
BENCH_MEMBERS ?= 100,1000,10000
BENCH_RUNS ?= 3
bench-dendrite-scale: dendrite
	@set -e; url=$$(scripts/pgserver.sh start $(PG_DIR)-scale); rc=0; \
	  (cd integration/dendrite/server/e2e && MTXDB_DENDRITE_BIN=$(DENDRITE_BIN) MTXDB_PG_URL=$$url \
	    MTXDB_BENCH_OUT=$(CURDIR)/docs/bench MTXDB_BENCH_MEMBERS=$(BENCH_MEMBERS) MTXDB_BENCH_RUNS=$(BENCH_RUNS) \
	    $(GO) test -count=1 -v -timeout 720m -run '^TestBenchDendriteScale$$' .) || rc=$$?; \
	  scripts/pgserver.sh stop $(PG_DIR)-scale; exit $$rc

# Bytes per state change, stock Dendrite's SQLite state tables against the mtxdb
# store, rooms of 100, 1,000 and 10,000 members, the calls Dendrite's roomserver
# makes (BenchmarkStateChangeBytes; no server; a few seconds).
bench-state-cost:
	cd integration/dendrite/statetables && $(GO) mod download && \
	  $(GO) test -run '^$$' -bench 'BenchmarkStateChangeBytes' -benchtime=2000x .

# Time per state change inside a transaction, as Dendrite's input path makes it:
# stock's SQL state tables against the mtxdb store, SQLite and PostgreSQL (a
# throwaway server, fsync on), rooms of 1,000 and 10,000 members, five counts of
# 2,000 changes each (BenchmarkStateChangeLatency; no Dendrite; a few minutes).
bench-state-latency:
	@set -e; url=$$(scripts/pgserver.sh start $(PG_DIR)-latency); rc=0; \
	  (cd integration/dendrite/statetables && $(GO) mod download && MTXDB_TEST_POSTGRES=$$url \
	    $(GO) test -run '^$$' -bench 'BenchmarkStateChangeLatency' -benchtime=2000x -count=5 .) || rc=$$?; \
	  scripts/pgserver.sh stop $(PG_DIR)-latency; exit $$rc

# The scripted workload (BENCH_DENDRITE_USERS users joining one room, state changes,
# messages) on stock and mtxdb Dendrite, SQLite and PostgreSQL, one run each: state
# bytes, state-write latency p50/p99, requests/s. Then the inbound
# merge: two servers of one build federating over TLS through the partition test's
# proxy, a room of BENCH_DENDRITE_FORK_MEMBERS members (all but one on the first
# server), BENCH_DENDRITE_FORKS forks (a cut, a change on each side, the heal) each
# merged by a message naming both branches; the time from the transaction's arrival
# at the receiving server (and from the send) until its /messages shows the merge,
# p50/p99 per build, both servers' state checked after each merge; stock and mtxdb on
# each database of BENCH_DENDRITE_FORK_DBS. 0 users or 0 forks leave that part out and
# keep its previous results. Writes docs/bench/dendrite.{json,md}, and dendrite.png
# through the bench module's plotdendrite.
BENCH_DENDRITE_USERS ?= 100
BENCH_DENDRITE_FORKS ?= 20
BENCH_DENDRITE_FORK_MEMBERS ?= 1000
BENCH_DENDRITE_FORK_DBS ?= sqlite,postgres
bench-dendrite: dendrite
	@set -e; url=$$(scripts/pgserver.sh start $(PG_DIR)-bench); rc=0; \
	  (cd integration/dendrite/server/e2e && MTXDB_DENDRITE_BIN=$(DENDRITE_BIN) MTXDB_PG_URL=$$url \
	    MTXDB_BENCH_OUT=$(CURDIR)/docs/bench MTXDB_BENCH_USERS=$(BENCH_DENDRITE_USERS) \
	    MTXDB_BENCH_FORKS=$(BENCH_DENDRITE_FORKS) MTXDB_BENCH_FORK_MEMBERS=$(BENCH_DENDRITE_FORK_MEMBERS) \
	    MTXDB_BENCH_FORK_DBS=$(BENCH_DENDRITE_FORK_DBS) \
	    $(GO) test -count=1 -v -timeout 240m -run '^TestBenchDendrite$$' .) || rc=$$?; \
	  scripts/pgserver.sh stop $(PG_DIR)-bench; [ $$rc -ne 0 ] || (cd bench && $(GO) run ./cmd/plotdendrite ../docs/bench/dendrite.json) || rc=$$?; exit $$rc
