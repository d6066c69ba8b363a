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
	"sort"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/pgstore"
	"github.com/mtxdb/mtxdb/roomstate"
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
	if err := checkStoreURL(dir); err != nil {
		return nil, nil, err
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
	if looksLikeStore(dir) {
		if shards, _ := filepath.Glob(filepath.Join(dir, "shard-*.mtdb")); len(shards) == 0 {
			return nil, nil, fmt.Errorf("store %s has index files but no shard file: its records are lost; restore the shards, or move the directory away to start a new store", dir)
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
	opts.CacheBytes = storeCacheBytes
	opts.PreadKinds = storePreadKinds
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
		// The checkpoint, or the delta from its damaged entry on, went unused;
		// what they did not cover was scanned.
		scanned := ""
		if r.Source != "scan" && r.ScannedFrames > 0 {
			scanned = fmt.Sprintf(" and %d shard frames scanned past it", r.ScannedFrames)
		}
		fmt.Fprintf(os.Stderr, "mtxdb: warning: %s: damaged index files (%s); index rebuilt from %s%s\n",
			dir, strings.Join(why, "; "), r.Source, scanned)
	}
	if r.Source == "scan" && r.CheckpointErr == nil && r.ScannedFrames > 0 {
		// Every close writes index.ckpt: a store with frames and none lost
		// the file or crashed before its first checkpoint.
		fmt.Fprintf(os.Stderr, "mtxdb: warning: %s: no index.ckpt: index rebuilt by scanning %d frames (%d bytes) of the shards; a torn last shard cannot be told from one cut short (docs/known-limits.md)\n",
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
		// it can also be a shard cut short (docs/known-limits.md): say so.
		fmt.Fprintf(os.Stderr, "mtxdb: warning: %s: cut %d bytes of unsynced or damaged tail off %s at offset %d (index from %s)\n",
			dir, r.TruncatedBytes, r.TruncatedFile, r.TruncatedAt, r.Source)
	}
	return eng, roomstate.New(eng), nil
}

// checkStoreURL refuses a --store value that starts with a PostgreSQL scheme
// ("postgres:" or "postgresql:", any case) but is not a postgres:// or
// postgresql:// URL (postgres:/db, postgres:db, POSTGRES://...): taken as a
// directory it would become one named after the typo. The message quotes only
// the scheme as given, not what follows (it may hold a password). A directory
// so named is given as ./postgres:....
func checkStoreURL(store string) error {
	if pgstore.IsURL(store) {
		return nil
	}
	lower := strings.ToLower(store)
	for _, scheme := range []string{"postgres:", "postgresql:"} {
		if strings.HasPrefix(lower, scheme) {
			rest := store[len(scheme):]
			given := store[:len(store)-len(strings.TrimLeft(rest, "/"))] // the scheme and its slashes
			return fmt.Errorf("--store begins %q: not a PostgreSQL URL, which begins %s// in lower case (%s//[USER[:PASSWORD]@]HOST[:PORT]/DBNAME); a directory whose name begins %s is given as ./%s...",
				given, scheme, scheme, scheme, scheme)
		}
	}
	return nil
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

// onlyLock reports whether a directory's entries are a store's lock file alone
// (a store whose creation stopped before its first shard).
func onlyLock(entries []os.DirEntry) bool {
	return len(entries) == 1 && entries[0].Name() == "LOCK"
}

// looksLikeStore reports whether dir holds a packstore's files: shard files or
// index files. Commands other than import and demo refuse anything else, rather
// than turning a mistyped directory into a store.
func looksLikeStore(dir string) bool {
	for _, pat := range []string{"shard-*.mtdb", "index.ckpt", "index.delta"} {
		if m, _ := filepath.Glob(filepath.Join(dir, pat)); len(m) > 0 {
			return true
		}
	}
	return false
}

// storeCacheBytes is packstore.Options.CacheBytes of the stores the commands
// open: packstore's default, but for replay (replayCacheBytes).
var storeCacheBytes int64 = packstore.DefaultCacheBytes

// storePreadKinds is packstore.Options.PreadKinds of the stores the commands
// open: none, but for replay (replayPreadKinds).
var storePreadKinds []packstore.ReadKind

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

// noArgs refuses positional arguments for commands that take none, naming them
// (cobra's own check calls an argument an unknown command).
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("%s takes no arguments, got %q: options are flags (mtxdb %s --help)", cmd.Name(), strings.Join(args, " "), cmd.Name())
	}
	return nil
}

// sortedSet returns the keys of m in ascending order.
func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// openRoomsAndErrors opens an existing store and selects every room, or the
// one named. For every room it goes on past the room collections whose head it
// cannot read and returns them (bad): the commands report each as a problem
// (printHeadProblems) and go on with the other rooms.
func openRoomsAndErrors(ctx context.Context, store, roomID string, readOnly bool) (storeEngine, []*roomstate.Room, []*roomstate.HeadError, error) {
	eng, st, err := openStoreMode(store, false, readOnly)
	if err != nil {
		return nil, nil, nil, err
	}
	rooms, bad, err := selectRoomsAndErrors(ctx, st, roomID)
	if err != nil {
		eng.Close()
		return nil, nil, nil, err
	}
	return eng, rooms, bad, nil
}

// selectRoomsAndErrors is selectRooms going on past the room collections whose
// head it cannot read when it selects every room: those come back as bad.
func selectRoomsAndErrors(ctx context.Context, st *roomstate.Store, roomID string) ([]*roomstate.Room, []*roomstate.HeadError, error) {
	if roomID == "" {
		return st.RoomsAndErrors(ctx)
	}
	rooms, err := selectRooms(ctx, st, roomID)
	return rooms, nil, err
}

// selectRooms returns every room, or the one named.
func selectRooms(ctx context.Context, st *roomstate.Store, roomID string) ([]*roomstate.Room, error) {
	if roomID != "" {
		r, err := st.Room(ctx, roomID)
		if err != nil {
			return nil, err
		}
		return []*roomstate.Room{r}, nil
	}
	return st.Rooms(ctx)
}

// printHeadProblems prints a problem line for each room collection whose head
// record cannot be read (bad, from openRoomsAndErrors), ending in what the
// command leaves undone ("the room is not replayed"), and returns how many.
func printHeadProblems(out io.Writer, asJSON bool, bad []*roomstate.HeadError, undone string) int {
	for _, h := range bad {
		printProblem(out, asJSON, "", h.Error()+": "+undone)
	}
	return len(bad)
}

// nonEmptyFlag refuses a flag given with an empty or blank value (--room ”),
// which would otherwise mean "every room".
func nonEmptyFlag(c *cobra.Command, name, value string) error {
	if c.Flags().Changed(name) && strings.TrimSpace(value) == "" {
		return fmt.Errorf("--%s is empty; give a room ID, or leave the flag out for every room", name)
	}
	return nil
}

// keysOf returns the key set of m.
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
