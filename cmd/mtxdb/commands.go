package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/pgstore"
	"github.com/mtxdb/mtxdb/repackplan"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/testrooms"
)

// storeHelp describes --store.
const storeHelp = "store directory, or a postgres:// URL (a PostgreSQL database shared by several processes)"

// storeEngine is what the commands use of a store, whichever engine holds it:
// a packfile directory (packstore) or a PostgreSQL database (pgstore: --store
// postgres://...).
type storeEngine interface {
	packstore.StorageEngine
	Repack(packstore.RepackPlan) (packstore.RepackStats, error)
}

// openStore opens a store directory or database; only import and demo may
// create one.
func openStore(dir string, create bool) (storeEngine, *roomstate.Store, error) {
	return openStoreMode(dir, create, false)
}

// openStoreMode is openStore, read-only (packstore.Options.ReadOnly: no
// truncation, no writes, a shared lock; pgstore.Options.ReadOnly: no schema
// created, read-only sessions) for the commands that only read: verify,
// stats, state. Every command opens its store here.
func openStoreMode(dir string, create, readOnly bool) (storeEngine, *roomstate.Store, error) {
	if dir == "" {
		return nil, nil, fmt.Errorf("--store is required")
	}
	if pgstore.IsURL(dir) {
		eng, err := pgstore.Open(pgstore.Options{URL: dir, NoCreate: !create, ReadOnly: readOnly})
		if errors.Is(err, pgstore.ErrNoSchema) {
			return nil, nil, fmt.Errorf("%w: no mtxdb store in that database (mtxdb import creates it)", err)
		}
		if err != nil {
			return nil, nil, err
		}
		return eng, roomstate.New(eng), nil
	}
	if create {
		// Say what the path is, rather than what mkdir made of it.
		if target, ok := danglingLink(dir); ok {
			return nil, nil, fmt.Errorf("store %s is a symbolic link to %s, which does not exist", dir, target)
		}
		if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
			return nil, nil, fmt.Errorf("store %s is a file, not a store directory", dir)
		}
		// A new store goes in a new or empty directory: creating one among other
		// files (import --store DIR DIR, with DIR the room directory) mixed them
		// with the store's, whose permission checks then named the room's files.
		if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 && !looksLikeStore(dir) && !onlyLock(entries) {
			return nil, nil, fmt.Errorf("store %s is a directory holding other files (%s first), not an mtxdb store: give a new or empty directory", dir, entries[0].Name())
		}
	}
	if !create {
		if fi, err := os.Stat(dir); err != nil {
			return nil, nil, fmt.Errorf("store %s does not exist (mtxdb import creates it)", dir)
		} else if !fi.IsDir() {
			return nil, nil, fmt.Errorf("store %s is a file, not a store directory", dir)
		}
		if !looksLikeStore(dir) {
			return nil, nil, fmt.Errorf("%s is not an mtxdb store (no shard or index files in it); mtxdb import creates one", dir)
		}
	}
	opts := packstore.DefaultOptions(dir)
	// The commands write in bulk (import, replay, repack; a small room's
	// import is many batches under 64 records): compress every batch as it
	// is written, not only at the next repack. DefaultOptions leaves the
	// batches of a commit's size (a homeserver's steady appends)
	// uncompressed until a repack (packstore doc "Commit latency").
	opts.InlineCompressMin = 0
	opts.ReadAhead = readAhead.mode
	opts.ReadOnly = readOnly
	eng, err := packstore.Open(opts)
	if err != nil {
		if packstore.IsCorruption(err) {
			return nil, nil, corruptError{err}
		}
		if errors.Is(err, packstore.ErrLocked) {
			// Exit status 1; the message names the directory and the pid.
			return nil, nil, fmt.Errorf("%w; wait for that process to finish: an mtxdb command, or a server that has the store open (one process per store)", err)
		}
		return nil, nil, err
	}
	r := eng.OpenReport()
	if r.CheckpointErr != nil || r.DeltaErr != nil {
		var why []string
		for _, e := range []error{r.CheckpointErr, r.DeltaErr} {
			if e != nil {
				why = append(why, e.Error())
			}
		}
		fmt.Fprintf(os.Stderr, "mtxdb: warning: %s: index files not used (%s), index rebuilt from %s\n",
			dir, strings.Join(why, "; "), r.Source)
	}
	if r.Source == "scan" && r.CheckpointErr == nil && r.ScannedFrames > 0 {
		// Every close writes index.ckpt: a store with frames and none lost
		// the file or crashed before its first checkpoint.
		fmt.Fprintf(os.Stderr, "mtxdb: warning: %s: no index.ckpt: index rebuilt by scanning %d frames (%d bytes) of the shards; a torn last shard cannot be told from one cut short (README, Known limits)\n",
			dir, r.ScannedFrames, r.ScannedBytes)
	}
	for _, w := range r.Warnings {
		fmt.Fprintf(os.Stderr, "mtxdb: warning: %s\n", w)
	}
	for _, q := range r.Quarantined {
		fmt.Fprintf(os.Stderr, "mtxdb: warning: %s: quarantined a shard file with a bad header and no acknowledged data: %s\n", dir, q)
	}
	if r.TailNotCut {
		fmt.Fprintf(os.Stderr, "mtxdb: warning: %s: %s has a torn or cut-short tail of %d bytes at offset %d, left on disk (read-only open; index from %s)\n",
			dir, r.TruncatedFile, r.TruncatedBytes, r.TruncatedAt, r.Source)
	} else if r.TruncatedBytes > 0 {
		// Expected after a crash mid-write; with index files missing or damaged
		// it can also be a shard cut short (README, Known limits): say so.
		fmt.Fprintf(os.Stderr, "mtxdb: warning: %s: cut %d bytes of unsynced or damaged tail off %s at offset %d (index from %s)\n",
			dir, r.TruncatedBytes, r.TruncatedFile, r.TruncatedAt, r.Source)
	}
	return eng, roomstate.New(eng), nil
}

// storeStats is the engine's Stats; for a PostgreSQL store DiskBytes is the
// records table's size with its indexes (pgstore.Stats.TableBytes) and Shards 0.
func storeStats(eng storeEngine) (packstore.Stats, error) {
	switch e := eng.(type) {
	case *packstore.PackfileStorage:
		return e.Stats(), nil
	case *pgstore.Store:
		st, err := e.Stats()
		return packstore.Stats{DiskBytes: st.TableBytes, Collections: st.Collections, LiveRecords: int(st.LiveRecords), LiveBytes: st.LiveBytes}, err
	}
	return packstore.Stats{}, fmt.Errorf("no stats for a %T store", eng)
}

// looksLikeStore reports whether dir holds a packstore's files: shard files or
// index files. Commands other than import and demo refuse anything else, rather
// than turning a mistyped directory into a store.
// onlyLock reports whether a directory's entries are a store's lock file alone
// (a store whose creation stopped before its first shard).
func onlyLock(entries []os.DirEntry) bool {
	return len(entries) == 1 && entries[0].Name() == "LOCK"
}

func looksLikeStore(dir string) bool {
	for _, pat := range []string{"shard-*.mtdb", "index.ckpt", "index.delta"} {
		if m, _ := filepath.Glob(filepath.Join(dir, pat)); len(m) > 0 {
			return true
		}
	}
	return false
}

// readAhead is the --read-ahead flag: packstore.Options.ReadAhead of every
// store the command opens.
var readAhead readAheadFlag

// readAheadFlag parses a packstore.ReadAheadMode by its String name.
type readAheadFlag struct{ mode packstore.ReadAheadMode }

func (f *readAheadFlag) String() string { return f.mode.String() }
func (f *readAheadFlag) Type() string   { return "random|kernel" }

func (f *readAheadFlag) Set(s string) error {
	for _, m := range []packstore.ReadAheadMode{packstore.ReadAheadRandom, packstore.ReadAheadKernel} {
		if m.String() == s {
			f.mode = m
			return nil
		}
	}
	return fmt.Errorf("unknown read-ahead mode %q (random or kernel)", s)
}

// corruptError marks a store that failed a check: the command exits with status 2.
type corruptError struct{ error }

func (c corruptError) Unwrap() error { return c.error }

func importCmd() *cobra.Command {
	var store, roomVersion, keysFile string
	var rf repackFlags
	var batch int
	var anyOrder, repack, asJSON, strict bool
	c := &cobra.Command{
		Use:   "import --store DIR [--strict] [--keys FILE] [--any-order [--room-version V]] [--repack [--plan KIND] [--liveness all|every-k [--every K]]] PATH...",
		Short: "Import PDUs (JSON lines or a JSON array; room directories with events.jsonl, or directories of them)",
		Long: `Import reads PDUs and stores each new one with its prev/auth edges. A PATH is a
file of PDUs ("-": standard input), a room directory (its events.jsonl), or a directory of room
directories (each room's events.jsonl, by name; testrooms/real, gen --rooms). An
empty or blank file is skipped with a warning; if every input is, nothing is
written and the exit status is 1. Every PDU's
prev_events and auth_events must be in the store or earlier in the input; a room's
first PDU must be its m.room.create. Events already stored are skipped, so an import
can be re-run. A PDU that is not a valid event (over 65,536 bytes, a field over 255
bytes, malformed JSON, a bad event ID, an unknown room version) or cannot be placed
(unknown prev/auth events, no m.room.create yet, an auth event of another room) is
refused: a "refused import FILE line N (event ID): reason" line (the first 100 of
an input; then one line counts the rest, which --json lists), and the import goes
on with the next PDU, as a homeserver drops an invalid PDU. A PDU whose content hash does
not match is stored in redacted form, as the spec says, and counted as redacted=N.
The summary counts refused=N. Exit status: with --strict, 2 when anything was
refused; without it, 2 when more PDUs were refused than stored or skipped as
already stored (every PDU refused included), 0 otherwise. When PDUs were refused, a line on standard error starting
"mtxdb: import:" says how many of them a flag would have placed (--any-order for
PDUs ahead of their prev/auth events, --room-version for rooms whose m.room.create
is not first) and how many were refused only because an event they name was
refused before them. --keys
FILE (servers' public keys: {"server": {"ed25519:ID": "base64"}}; mtxdb gen --keys
writes one) also refuses PDUs without valid signatures from the sender's server (v1-2:
and the event_id's server; restricted joins: the authorising user's server). With --any-order, PDUs may come before their
prev/auth events (a backfill, newest first): replay then sorts them and leaves out as
outliers events whose ancestors never arrive; --room-version names the version of a
room whose m.room.create comes later. --repack replays and repacks the rooms just
imported, with --plan, --liveness and --every as in mtxdb repack.

Ctrl-C (SIGINT) or SIGTERM stops at the next read: what was imported is synced,
the command says where it stopped and exits 130 (143); run the same import again
to continue. A second signal stops at once.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) (rerr error) {
			if batch <= 0 {
				return fmt.Errorf("--batch must be positive, not %d", batch)
			}
			if roomVersion != "" && !anyOrder {
				return fmt.Errorf("--room-version only applies with --any-order")
			}
			if roomVersion != "" {
				if _, err := gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersion(roomVersion)); err != nil {
					return fmt.Errorf("--room-version %q: %w (known: 1-12 and their experimental variants)", roomVersion, roomstate.ErrUnknownRoomVersion)
				}
			}
			if err := needFlag(cmd, "repack", repack, "plan", "liveness", "every"); err != nil {
				return err
			}
			opts, err := rf.options(cmd)
			if err != nil {
				return err
			}
			skip := importSkips(cmd.ErrOrStderr(), cmd.OutOrStdout(), asJSON)
			paths, err := importPaths(args, skip)
			if err != nil {
				return err
			}
			if paths, err = dropBlank(paths, skip); err != nil {
				return err
			}
			var keys roomstate.KeyRing
			if keysFile != "" {
				if keys, err = roomstate.LoadKeyRing(keysFile); err != nil {
					return err
				}
			}
			_, serr := os.Lstat(store)
			fresh := !pgstore.IsURL(store) && errors.Is(serr, fs.ErrNotExist) // this run creates the store directory
			emptyBefore := false
			if ents, err := os.ReadDir(store); err == nil && len(ents) == 0 && !pgstore.IsURL(store) {
				emptyBefore = true // this run creates the store in an empty directory
			}
			eng, st, err := openStore(store, true)
			if err != nil {
				return err
			}
			removeStore := false // a store this run created and stored nothing in
			defer func() {
				switch {
				case !removeStore:
				case fresh:
					os.RemoveAll(store)
				default: // the directory was there, empty: empty it again
					ents, _ := os.ReadDir(store)
					for _, e := range ents {
						os.RemoveAll(filepath.Join(store, e.Name()))
					}
				}
			}()
			defer eng.Close()
			out := cmd.OutOrStdout()
			touched := map[string]bool{}
			refused := 0
			defer func() {
				if strict && refused > 0 && rerr == nil {
					printLine(out, asJSON, "strict", kv{"refused", refused}, kv{"exit", 2})
					rerr = exitError(2)
				}
			}()
			var all roomstate.ImportResult // over every input
			malformedOnly := true          // every refusal so far is of input that is not a PDU
			tally := refusalTally{anyOrder: anyOrder}
			dominated := false // more PDUs refused than stored: exit 2
			defer func() {
				if dominated && rerr == nil {
					rerr = exitError(2)
				}
			}()
			stop := catchInterrupts("import", nil)
			defer stop()
			for n, path := range paths {
				res, err := importFile(st, path, roomstate.ImportOptions{BatchSize: batch, AnyOrder: anyOrder, RoomVersion: roomVersion, KeepGoing: true, Keys: keys}, out)
				for i, r := range res.Refused {
					switch {
					case asJSON:
						printLine(out, true, "refused", kv{"file", path}, kv{"line", r.Line}, kv{"element", r.Element}, kv{"event_id", r.EventID}, kv{"reason", r.Err.Error()})
					case i < maxRefusalLines:
						fmt.Fprintf(out, "refused %s\n", r)
					case i == maxRefusalLines:
						fmt.Fprintf(out, "refused: %d more in %s not shown (--json lists every refusal)\n", len(res.Refused)-maxRefusalLines, path)
					}
				}
				refused += len(res.Refused)
				for _, r := range res.Refused {
					malformedOnly = malformedOnly && errors.Is(r.Err, roomstate.ErrMalformedPDU)
					tally.add(r)
				}
				f := []kv{{"read", res.Read}, {"imported", res.Imported}, {"skipped", res.Skipped}, {"variants", res.Variants}, {"refused", len(res.Refused)}, {"rooms", len(res.Rooms)}, {"redacted", res.Redacted}}
				if asJSON {
					printLine(out, true, "import", append([]kv{{"file", path}}, f...)...)
				} else {
					printLine(out, false, "import "+path, f...)
				}
				if errors.Is(err, errInterrupted) || (err == nil && interrupted() && n+1 < len(paths)) {
					left := ""
					if n+1 < len(paths) {
						left = fmt.Sprintf("; %d more input(s) not started", len(paths)-n-1)
					}
					if all.Read+res.Read == 0 && refused == 0 && (fresh || emptyBefore) {
						removeStore = true // interrupted before any PDU came: no store
						fmt.Fprintf(cmd.ErrOrStderr(), "mtxdb: import: interrupted in %s before any PDU was read: no store written\n", path)
						return interruptExit()
					}
					fmt.Fprintf(cmd.ErrOrStderr(), "mtxdb: import: interrupted in %s: the %d PDUs imported from it are stored and synced%s; run the same import again to continue (stored events are skipped)\n",
						path, res.Imported, left)
					return interruptExit()
				}
				if err != nil {
					return err
				}
				for _, id := range res.Rooms {
					touched[id] = true
				}
				all.Read, all.Imported, all.Skipped, all.Variants = all.Read+res.Read, all.Imported+res.Imported, all.Skipped+res.Skipped, all.Variants+res.Variants
				all.Redacted += res.Redacted
			}
			if all.Read == 0 && refused == 0 {
				// No PDU in any input: an empty pipe, "[]" (a blank regular file
				// is caught before the store is opened).
				removeStore = fresh || emptyBefore
				return fmt.Errorf("nothing to import: the inputs hold no PDU (nothing written)")
			}
			allRefused := refused > 0 && all.Imported == 0 && all.Skipped == 0
			removeStore = allRefused && (fresh || emptyBefore)
			if allRefused && !strict {
				hint := "is this a room's PDUs (JSON lines or a JSON array)?"
				switch {
				case keysFile != "":
					hint = "see the reasons above: with --keys, a key that is not the servers' refuses every PDU"
				case tally.hint() != "":
					hint = tally.hint()
				case !malformedOnly:
					hint = "see the reasons above"
				}
				made := ""
				switch {
				case fresh:
					made = " (the store directory this import created is removed)"
				case emptyBefore:
					made = " (the store files this import created in the empty directory are removed)"
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "mtxdb: import: all %d PDUs read were refused and none is stored%s: %s\n", refused, made, hint)
			} else if placed := all.Imported + all.Skipped; refused > placed && !strict {
				dominated = true
				hint := tally.hint()
				if hint == "" {
					hint = "see the reasons above"
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "mtxdb: import: %d PDUs refused, more than the %d stored or already in the store (exit status 2): %s\n", refused, placed, hint)
			} else if refused > 0 && tally.hint() != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "mtxdb: import: %d PDUs refused: %s\n", refused, tally.hint())
			}
			if len(paths) > 1 {
				what := "import" // the text line "import: files=N ..."; JSON kind import_total
				if asJSON {
					what = "import_total"
				}
				printLine(out, asJSON, what, kv{"files", len(paths)}, kv{"read", all.Read}, kv{"imported", all.Imported}, kv{"skipped", all.Skipped}, kv{"variants", all.Variants}, kv{"refused", refused}, kv{"rooms", len(touched)}, kv{"redacted", all.Redacted})
			}
			if allRefused && !strict {
				return exitError(2) // nothing stored: nothing to repack either
			}
			if !repack {
				return nil
			}
			// An exported room goes in whole: replay it, then lay it out in walk order.
			var rooms []*roomstate.Room
			for _, id := range sortedSet(touched) {
				r, err := st.Room(id)
				if err != nil {
					return err
				}
				rooms = append(rooms, r)
			}
			tot, problems, err := replayRooms(rooms, false, out, nil)
			if errors.Is(err, resolver.ErrStopped) {
				fmt.Fprintf(cmd.ErrOrStderr(), "mtxdb: import --repack: interrupted while replaying: the imported events are stored and synced, and the states computed so far; run mtxdb replay --store %s to finish the replay, then %s\n", pgstore.Redacted(store), repackCommand(store, rooms, opts))
				return interruptExit()
			}
			if err != nil {
				return err
			}
			problems.print(out, asJSON)
			printLine(out, asJSON, "replay", kv{"rooms", len(rooms)}, kv{"rooms_failed", problems.count()}, kv{"events", tot.Events}, kv{"computed", tot.Computed}, kv{"rejected", tot.Rejected}, kv{"outliers", tot.Outliers}, kv{"cyclic", tot.Cyclic})
			stop()
			// The rooms replay skipped are not planned again (their problem is printed).
			failed := problems.skipped()
			rooms = slices.DeleteFunc(rooms, func(r *roomstate.Room) bool { return failed[r.ID()] })
			defer catchInterrupts("import --repack", repackInterrupted(store, rooms, opts))()
			_, more, err := repackSummaryTo(out, asJSON, eng, rooms, opts)
			if err == nil && len(problems)+len(more) > 0 {
				return exitError(2)
			}
			return err
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp+" (created if missing)")
	c.Flags().IntVar(&batch, "batch", 1000, "events written and synced per batch")
	c.Flags().BoolVar(&anyOrder, "any-order", false, "accept PDUs before their prev/auth events (backfill order)")
	c.Flags().StringVar(&keysFile, "keys", "", "servers' public signing keys (JSON); without it signatures are not checked")
	c.Flags().BoolVar(&strict, "strict", false, "exit with status 2 when any PDU was refused (they are refused and reported either way)")
	c.Flags().BoolVar(&repack, "repack", false, "after importing, replay the rooms imported and repack them (an exported room)")
	rf.register(c, "plan kind for --repack: "+planKinds())
	c.Flags().StringVar(&roomVersion, "room-version", "", "room version of rooms whose m.room.create is not first (with --any-order)")
	jsonFlag(c, &asJSON)
	return c
}

// noArgs refuses positional arguments for commands that take none, naming them
// (cobra's own check calls an argument an unknown command).
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("%s takes no arguments, got %q: options are flags (mtxdb %s --help)", cmd.Name(), strings.Join(args, " "), cmd.Name())
	}
	return nil
}

// maxRefusalLines is how many refusals of one input import prints as text; the
// rest are counted in one line (random bytes would print one line per line).
const maxRefusalLines = 100

func importFile(st *roomstate.Store, path string, opts roomstate.ImportOptions, out io.Writer) (roomstate.ImportResult, error) {
	f := os.Stdin
	if path != "-" {
		var err error
		if f, err = os.Open(path); err != nil {
			return roomstate.ImportResult{}, err
		}
		defer f.Close()
	}
	var bar *progress
	if fi, err := f.Stat(); err == nil {
		name := filepath.Base(path)
		if name == "events.jsonl" {
			name = filepath.Base(filepath.Dir(path))
		}
		bar = newProgress(out, fi.Size(), "import "+name, true)
	}
	defer bar.finish()
	var r io.Reader = f
	if fi, err := f.Stat(); err == nil && !fi.Mode().IsRegular() {
		r = &pipeReader{f: f, res: make(chan pipeRead, 1)}
	}
	return st.Import(countingReader{r, bar}, path, opts)
}

// pipeReader reads a pipe, FIFO or terminal on a goroutine, so that SIGINT or
// SIGTERM stops an import waiting on an idle writer: the read in flight is
// abandoned and Read returns errInterrupted, and Import syncs what it read
// before. A regular file's reads do not block, and countingReader checks
// between them.
type pipeReader struct {
	f       *os.File
	res     chan pipeRead
	buf     []byte
	pending bool // a read of buf is in flight
}

type pipeRead struct {
	n   int
	err error
}

// pipePoll is how often a pipeReader waiting on its read looks for a signal.
const pipePoll = 50 * time.Millisecond

func (p *pipeReader) Read(b []byte) (int, error) {
	if !p.pending {
		if cap(p.buf) < len(b) {
			p.buf = make([]byte, len(b))
		}
		buf := p.buf[:len(b)]
		p.pending = true
		go func() {
			n, err := p.f.Read(buf)
			p.res <- pipeRead{n, err}
		}()
	}
	t := time.NewTicker(pipePoll)
	defer t.Stop()
	for {
		select {
		case r := <-p.res:
			p.pending = false
			return copy(b, p.buf[:r.n]), r.err
		case <-t.C:
			if interrupted() {
				return 0, errInterrupted
			}
			testNotice("import-pipe-wait")
		}
	}
}

// countingReader advances a byte-based progress bar as the import reads.
type countingReader struct {
	r   io.Reader
	bar *progress
}

func (c countingReader) Read(p []byte) (int, error) {
	if interrupted() {
		return 0, errInterrupted // Import syncs what it read before and returns this
	}
	n, err := c.r.Read(p)
	if n > 0 {
		testStall("import-read")
	}
	c.bar.add(n)
	return n, err
}

func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// openRooms opens an existing store and selects every room, or the one named.
func openRooms(store, roomID string, readOnly bool) (storeEngine, []*roomstate.Room, error) {
	eng, st, err := openStoreMode(store, false, readOnly)
	if err != nil {
		return nil, nil, err
	}
	rooms, err := selectRooms(st, roomID)
	if err != nil {
		eng.Close()
		return nil, nil, err
	}
	return eng, rooms, nil
}

// selectRooms returns every room, or the one named.
func selectRooms(st *roomstate.Store, roomID string) ([]*roomstate.Room, error) {
	if roomID != "" {
		r, err := st.Room(roomID)
		if err != nil {
			return nil, err
		}
		return []*roomstate.Room{r}, nil
	}
	return st.Rooms()
}

func replayCmd() *cobra.Command {
	var store, room string
	var force, asJSON bool
	c := &cobra.Command{
		Use:   "replay --store DIR [--room ROOM_ID] [--force]",
		Short: "Compute the state before and after every event through state resolution",
		Long: `Replay walks each room's events in topological order over prev and auth events
(ties by arrival; events whose ancestors never arrived are left out as outliers),
resolves the states after each event's prev_events into the state before it, authorises the
event against its auth events and that state (rejecting it otherwise), and stores both
snapshots; then sets forward extremities and current state. Replay is incremental:
events that already have a state record keep it (unless an earlier event was
recomputed), so it computes only what import added; --force recomputes everything.
After an every-k repack, events whose state was dropped stay without one
(state_not_kept); a new event whose prev_events name one gets it recomputed in memory
(rederived). --force writes every state record again and clears the every-k rule.
It prints one summary line; use verify --expected to compare with recorded state.

A room that cannot be replayed (a record that does not decode, an event the rules
cannot handle) is skipped with a "problem room=…" line and the other rooms are
replayed; events that lie on a cycle of prev_events and auth_events (or descend
from one) are left out as outliers and named in a problem line. The summary counts
rooms_failed and cyclic; exit status 2 when there is any problem.

Ctrl-C (SIGINT) or SIGTERM stops before the next event: the states computed so far
are synced, the command prints its summary and how to continue, and exits 130
(143). A second signal stops at once.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := nonEmptyFlag(cmd, "room", room); err != nil {
				return err
			}
			eng, rooms, err := openRooms(store, room, false)
			if err != nil {
				return err
			}
			defer eng.Close()
			defer catchInterrupts("replay", nil)()
			var durs []time.Duration
			tot, problems, err := replayRooms(rooms, force, cmd.OutOrStdout(), &durs)
			stopped := errors.Is(err, resolver.ErrStopped)
			if err != nil && !stopped {
				return err
			}
			problems.print(cmd.OutOrStdout(), asJSON)
			p50, p99 := percentile(durs, 0.50), percentile(durs, 0.99)
			printLine(cmd.OutOrStdout(), asJSON, "replay", kv{"rooms", len(rooms)}, kv{"rooms_failed", problems.count()}, kv{"events", tot.Events}, kv{"computed", tot.Computed}, kv{"rejected", tot.Rejected},
				kv{"outliers", tot.Outliers}, kv{"cyclic", tot.Cyclic}, kv{"state_not_kept", tot.NotKept}, kv{"rederived", tot.Rederived}, kv{"resolutions", tot.Resolutions},
				kv{"conflicted_keys", tot.ConflictedKeys}, kv{"auth_difference", tot.AuthDifference}, kv{"pdus_parsed", tot.PDUsParsed},
				kv{"resolution_p50_us", p50.Microseconds()}, kv{"resolution_p99_us", p99.Microseconds()})
			if stopped {
				fmt.Fprintf(cmd.ErrOrStderr(), "mtxdb: replay: interrupted (%v): the state records of the %d events computed are stored and synced; %s\n", err, tot.Computed, replayResumeHint(store, room, force))
				return interruptExit()
			}
			if len(problems) > 0 {
				return exitError(2)
			}
			return nil
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp)
	c.Flags().StringVar(&room, "room", "", "replay only this room ID")
	c.Flags().BoolVar(&force, "force", false, "recompute every event, not only those without a state record")
	jsonFlag(c, &asJSON)
	return c
}

// percentile returns the q-quantile (nearest rank) of ds, 0 for none; ds is sorted.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

// replayRooms replays each room; times, if set, receives the wall time of every
// resolution that was computed (not those answered from the resolver's memo). A
// room whose replay fails on its data (a corrupt record, an event resolution or
// the rules cannot handle) is a skipped problem and the others are replayed; a
// room with events on a prev/auth cycle is a problem too (those events are left
// out). Only a store lost during the run (lostStore) or ErrStopped ends it early.
func replayRooms(rooms []*roomstate.Room, force bool, out io.Writer, times *[]time.Duration) (resolver.ReplayResult, roomProblems, error) {
	var tot resolver.ReplayResult
	var problems roomProblems
	total := 0
	for _, r := range rooms {
		total += int(r.Head().Events)
	}
	bar := newProgress(out, int64(total), "replay", false)
	defer bar.finish()
	done := 0 // events walked, for testStall
	for _, r := range rooms {
		walked := 0
		res, err := resolver.Replay(r, resolver.ReplayOptions{Force: force, Progress: func(done, _ int) { walked++; bar.add(1) }, ResolutionTimes: times, Stop: func() bool {
			if done++; done == 1001 { // asked before event 1001: 1000 walked
				testStall("replay-1000")
			}
			return interrupted()
		}})
		if err != nil && !errors.Is(err, resolver.ErrStopped) {
			if lostStore(err) {
				return tot, problems, fmt.Errorf("replay room %s: %w", r.ID(), err)
			}
			problems = append(problems, roomProblem{room: r.ID(), what: fmt.Sprintf("not replayed: %v", err), skipped: true})
			bar.add(max(0, int(r.Head().Events)-walked))
			continue
		}
		tot.Events += res.Events
		tot.Computed += res.Computed
		tot.Outliers += res.Outliers
		tot.Cyclic += res.Cyclic
		tot.NotKept += res.NotKept
		tot.Rederived += res.Rederived
		tot.AuthDifference += res.AuthDifference
		tot.PDUsParsed += res.PDUsParsed
		tot.Rejected += res.Rejected
		tot.Resolutions += res.Resolutions
		tot.ConflictedKeys += res.ConflictedKeys
		if res.Cyclic > 0 {
			problems = append(problems, cyclicProblem(r.ID(), res.Cyclic, res.CyclicIDs))
		}
		if err != nil { // stopped: what it computed is synced
			bar.finish()
			return tot, problems, err
		}
	}
	bar.finish()
	return tot, problems, nil
}

func verifyCmd() *cobra.Command {
	var store, room string
	var expected []string
	var asJSON, listRejected bool
	c := &cobra.Command{
		Use:   "verify --store DIR [--room ROOM_ID] [--expected DIR]... [--rejected]",
		Short: "Check every record and snapshot; compare with recorded state",
		Long: `Verify reads every record of each room: PDUs, metadata, state records, every
distinct snapshot (node hashes, canonical CHAMP shape, entries naming state events of
their key). With --expected (a room directory with expected_state.jsonl, or a directory
of such rooms) it also compares the state after every event and the current state with
what the origin server recorded, printing each mismatch with room, event, key, ours,
recorded. Events whose state an every-k repack dropped (mtxdb repack --liveness
every-k) are counted as state_not_kept and not compared. A recorded room directory
needs meta.json naming its room_id. The summary counts the events replay rejected;
--rejected prints each as "rejected room=… event=…: reason", the reason naming the
authorization rule.

A room not replayed to its end (only imported, a replay interrupted, events imported
since) has its existing state records checked, and its events without one are
counted as unreplayed with one line per room: that alone is not damage (exit 0).
Compared with --expected, such a room is one problem line ("room not replayed"),
not a mismatch per event. A room that fails its check is a problem line, and its
events are counted as unchecked_events (not in events).

Exit status 2 when the data is wrong: a mismatch, a room that fails its check, a
recorded room the store lacks or has not replayed, a recorded room directory whose
files are malformed (a line of expected_state.jsonl that does not decode, a line
count meta.json contradicts), or a store that fails to open as corrupt; 1 for usage
and I/O errors, including a store lost during the run; 0 otherwise.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := nonEmptyFlag(cmd, "room", room); err != nil {
				return err
			}
			eng, rooms, err := openRooms(store, room, true)
			if err != nil {
				return err
			}
			defer eng.Close()
			exps, err := loadExpectedDirs(expected, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if room != "" { // compare only the selected room
				for _, exp := range sortedExpected(exps) {
					if exp.RoomID != room {
						fmt.Fprintf(cmd.ErrOrStderr(), "mtxdb: warning: %s records room %s, not --room %s: not compared\n", exp.Dir, exp.RoomID, room)
					}
				}
				exps = map[string][]*testrooms.Expected{room: exps[room]}
				if len(exps[room]) == 0 {
					delete(exps, room)
				}
			}
			defer catchInterrupts("verify", func() string { return "stopped; verify writes nothing" })()
			out := cmd.OutOrStdout()
			v, err := verifyRoomsTo(rooms, exps, out, asJSON)
			if err != nil {
				return err
			}
			if listRejected {
				if err := printRejected(rooms, cmd.OutOrStdout(), asJSON); err != nil {
					return err
				}
			}
			if pf, ok := eng.(*packstore.PackfileStorage); ok && pf.OpenReport().TruncatedBytes > 0 {
				r := pf.OpenReport()
				// A bad tail (opened read-only, it stays on disk): after a crash
				// that is unsynced data, but verify cannot tell it from lost data
				// (README, Known limits).
				v.problems++
				printProblem(out, asJSON, "", fmt.Sprintf("store: %s has a torn or cut-short tail of %d bytes at offset %d, left on disk (index from %s)",
					r.TruncatedFile, r.TruncatedBytes, r.TruncatedAt, r.Source))
			}
			if len(rooms) == 0 && room == "" {
				// Records but no room: another program's store in packstore's
				// format (a Dendrite's state store holds HAMT nodes by NID), or
				// the room heads are lost.
				if st, err := storeStats(eng); err == nil && st.LiveRecords > 0 {
					v.problems++
					printProblem(out, asJSON, "", fmt.Sprintf("store: %d records but no mtxdb room: not a store of mtxdb's rooms (a Dendrite state store, for one), or its room heads are lost; nothing was checked", st.LiveRecords))
				}
			}
			printLine(out, asJSON, "verify", kv{"rooms", len(rooms)}, kv{"events", v.events}, kv{"unchecked_events", v.unchecked}, kv{"unreplayed", v.unreplayed},
				kv{"snapshots", v.snapshots}, kv{"state_not_kept", v.notKept}, kv{"compared_events", v.compared}, kv{"compared_room_dirs", v.comparedRooms},
				kv{"mismatches", v.mismatches}, kv{"problems", v.problems}, kv{"rejected", v.rejected})
			if v.mismatches > 0 || v.problems > 0 {
				return exitError(2)
			}
			return nil
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp)
	c.Flags().StringVar(&room, "room", "", "verify only this room ID")
	c.Flags().StringArrayVar(&expected, "expected", nil, "room directory, or directory of rooms, with recorded state")
	c.Flags().BoolVar(&listRejected, "rejected", false, "print each rejected event with the reason replay recorded (the authorization rule)")
	jsonFlag(c, &asJSON)
	return c
}

// nonEmptyFlag refuses a flag given with an empty or blank value (--room ”),
// which would otherwise mean "every room".
func nonEmptyFlag(c *cobra.Command, name, value string) error {
	if c.Flags().Changed(name) && strings.TrimSpace(value) == "" {
		return fmt.Errorf("--%s is empty; give a room ID, or leave the flag out for every room", name)
	}
	return nil
}

// loadExpectedDirs reads recorded state from room directories or directories of
// rooms, keyed by room ID. Several directories may hold versions of one room (the
// real rooms' room004 and room004_union): all of them are kept, in directory order.
// A subdirectory that is neither a room directory nor a recorded room is skipped
// with a warning to warn.
func loadExpectedDirs(paths []string, warn io.Writer) (map[string][]*testrooms.Expected, error) {
	out := map[string][]*testrooms.Expected{}
	seen := map[string]bool{} // room directories read, by absolute path, symlinks resolved
	for _, p := range paths {
		dirs := []string{p}
		if _, err := os.Stat(filepath.Join(p, "expected_state.jsonl")); err != nil {
			if dirs, err = testrooms.RecordedRoomDirs(p); err != nil {
				return nil, err
			}
			others, err := testrooms.OtherSubdirs(p, dirs)
			if err != nil {
				return nil, err
			}
			for _, d := range others {
				fmt.Fprintf(warn, "mtxdb: warning: %s holds neither events.jsonl nor expected_state.jsonl: skipped\n", d)
			}
		}
		if len(dirs) == 0 {
			if _, ok, _ := testrooms.EventsFile(p); ok {
				// A room without its recording is a data problem: exit 2.
				return nil, corruptError{fmt.Errorf("%s is a room directory without expected_state.jsonl: no state its server recorded to compare with", p)}
			}
			return nil, fmt.Errorf("%s holds no recorded room: a recorded room's directory holds events.jsonl, expected_state.jsonl and meta.json", p)
		}
		for _, d := range dirs {
			abs, err := filepath.Abs(d)
			if err != nil {
				return nil, err
			}
			if real, err := filepath.EvalSymlinks(abs); err == nil {
				abs = real // a symlinked room directory is the directory it names
			}
			if seen[abs] {
				fmt.Fprintf(warn, "mtxdb: warning: %s given more than once: read once\n", d)
				continue
			}
			seen[abs] = true
			if _, err := os.Stat(filepath.Join(d, "expected_state.jsonl")); errors.Is(err, fs.ErrNotExist) {
				return nil, corruptError{fmt.Errorf("%s holds events.jsonl but no expected_state.jsonl: no state its server recorded to compare with", d)}
			}
			exp, err := testrooms.OpenExpected(d)
			if errors.Is(err, testrooms.ErrRecording) {
				return nil, corruptError{err} // the recording is wrong: exit 2
			} else if err != nil {
				return nil, err
			}
			if exp.RoomID == "" {
				return nil, fmt.Errorf("%s: no meta.json naming the room_id", d)
			}
			out[exp.RoomID] = append(out[exp.RoomID], exp)
		}
	}
	return out, nil
}

// sortedExpected returns the recorded rooms ordered by directory.
func sortedExpected(exps map[string][]*testrooms.Expected) []*testrooms.Expected {
	var out []*testrooms.Expected
	for _, es := range exps {
		out = append(out, es...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dir < out[j].Dir })
	return out
}

type verifyTotals struct {
	events, snapshots, compared, comparedRooms, mismatches, problems int
	// notKept: events whose state an every-k repack dropped (not compared, not a problem).
	notKept int
	// rejected: events replay rejected (their reasons: verify --rejected).
	rejected int
	// unreplayed: events without a state record in rooms not replayed to their end.
	unreplayed int
	// unchecked: events of rooms whose check failed (not in events).
	unchecked int
}

// verifyRooms is verifyRoomsTo with text output.
func verifyRooms(rooms []*roomstate.Room, exps map[string][]*testrooms.Expected, out io.Writer) (verifyTotals, error) {
	return verifyRoomsTo(rooms, exps, out, false)
}

// verifyRoomsTo checks every room and compares those with recorded state. A room
// that fails its check or comparison is printed as a problem and counted; the other
// rooms are still verified. A recorded room the store does not hold, or has not
// replayed, is a problem too. An error that says the store itself was lost (closed,
// an I/O or connection error: lostStore) ends the run with that error, not a
// problem: exit status 1, not 2.
func verifyRoomsTo(rooms []*roomstate.Room, exps map[string][]*testrooms.Expected, out io.Writer, asJSON bool) (verifyTotals, error) {
	var v verifyTotals
	var total int64
	for _, r := range rooms {
		total += int64(r.Head().Events)
		for _, exp := range exps[r.ID()] {
			total += int64(exp.States)
		}
	}
	bar := newProgress(out, total, "verify", false)
	var base int64
	inStore := map[string]bool{}
	for _, r := range rooms {
		inStore[r.ID()] = true
		n := int64(r.Head().Events)
		cr, err := r.CheckProgress(func(i int) { bar.set(base + int64(i)) })
		base += n
		bar.set(base)
		if err != nil && lostStore(err) {
			bar.finish()
			return v, fmt.Errorf("verify room %s: %w", r.ID(), err)
		}
		if err != nil {
			v.problems++
			v.unchecked += int(n)
			bar.clear()
			printProblem(out, asJSON, r.ID(), fmt.Sprintf("%v (its %d events are not checked)", err, n))
			for _, exp := range exps[r.ID()] {
				base += int64(exp.States)
			}
			continue
		}
		v.events += cr.Events
		v.snapshots += cr.Snapshots
		v.notKept += cr.NotKept
		v.rejected += cr.Rejected
		v.unreplayed += cr.Unreplayed
		if cr.Unreplayed > 0 {
			bar.clear()
			if asJSON {
				printLine(out, true, "unreplayed", kv{"room", r.ID()}, kv{"events", cr.Unreplayed}, kv{"of", cr.Events})
			} else {
				fmt.Fprintf(out, "unreplayed room=%s: %d of %d events have no state record yet (mtxdb replay computes them)\n", r.ID(), cr.Unreplayed, cr.Events)
			}
		}
		for _, exp := range exps[r.ID()] {
			if cr.Unreplayed > 0 {
				v.problems++
				base += int64(exp.States)
				bar.clear()
				printProblem(out, asJSON, r.ID(), fmt.Sprintf("against %s: room not replayed (%d of %d events have no state record; mtxdb replay)", exp.Dir, cr.Unreplayed, cr.Events))
				continue
			}
			res, err := testrooms.CompareProgress(r, exp, func(m testrooms.Mismatch) {
				bar.clear()
				if asJSON {
					printLine(out, true, "mismatch", kv{"room", m.Room}, kv{"event", m.Event}, kv{"key", m.Key}, kv{"ours", m.Ours}, kv{"recorded", m.Recorded})
				} else {
					fmt.Fprintln(out, m)
				}
			}, func(i int) { bar.set(base + int64(i)) })
			base += int64(exp.States)
			bar.set(base)
			if err != nil && lostStore(err) {
				bar.finish()
				return v, fmt.Errorf("verify room %s against %s: %w", r.ID(), exp.Dir, err)
			}
			if err != nil {
				v.problems++
				bar.clear()
				printProblem(out, asJSON, r.ID(), fmt.Sprintf("against %s: %v", exp.Dir, err))
				continue
			}
			v.compared += res.Events
			v.comparedRooms++
			v.mismatches += res.Mismatches
		}
	}
	bar.finish()
	for _, id := range sortedSet(keysOf(exps)) {
		if !inStore[id] {
			for _, exp := range exps[id] {
				v.problems++
				printProblem(out, asJSON, id, fmt.Sprintf("recorded in %s but not in the store", exp.Dir))
			}
		}
	}
	return v, nil
}

func keysOf[V any](m map[string]V) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// printProblem prints "problem room=ID: what" (room "" for the store), or its JSON
// form {"kind":"problem","room":ID,"problem":what}.
func printProblem(out io.Writer, asJSON bool, room, what string) {
	switch {
	case asJSON:
		printLine(out, true, "problem", kv{"room", room}, kv{"problem", what})
	case room == "":
		fmt.Fprintf(out, "problem %s\n", what)
	default:
		fmt.Fprintf(out, "problem room=%s: %s\n", room, what)
	}
}

// lostStore reports whether err says the store itself went away during the run
// (closed, an I/O error from the file system, a lost connection, a cancelled
// context) rather than that the data read is wrong: verify exits 1 for those, not 2
// (exit 2 is for data problems).
func lostStore(err error) bool {
	if isDataProblem(err) {
		return false
	}
	var pe *fs.PathError
	var ne net.Error
	var errno syscall.Errno
	return errors.Is(err, packstore.ErrClosed) || errors.As(err, &pe) || errors.As(err, &ne) || errors.Is(err, net.ErrClosed) ||
		errors.As(err, &errno) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

func repackCmd() *cobra.Command {
	var store, room string
	var rf repackFlags
	var asJSON bool
	c := &cobra.Command{
		Use:   "repack --store DIR [--room ROOM_ID] [--plan KIND] [--liveness all|every-k [--every K]]",
		Short: "Rewrite rooms in the order their walks read them and drop garbage (offline)",
		Long: `Repack builds a plan per room (default reverse-topological: over prev_events from
the forward extremities, each event followed by its new snapshot nodes; auth-chain:
what state resolution's auth walks read first; edges-first: every event's edge
metadata as one dense region, then the rest; mixed: walk regions), copies the
live records of all selected rooms into new shards through one output stream, swaps
the indexes and retires shards nothing references any more. Run it with no other
process using the store.

--liveness all (the default) keeps every event's state snapshots. --liveness every-k
keeps the state record and snapshots only of the forward extremities, state events,
rejected events and every K-th event by arrival index (arrival index % K == 0); the
other events keep their PDU and edges, and their state records and the snapshot nodes
only they reach are dropped as garbage. The room head records the rule: afterwards
'mtxdb state --event' on such an event fails with "state not kept", verify counts
them as state_not_kept, replay appends new events as before (it recomputes a dropped
state in memory when a new event needs it), and 'replay --force' writes every state
record again. K may only grow to a multiple of the K of an earlier every-k repack.
--every defaults to 16.

Ctrl-C (SIGINT) or SIGTERM stops at once and says what was kept: while planning,
nothing is repacked yet; during the copy the store stays consistent (rooms whose
copy was not finished keep their old layout, and the copies already written are
garbage the next repack reclaims). Exit status 130 (143).

A room that cannot be planned (not replayed, a record that does not decode) is left
as it is, with a "problem room=…" line, and the others are repacked; exit status 2
when there is any such room.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, err := rf.options(cmd)
			if err != nil {
				return err
			}
			if err := nonEmptyFlag(cmd, "room", room); err != nil {
				return err
			}
			eng, rooms, err := openRooms(store, room, false)
			if err != nil {
				return err
			}
			defer eng.Close()
			defer catchInterrupts("repack", repackInterrupted(store, rooms, opts))()
			_, problems, err := repackSummaryTo(cmd.OutOrStdout(), asJSON, eng, rooms, opts)
			if err == nil && len(problems) > 0 {
				return exitError(2)
			}
			return err
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp)
	c.Flags().StringVar(&room, "room", "", "repack only this room ID")
	rf.register(c, "plan kind: "+planKinds())
	jsonFlag(c, &asJSON)
	return c
}

// planKinds lists the repack plan kinds for help and error texts.
func planKinds() string {
	names := make([]string, len(repackplan.Kinds))
	for i, k := range repackplan.Kinds {
		names[i] = string(k)
	}
	return strings.Join(names, ", ")
}

// needFlag fails when a flag that only applies with --on is given without it.
func needFlag(c *cobra.Command, on string, set bool, dependents ...string) error {
	if set {
		return nil
	}
	for _, d := range dependents {
		if c.Flags().Changed(d) {
			return fmt.Errorf("--%s only applies with --%s", d, on)
		}
	}
	return nil
}

// repackFlags are the plan and liveness flags of repack and import --repack.
type repackFlags struct {
	plan, liveness string
	every          uint32
}

func (f *repackFlags) register(c *cobra.Command, planHelp string) {
	c.Flags().StringVar(&f.plan, "plan", string(repackplan.ReverseTopological), planHelp)
	c.Flags().StringVar(&f.liveness, "liveness", "all", "what stays live: all (every event's state snapshots) or every-k (snapshots of forward extremities, state events, rejected events and every --every-th event by arrival)")
	c.Flags().Uint32Var(&f.every, "every", 16, "K of --liveness every-k (every K-th event by arrival keeps its state)")
}

// options checks the flags and returns the plan options.
func (f *repackFlags) options(c *cobra.Command) (repackplan.Options, error) {
	o := repackplan.Options{Kind: repackplan.Kind(f.plan)}
	if c.Flags().Changed("every") && f.liveness != string(repackplan.EveryK) {
		return o, fmt.Errorf("--every only applies with --liveness every-k")
	}
	switch f.liveness {
	case "all", string(repackplan.AllSnapshots):
		o.Liveness = repackplan.AllSnapshots
	case string(repackplan.EveryK):
		if f.every == 0 {
			return o, fmt.Errorf("--every must be at least 1")
		}
		o.Liveness, o.Every = repackplan.EveryK, f.every
	default:
		return o, fmt.Errorf("--liveness must be all or every-k, not %q", f.liveness)
	}
	if !slices.Contains(repackplan.Kinds, o.Kind) {
		return o, fmt.Errorf("--plan must be one of %s, not %q", planKinds(), f.plan)
	}
	return o, nil
}

// planRooms plans every room (under every-k this writes each room's head: the keep
// rule) and returns the repack plan and the plans' stats summed. A room that cannot
// be planned because of its data (not replayed, a record that does not decode) is a
// skipped problem and left as it is; any other error (options the room's keep rule
// refuses, a store lost during the run) ends planning.
func planRooms(rooms []*roomstate.Room, opts repackplan.Options, out io.Writer) (packstore.RepackPlan, repackplan.Stats, roomProblems, error) {
	var plan packstore.RepackPlan
	var tot repackplan.Stats
	var problems roomProblems
	bar := newProgress(out, int64(len(rooms)), "planning", false)
	defer bar.finish()
	for _, r := range rooms {
		cp, ps, err := repackplan.Plan(r, opts)
		if errors.Is(err, repackplan.ErrNotReplayed) || isDataProblem(err) {
			what := fmt.Sprintf("not repacked: %v", err)
			if errors.Is(err, repackplan.ErrNotReplayed) {
				// Plans walk the state records: say what to run first.
				what += "; run mtxdb replay on the store first (a plan follows the state records)"
			}
			problems = append(problems, roomProblem{room: r.ID(), what: what, skipped: true})
			bar.add(1)
			continue
		}
		if err != nil {
			return plan, tot, problems, err
		}
		tot.Events += ps.Events
		tot.Nodes += ps.Nodes
		tot.Records += ps.Records
		tot.Walked += ps.Walked
		tot.StatesDropped += ps.StatesDropped
		plan.Collections = append(plan.Collections, cp)
		bar.add(1)
	}
	return plan, tot, problems, nil
}

// repackRooms plans every room and repacks those planned through one output
// stream; the rooms it could not plan are returned as problems.
func repackRooms(eng storeEngine, rooms []*roomstate.Room, opts repackplan.Options, out io.Writer) (packstore.RepackStats, roomProblems, error) {
	plan, _, problems, err := planRooms(rooms, opts, out)
	if err != nil || len(plan.Collections) == 0 {
		return packstore.RepackStats{}, problems, err
	}
	rs, err := eng.Repack(plan)
	return rs, problems, err
}

// repackSummary repacks the rooms (one plan per room, one output stream) and
// prints what it did: disk and live bytes before (after planning, which under
// every-k rewrites the room heads) and after, records copied, garbage dropped
// (records no plan kept, of which state records the liveness policy dropped; dead
// frames of superseded or deleted records go with the retired shards), shards
// retired, and the disk bytes returned (or grown: a room repacked out of shards
// other rooms keep adds its new shard and retires nothing).
func repackSummary(out io.Writer, eng storeEngine, rooms []*roomstate.Room, opts repackplan.Options) (packstore.RepackStats, roomProblems, error) {
	return repackSummaryTo(out, false, eng, rooms, opts)
}

// repackWithProgress runs eng.Repack with a bar over the rooms copied (when out is
// a terminal), polled from the engine.
func repackWithProgress(eng storeEngine, plan packstore.RepackPlan, out io.Writer) (packstore.RepackStats, error) {
	pf, isPack := eng.(*packstore.PackfileStorage)
	bar := newProgress(out, int64(len(plan.Collections)), "repack", false)
	if bar == nil || !isPack {
		return eng.Repack(plan)
	}
	done := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if i := pf.RepackProgress(); i >= 0 {
					bar.set(int64(i))
				}
			}
		}
	}()
	rs, err := eng.Repack(plan)
	close(done)
	<-polled
	bar.finish()
	return rs, err
}

// repackPhase is what a running repack is doing, for the interrupt message:
// "planning" or "copying" (the copy, the index swap and the retirement of shards).
var repackPhase atomic.Value

// repackInterrupted returns the message of an interrupted repack of store.
func repackInterrupted(store string, rooms []*roomstate.Room, opts repackplan.Options) func() string {
	again := repackCommand(store, rooms, opts)
	return func() string {
		switch repackPhase.Load() {
		case "copying":
			return "stopped during the copy: the store stays consistent (rooms whose copy was not finished keep their old layout; some may already be repacked; the copies written so far are garbage the next repack reclaims, and the next command may warn that it cut their unsynced tail); run " + again + " again"
		default:
			return "stopped while planning: nothing was repacked (an every-k plan may have recorded its keep rule in room heads, which the next repack applies); run " + again + " again"
		}
	}
}

// repackCommand is the mtxdb repack command line that repeats a repack of
// rooms with opts: plan and liveness as given, and --room when one room of
// several in the store was asked (import --repack of one room included).
func repackCommand(store string, rooms []*roomstate.Room, opts repackplan.Options) string {
	c := "mtxdb repack --store " + shellArg(pgstore.Redacted(store))
	if len(rooms) == 1 {
		c += " --room " + shellArg(rooms[0].ID())
	}
	if opts.Kind != "" {
		c += " --plan " + string(opts.Kind)
	}
	if opts.Liveness == repackplan.EveryK {
		c += fmt.Sprintf(" --liveness every-k --every %d", opts.Every)
	}
	return c
}

// repackSummaryTo is repackSummary, with JSON lines if asJSON.
// The rooms it could not plan are printed as problem lines first and returned; the
// others are repacked.
func repackSummaryTo(out io.Writer, asJSON bool, eng storeEngine, rooms []*roomstate.Room, opts repackplan.Options) (packstore.RepackStats, roomProblems, error) {
	repackPhase.Store("planning")
	plan, ps, problems, err := planRooms(rooms, opts, out)
	if err != nil {
		return packstore.RepackStats{}, problems, err
	}
	problems.print(out, asJSON)
	before, err := storeStats(eng)
	if err != nil {
		return packstore.RepackStats{}, problems, err
	}
	repackPhase.Store("copying")
	testStall("repack-copy")
	var rs packstore.RepackStats
	if len(plan.Collections) > 0 {
		if rs, err = repackWithProgress(eng, plan, out); err != nil {
			return rs, problems, err
		}
	}
	after, err := storeStats(eng)
	if err != nil {
		return rs, problems, err
	}
	liveness := string(opts.Liveness)
	if liveness == "" {
		liveness = string(repackplan.AllSnapshots)
	}
	if opts.Liveness == repackplan.EveryK {
		liveness = fmt.Sprintf("every-%d", opts.Every)
	}
	printLine(out, asJSON, "repack", kv{"plan", opts.Kind}, kv{"rooms", rs.CollectionsRepacked}, kv{"liveness", liveness}, kv{"records_copied", rs.RecordsCopied},
		kv{"bytes_copied", rs.BytesCopied}, kv{"garbage_records_dropped", rs.RecordsDropped}, kv{"state_records_dropped", ps.StatesDropped},
		kv{"garbage_live_bytes_dropped", max(0, before.LiveBytes-after.LiveBytes)}, kv{"shards_retired", rs.ShardsRetired}, kv{"bytes_retired", rs.BytesRetired})
	printLine(out, asJSON, "repack", kv{"disk_bytes_before", before.DiskBytes}, kv{"disk_bytes_after", after.DiskBytes}, kv{"returned", max(0, before.DiskBytes-after.DiskBytes)}, kv{"grown", max(0, after.DiskBytes-before.DiskBytes)},
		kv{"shards_before", before.Shards}, kv{"shards_after", after.Shards}, kv{"live_bytes_before", before.LiveBytes}, kv{"live_bytes_after", after.LiveBytes})
	return rs, problems, nil
}

func statsCmd() *cobra.Command {
	var store, room, walks string
	var reads, cold, asJSON bool
	var limit int
	c := &cobra.Command{
		Use:   "stats --store DIR [--reads [--room ROOM_ID] [--walks W,...] [--cold]]",
		Short: "Print shard, byte and room counts; with --reads, the read budget of the server walks",
		Long: `Stats prints shard, byte and room counts. With --reads it runs the walks a server does
(current-state, auth-chain, backfill of --limit events, resolve-extremities) over the
room named by --room, or every replayed room, and prints for each walk the read budget
by kind (node, pdu, meta, other): physical reads, frame bytes, distinct 4 KiB pages,
seeks (a read not in the pages of the previous read or the next one) and node-cache
hits. Each walk runs on a freshly opened store (empty node cache); --cold also evicts
the shard files from the page cache first (posix_fadvise DONTNEED). The counters are
this process's: another process's reads cannot be seen.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := needFlag(cmd, "reads", reads, "room", "walks", "limit", "cold"); err != nil {
				return err
			}
			if limit <= 0 {
				return fmt.Errorf("--limit must be positive, not %d", limit)
			}
			if err := nonEmptyFlag(cmd, "room", room); err != nil {
				return err
			}
			if reads {
				defer catchInterrupts("stats", func() string { return "stopped; stats writes nothing" })()
				return statsReads(cmd.OutOrStdout(), asJSON, store, room, walks, limit, cold)
			}
			eng, st, err := openStoreMode(store, false, true)
			if err != nil {
				return err
			}
			defer eng.Close()
			s, err := storeStats(eng)
			if err != nil {
				return err
			}
			rooms, err := st.Rooms()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			f := []kv{{"shards", s.Shards}, {"disk_bytes", s.DiskBytes}, {"collections", s.Collections}, {"live_records", s.LiveRecords}, {"live_bytes", s.LiveBytes}, {"rooms", len(rooms)}}
			if asJSON {
				printLine(out, true, "stats", f...)
			} else {
				for i, x := range f {
					if i > 0 {
						fmt.Fprint(out, " ")
					}
					fmt.Fprintf(out, "%s=%v", x.k, x.v)
				}
				fmt.Fprintln(out)
			}
			sort.Slice(rooms, func(i, j int) bool { return rooms[i].Head().Events > rooms[j].Head().Events })
			for i, r := range rooms {
				if i == 10 {
					if asJSON {
						printLine(out, true, "more_rooms", kv{"rooms", len(rooms) - 10})
					} else {
						fmt.Fprintf(out, "... %d more rooms (mtxdb rooms --store %s lists them all)\n", len(rooms)-10, pgstore.Redacted(store))
					}
					break
				}
				h := r.Head()
				if asJSON {
					printLine(out, true, "room", kv{"room_id", h.RoomID}, kv{"version", h.RoomVersion}, kv{"events", h.Events}, kv{"replayed", h.Replayed}, kv{"forward_extremities", len(h.ForwardExtremities)})
				} else {
					fmt.Fprintf(out, "room %s version=%s events=%d replayed=%t forward_extremities=%d\n",
						h.RoomID, h.RoomVersion, h.Events, h.Replayed, len(h.ForwardExtremities))
				}
			}
			return nil
		},
	}
	c.Flags().StringVar(&store, "store", "", storeHelp)
	c.Flags().BoolVar(&reads, "reads", false, "run the server walks and print their read budget by kind")
	c.Flags().StringVar(&room, "room", "", "with --reads: only this room ID")
	c.Flags().StringVar(&walks, "walks", "all", "with --reads: comma-separated walks ("+fmt.Sprint(repackplan.WalkKinds)+")")
	c.Flags().IntVar(&limit, "limit", 1000, "with --reads: events of the backfill walk")
	c.Flags().BoolVar(&cold, "cold", false, "with --reads: evict the shard files from the page cache before each walk")
	jsonFlag(c, &asJSON)
	return c
}

// statsReads runs the walks over the selected replayed rooms and prints their read
// budgets.
func statsReads(out io.Writer, asJSON bool, store, roomID, walkList string, limit int, cold bool) error {
	ws, err := parseWalks(walkList)
	if err != nil {
		return err
	}
	if pgstore.IsURL(store) {
		return fmt.Errorf("stats --reads counts packfile reads (pages, seeks); a PostgreSQL store has none to count")
	}
	eng, st, err := openStoreMode(store, false, true)
	if err != nil {
		return err
	}
	rooms, err := selectRooms(st, roomID)
	var ids []string
	for _, r := range rooms {
		if r.Head().Replayed {
			ids = append(ids, r.ID())
		}
	}
	if cerr := eng.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return fmt.Errorf("no replayed room to walk (mtxdb replay first)")
	}
	var total packstore.ReadCounters
	bar := newProgress(out, int64(len(ids)*len(ws)), "walks", false)
	for _, id := range ids {
		bar.clear()
		if !asJSON {
			fmt.Fprintf(out, "room %s\n", id)
		}
		for _, w := range ws {
			wb, err := measureWalk(store, id, w, limit, cold)
			if err != nil {
				bar.finish()
				return err
			}
			bar.clear()
			if asJSON {
				kinds := map[string]map[string]int64{}
				for k, c := range wb.Kinds {
					kinds[k] = countersJSON(c)
				}
				printLine(out, true, "walk", kv{"room", id}, kv{"walk", wb.Walk}, kv{"events", wb.Events}, kv{"wall_us", wb.Wall.Microseconds()},
					kv{"cold", wb.Cold}, kv{"total", countersJSON(wb.Total)}, kv{"kinds", kinds})
			} else {
				printBudget(out, "  ", wb)
			}
			bar.add(1)
			total = total.Add(wb.Total)
		}
	}
	bar.finish()
	printLine(out, asJSON, "reads", kv{"rooms", len(ids)}, kv{"walks", len(ws)}, kv{"reads", total.Reads}, kv{"bytes", total.Bytes}, kv{"pages", total.Pages},
		kv{"seeks", total.Seeks}, kv{"cache_hits", total.CacheHits})
	return nil
}

// countersJSON names read counters as the text lines do.
func countersJSON(c packstore.ReadCounters) map[string]int64 {
	return map[string]int64{"reads": c.Reads, "bytes": c.Bytes, "pages": c.Pages, "seeks": c.Seeks, "cache_hits": c.CacheHits}
}

// shellArg quotes s for a POSIX shell when it holds anything but letters,
// digits and _@%+=:,./- (a room ID's "!" is history expansion in an
// interactive bash; a postgres:// URL's "?" and "&" are special too), so that
// advice can be pasted as printed.
func shellArg(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// replayResumeHint says how to continue an interrupted replay, with a
// postgres:// store's password masked.
func replayResumeHint(store, room string, force bool) string {
	again := "mtxdb replay --store " + shellArg(pgstore.Redacted(store))
	if room != "" {
		again += " --room " + shellArg(room)
	}
	if force {
		// A forced replay rewrites records and clears the every-k rule at its
		// end: a plain replay would keep the rule.
		return "run " + again + " --force again to recompute every event (it starts over)"
	}
	return "run " + again + " to continue: it computes only the events without a state record"
}

// danglingLink reports whether path is a symbolic link whose target does not
// exist, and the target it names.
func danglingLink(path string) (string, bool) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSymlink == 0 {
		return "", false
	}
	if _, err := os.Stat(path); err == nil {
		return "", false
	}
	target, _ := os.Readlink(path)
	return target, true
}
