package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/pgstore"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
)

// importCmd is mtxdb import: PDUs from files, room directories or standard input
// into a store, with --repack to replay and repack the rooms imported.
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
