package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/mtxdb/mtxdb/pdu"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/pgstore"
	"github.com/mtxdb/mtxdb/repackplan"
	"github.com/mtxdb/mtxdb/resolver"
	"github.com/mtxdb/mtxdb/roomstate"
)

// importCmd is mtxdb import: PDUs from files, room directories or standard input
// into a store, with --repack to replay and repack the rooms imported.
func importCmd() *cobra.Command {
	var f importFlags
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
bytes, malformed JSON, a missing or malformed event ID where the room version checks it, an unknown room version) or cannot be placed
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
Under a soft heap limit (--memory-limit, default 1.5GiB) and without GOGC set,
import collects garbage at GOGC=200, as replay does (the 1M-event generated
room: about 580 MB of RSS, 420 at GOGC=100).

Ctrl-C (SIGINT) or SIGTERM stops at the next read: what was imported is synced,
the command says where it stopped and exits 130 (143); run the same import again
to continue. A second signal stops at once.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("from") {
				if len(args) > 0 {
					return fmt.Errorf("--from imports a server's database, not PATHs: give one or the other (got %q)", strings.Join(args, " "))
				}
				return nil
			}
			return cobra.MinimumNArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) (rerr error) {
			ctx := cmd.Context()
			opts, err := f.validate(cmd)
			if err != nil {
				return err
			}
			importGC()
			if cmd.Flags().Changed("from") {
				return f.runFrom(cmd, opts)
			}
			paths, keys, err := f.inputs(cmd, args)
			if err != nil {
				return err
			}
			return f.run(cmd, opts, len(paths), func(r *importRun) error { return r.importAll(ctx, paths, keys) })
		},
	}
	c.Flags().StringVar(&f.store, "store", "", storeHelp+" (created if missing)")
	c.Flags().IntVar(&f.batch, "batch", 1000, "events written and synced per batch (with --from, 10000 unless given)")
	c.Flags().BoolVar(&f.anyOrder, "any-order", false, "accept PDUs before their prev/auth events (backfill order)")
	c.Flags().StringVar(&f.keysFile, "keys", "", "servers' public signing keys (JSON); without it signatures are not checked")
	c.Flags().BoolVar(&f.strict, "strict", false, "exit with status 2 when any PDU was refused (they are refused and reported either way)")
	c.Flags().BoolVar(&f.repack, "repack", false, "after importing, replay the rooms imported and repack them (an exported room)")
	f.rf.register(c, "plan kind for --repack: "+planKinds())
	c.Flags().StringVar(&f.from, "from", "", "import a server's database instead of PATHs: synapse:PATH_OR_URL or dendrite:PATH_OR_URL (read-only; the recorded state goes to the store's recorded/)")
	c.Flags().StringVar(&f.fromRoom, "room", "", "with --from: import only this room ID")
	c.Flags().StringVar(&f.roomVersion, "room-version", "", "room version of rooms whose m.room.create is not first (with --any-order)")
	jsonFlag(c, &f.asJSON)
	return c
}

// importFlags are the flags of mtxdb import.
type importFlags struct {
	store, roomVersion, keysFile     string
	from, fromRoom                   string // --from and its --room
	rf                               repackFlags
	batch                            int
	anyOrder, repack, asJSON, strict bool
}

// validate checks the flags that depend on each other and returns the plan
// options of --repack.
func (f *importFlags) validate(cmd *cobra.Command) (repackplan.Options, error) {
	if f.batch <= 0 {
		return repackplan.Options{}, fmt.Errorf("--batch must be positive, not %d", f.batch)
	}
	if f.roomVersion != "" && !f.anyOrder {
		return repackplan.Options{}, fmt.Errorf("--room-version only applies with --any-order")
	}
	if f.roomVersion != "" {
		if _, err := gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersion(f.roomVersion)); err != nil {
			return repackplan.Options{}, fmt.Errorf("--room-version %q: %w (known: 1-12 and their experimental variants)", f.roomVersion, pdu.ErrUnknownRoomVersion)
		}
	}
	if err := needFlag(cmd, "repack", f.repack, "plan", "liveness", "every"); err != nil {
		return repackplan.Options{}, err
	}
	if err := needFlag(cmd, "from", f.from != "", "room"); err != nil {
		return repackplan.Options{}, err
	}
	return f.rf.options(cmd)
}

// inputs resolves the PATH arguments to the files to read (blank ones skipped
// with a warning) and loads --keys; it runs before the store is opened, so that
// a bad argument writes nothing.
func (f *importFlags) inputs(cmd *cobra.Command, args []string) ([]string, pdu.KeyRing, error) {
	skip := importSkips(cmd.ErrOrStderr(), cmd.OutOrStdout(), f.asJSON)
	paths, err := importPaths(args, skip)
	if err != nil {
		return nil, nil, err
	}
	if paths, err = dropBlank(paths, skip); err != nil {
		return nil, nil, err
	}
	var keys pdu.KeyRing
	if f.keysFile != "" {
		if keys, err = pdu.LoadKeyRing(f.keysFile); err != nil {
			return nil, nil, err
		}
	}
	return paths, keys, nil
}

// run opens the store, imports through importInputs (inputs: how many inputs it
// reads, for the totals line), reports, and replays and repacks with --repack;
// the store is removed when this run created it and stored nothing.
func (f *importFlags) run(cmd *cobra.Command, opts repackplan.Options, inputs int, importInputs func(*importRun) error) (rerr error) {
	r, err := f.open(cmd)
	if err != nil {
		return err
	}
	defer r.removeIfEmpty()
	defer r.eng.Close()
	defer func() { rerr = r.exitStatus(rerr) }()
	stop := catchInterrupts("import", nil)
	defer stop()
	if err := importInputs(r); err != nil {
		return err
	}
	if err := r.report(inputs); err != nil || !f.repack {
		return err
	}
	return r.replayAndRepack(cmd.Context(), opts, stop)
}

// importRun is one run of mtxdb import: its store and what its inputs have added
// up to so far.
type importRun struct {
	*importFlags
	out, errOut io.Writer
	eng         storeEngine
	st          *roomstate.Store
	// fresh: this run creates the store directory; emptyBefore: it creates the
	// store in an empty directory. removeStore: the store is one this run
	// created and stored nothing in, removed when the command ends.
	fresh, emptyBefore, removeStore bool
	touched                         map[string]bool        // rooms of the PDUs read, by ID
	all                             roomstate.ImportResult // summed over every input; Refused unused
	refused                         int                    // PDUs refused, over every input
	malformedOnly                   bool                   // every refusal so far is of input that is not a PDU
	tally                           refusalTally
	dominated                       bool // more PDUs refused than stored: exit 2
}

// open opens or creates --store, noting whether this run creates it.
func (f *importFlags) open(cmd *cobra.Command) (*importRun, error) {
	r := &importRun{importFlags: f, out: cmd.OutOrStdout(), errOut: cmd.ErrOrStderr(), touched: map[string]bool{}, malformedOnly: true, tally: refusalTally{anyOrder: f.anyOrder}}
	_, serr := os.Lstat(f.store)
	r.fresh = !pgstore.IsURL(f.store) && errors.Is(serr, fs.ErrNotExist)
	if ents, err := os.ReadDir(f.store); err == nil && len(ents) == 0 && !pgstore.IsURL(f.store) {
		r.emptyBefore = true
	}
	var err error
	if r.eng, r.st, err = openStore(f.store, true); err != nil {
		return nil, err
	}
	return r, nil
}

// removeIfEmpty removes a store this run created and stored nothing in: the
// directory it created, or the files it created in an empty one. It runs after
// the store is closed.
func (r *importRun) removeIfEmpty() {
	switch {
	case !r.removeStore:
	case r.fresh:
		os.RemoveAll(r.store)
	default:
		ents, _ := os.ReadDir(r.store)
		for _, e := range ents {
			os.RemoveAll(filepath.Join(r.store, e.Name()))
		}
	}
}

// exitStatus is the command's error given err, the error it returns otherwise:
// exit status 2 with --strict when any PDU was refused (with a "strict" line),
// or without it when more PDUs were refused than stored.
func (r *importRun) exitStatus(err error) error {
	if r.dominated && err == nil {
		return exitError(2)
	}
	if r.strict && r.refused > 0 && err == nil {
		printLine(r.out, r.asJSON, "strict", kv{"refused", r.refused}, kv{"exit", 2})
		return exitError(2)
	}
	return err
}

// importAll imports each input in turn, printing its refusals and its line. An
// interruption ends it with the interrupt's exit status, saying what was stored.
func (r *importRun) importAll(ctx context.Context, paths []string, keys pdu.KeyRing) error {
	opts := roomstate.ImportOptions{BatchSize: r.batch, AnyOrder: r.anyOrder, RoomVersion: r.roomVersion, KeepGoing: true, Keys: keys}
	for n, path := range paths {
		res, err := importFile(ctx, r.st, path, opts, r.out)
		r.printRefusals(path, res.Refused)
		r.refused += len(res.Refused)
		for _, e := range res.Refused {
			r.malformedOnly = r.malformedOnly && errors.Is(e.Err, pdu.ErrMalformedPDU)
			r.tally.add(e)
		}
		f := []kv{{"read", res.Read}, {"imported", res.Imported}, {"skipped", res.Skipped}, {"variants", res.Variants}, {"refused", len(res.Refused)}, {"rooms", len(res.Rooms)}, {"redacted", res.Redacted}}
		if r.asJSON {
			printLine(r.out, true, "import", append([]kv{{"file", path}}, f...)...)
		} else {
			printLine(r.out, false, "import "+path, f...)
		}
		if errors.Is(err, errInterrupted) || (err == nil && interrupted() && n+1 < len(paths)) {
			return r.interruptedIn(path, res, len(paths)-n-1)
		}
		if err != nil {
			return err
		}
		for _, id := range res.Rooms {
			r.touched[id] = true
		}
		r.all.Read, r.all.Imported, r.all.Skipped, r.all.Variants = r.all.Read+res.Read, r.all.Imported+res.Imported, r.all.Skipped+res.Skipped, r.all.Variants+res.Variants
		r.all.Redacted += res.Redacted
	}
	return nil
}

// printRefusals prints an input's refusals: as text the first maxRefusalLines
// and a count of the rest, as JSON every one. A reason naming an ImportOptions
// field names the flag that sets it instead (importFlagWording).
func (r *importRun) printRefusals(path string, refused []*roomstate.ImportError) {
	for i, e := range refused {
		reason := importFlagWording.Replace(e.Err.Error())
		switch {
		case r.asJSON:
			printLine(r.out, true, "refused", kv{"file", path}, kv{"line", e.Line}, kv{"element", e.Element}, kv{"event_id", e.EventID}, kv{"reason", reason})
		case i < maxRefusalLines:
			worded := *e
			worded.Err = errors.New(reason)
			fmt.Fprintf(r.out, "refused %s\n", &worded)
		case i == maxRefusalLines:
			fmt.Fprintf(r.out, "refused: %d more in %s not shown (--json lists every refusal)\n", len(refused)-maxRefusalLines, path)
		}
	}
}

// interruptedIn says where an interrupted import stopped (in path, with left
// inputs not started) and returns the interrupt's exit status; a store this run
// created before any PDU was read is removed.
func (r *importRun) interruptedIn(path string, res roomstate.ImportResult, left int) error {
	more := ""
	if left > 0 {
		more = fmt.Sprintf("; %d more input(s) not started", left)
	}
	if r.all.Read+res.Read == 0 && r.refused == 0 && (r.fresh || r.emptyBefore) {
		r.removeStore = true
		fmt.Fprintf(r.errOut, "mtxdb: import: interrupted in %s before any PDU was read: no store written\n", path)
		return interruptExit()
	}
	fmt.Fprintf(r.errOut, "mtxdb: import: interrupted in %s: the %d PDUs imported from it are stored and synced%s; run the same import again to continue (stored events are skipped)\n",
		path, res.Imported, more)
	return interruptExit()
}

// report judges the inputs once all are read: an error when they held no PDU,
// a line on standard error when PDUs were refused (with the flag that would
// have placed them), the totals line when there were several inputs, and exit
// status 2 when every PDU was refused (without --strict, which reports that
// itself).
func (r *importRun) report(files int) error {
	if r.all.Read == 0 && r.refused == 0 {
		// No PDU in any input: an empty pipe, "[]" (a blank regular file
		// is caught before the store is opened).
		r.removeStore = r.fresh || r.emptyBefore
		return fmt.Errorf("nothing to import: the inputs hold no PDU (nothing written)")
	}
	allRefused := r.refused > 0 && r.all.Imported == 0 && r.all.Skipped == 0
	r.removeStore = allRefused && (r.fresh || r.emptyBefore)
	if allRefused && !r.strict {
		hint := "is this a room's PDUs (JSON lines or a JSON array)?"
		switch {
		case r.keysFile != "":
			hint = "see the reasons above: with --keys, a key that is not the servers' refuses every PDU"
		case r.tally.hint() != "":
			hint = r.tally.hint()
		case !r.malformedOnly:
			hint = "see the reasons above"
		}
		made := ""
		switch {
		case r.fresh:
			made = " (the store directory this import created is removed)"
		case r.emptyBefore:
			made = " (the store files this import created in the empty directory are removed)"
		}
		fmt.Fprintf(r.errOut, "mtxdb: import: all %d PDUs read were refused and none is stored%s: %s\n", r.refused, made, hint)
	} else if placed := r.all.Imported + r.all.Skipped; r.refused > placed && !r.strict {
		r.dominated = true
		hint := r.tally.hint()
		if hint == "" {
			hint = "see the reasons above"
		}
		fmt.Fprintf(r.errOut, "mtxdb: import: %d PDUs refused, more than the %d stored or already in the store (exit status 2): %s\n", r.refused, placed, hint)
	} else if r.refused > 0 && r.tally.hint() != "" {
		fmt.Fprintf(r.errOut, "mtxdb: import: %d PDUs refused: %s\n", r.refused, r.tally.hint())
	}
	if files > 1 {
		what := "import" // the text line "import: files=N ..."; JSON kind import_total
		if r.asJSON {
			what = "import_total"
		}
		printLine(r.out, r.asJSON, what, kv{"files", files}, kv{"read", r.all.Read}, kv{"imported", r.all.Imported}, kv{"skipped", r.all.Skipped}, kv{"variants", r.all.Variants}, kv{"refused", r.refused}, kv{"rooms", len(r.touched)}, kv{"redacted", r.all.Redacted})
	}
	if allRefused && !r.strict {
		return exitError(2) // nothing stored: nothing to repack either
	}
	return nil
}

// replayAndRepack is --repack: it replays the rooms imported, then repacks those
// replayed, as mtxdb replay and mtxdb repack would: an exported room goes in
// whole, and is laid out in walk order. stopImport ends the import's interrupt
// handling once the replay is done.
func (r *importRun) replayAndRepack(ctx context.Context, opts repackplan.Options, stopImport func()) error {
	var rooms []*roomstate.Room
	for _, id := range sortedSet(r.touched) {
		room, err := r.st.Room(ctx, id)
		if err != nil {
			return err
		}
		rooms = append(rooms, room)
	}
	tot, problems, err := replayRooms(ctx, rooms, false, r.out, nil)
	if errors.Is(err, resolver.ErrStopped) {
		fmt.Fprintf(r.errOut, "mtxdb: import --repack: interrupted while replaying: the imported events are stored and synced, and the states computed so far; run mtxdb replay --store %s to finish the replay, then %s\n", pgstore.Redacted(r.store), repackCommand(r.store, rooms, opts))
		return interruptExit()
	}
	if err != nil {
		return err
	}
	problems.print(r.out, r.asJSON)
	printLine(r.out, r.asJSON, "replay", kv{"rooms", len(rooms)}, kv{"rooms_failed", problems.count()}, kv{"events", tot.Events}, kv{"computed", tot.Computed}, kv{"rejected", tot.Rejected}, kv{"outliers", tot.Outliers}, kv{"cyclic", len(tot.Cyclic)})
	stopImport()
	// The rooms replay skipped are not planned again (their problem is printed).
	failed := problems.skipped()
	rooms = slices.DeleteFunc(rooms, func(room *roomstate.Room) bool { return failed[room.ID()] })
	defer catchInterrupts("import --repack", repackInterrupted(r.store, rooms, opts))()
	_, more, err := repackSummaryTo(ctx, r.out, r.asJSON, r.eng, rooms, opts)
	if err == nil && len(problems)+len(more) > 0 {
		return exitError(2)
	}
	return err
}

// importFlagWording rewrites the roomstate.ImportOptions fields a refusal's
// reason names as the import flags that set them.
var importFlagWording = strings.NewReplacer("ImportOptions.RoomVersion", "--room-version")

// maxRefusalLines is how many refusals of one input import prints as text; the
// rest are counted in one line (random bytes would print one line per line).
const maxRefusalLines = 100

func importFile(ctx context.Context, st *roomstate.Store, path string, opts roomstate.ImportOptions, out io.Writer) (roomstate.ImportResult, error) {
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
	return st.Import(ctx, countingReader{r, bar}, path, opts)
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
