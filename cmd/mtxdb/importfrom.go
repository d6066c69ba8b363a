package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/pgstore"
	"github.com/mtxdb/mtxdb/repackplan"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/serverdb"
)

// fromSource opens what --from names: "synapse:PATH_OR_URL" or
// "dendrite:PATH_OR_URL" (a roomserver database). The store must be
// a directory: the recordings are written beside its rooms (recordedSubdir).
func (f *importFlags) fromSource(ctx context.Context) (serverdb.Source, func() error, string, error) {
	kind, target, ok := strings.Cut(f.from, ":")
	switch {
	case !ok || target == "":
		return nil, nil, "", fmt.Errorf("--from %q: want synapse:PATH_OR_URL or dendrite:PATH_OR_URL (a SQLite file or postgres:// URL)", f.from)
	case pgstore.IsURL(f.store):
		return nil, nil, "", fmt.Errorf("--from needs --store to be a directory: the recorded state is written to its %s/ (a PostgreSQL store has no directory)", recordedSubdir)
	case kind == "synapse":
		s, err := serverdb.OpenSynapse(ctx, target)
		if err != nil {
			return nil, nil, "", err
		}
		return s, s.Close, fmt.Sprintf("synapse (main schema %d)", s.Schema()), nil
	case kind == "dendrite":
		d, err := serverdb.OpenDendrite(ctx, target)
		if err != nil {
			return nil, nil, "", err
		}
		return d, d.Close, "dendrite", nil
	}
	return nil, nil, "", fmt.Errorf("--from %q: unknown server kind %q (synapse, dendrite)", f.from, kind)
}

// sourceLabel is --from for meta.json and messages: a URL's password masked.
func sourceLabel(from string) string {
	kind, target, _ := strings.Cut(from, ":")
	return kind + ":" + serverdb.Redact(target)
}

// importFrom imports every room of src (or --room) and writes what the server
// recorded for each into the store's recorded/ directory: a line per room and a
// total.
func (r *importRun) importFrom(ctx context.Context, src serverdb.Source, what string) error {
	rooms, err := src.Rooms(ctx)
	if err != nil {
		return err
	}
	if r.fromRoom != "" {
		var only []serverdb.Room
		for _, rm := range rooms {
			if rm.ID == r.fromRoom {
				only = append(only, rm)
			}
		}
		if len(only) == 0 {
			return fmt.Errorf("--room %s: the %s database has no such room (%d rooms)", r.fromRoom, what, len(rooms))
		}
		rooms = only
	}
	var total int64
	for _, rm := range rooms {
		total += int64(rm.Events)
	}
	bar := newProgress(r.out, total, "import "+what, false)
	ctx, cancel := context.WithCancel(ctx)
	feeds, stop := readRooms(ctx, src, rooms, sourceLabel(r.from), filepath.Join(r.store, recordedSubdir))
	results := r.importRooms(ctx, feeds, bar)
	defer func() {
		cancel()
		for result := range results {
			<-result // an import under way ends at ctx: wait, the store closes after
		}
		stop()
	}()
	states := 0
	for result := range results {
		d := <-result
		rm, res := d.room, d.res
		bar.clear()
		source := "room " + rm.ID
		r.printRefusals(source, res.Refused)
		r.refused += len(res.Refused)
		for _, e := range res.Refused {
			r.tally.add(e)
		}
		// A room whose import ended without error is whole even when the
		// interrupt came meanwhile: the room it stopped is the one after it.
		if errors.Is(d.err, errInterrupted) || (d.err != nil && interrupted()) {
			return r.interruptedIn(source, res, 0)
		}
		if d.err != nil {
			return d.err
		}
		states += d.rec.states
		r.touched[rm.ID] = true
		r.all.Read, r.all.Imported, r.all.Skipped, r.all.Variants = r.all.Read+res.Read, r.all.Imported+res.Imported, r.all.Skipped+res.Skipped, r.all.Variants+res.Variants
		r.all.Redacted += res.Redacted
		printLine(r.out, r.asJSON, "room", kv{"room", rm.ID}, kv{"version", rm.Version}, kv{"read", res.Read}, kv{"imported", res.Imported},
			kv{"skipped", res.Skipped}, kv{"refused", len(res.Refused)}, kv{"redacted", res.Redacted}, kv{"recorded_states", d.rec.states})
	}
	bar.finish()
	printLine(r.out, r.asJSON, "import", kv{"from", what}, kv{"rooms", len(rooms)}, kv{"read", r.all.Read}, kv{"imported", r.all.Imported},
		kv{"skipped", r.all.Skipped}, kv{"refused", r.refused}, kv{"redacted", r.all.Redacted}, kv{"recorded_states", states},
		kv{"recorded", filepath.Join(r.store, recordedSubdir)})
	return nil
}

// roomsAtOnce is how many rooms import --from imports at a time: the next room
// begins while the last batches of one are written and synced.
const roomsAtOnce = 2

// roomDone is one room's import and recording.
type roomDone struct {
	room serverdb.Room
	res  roomstate.ImportResult
	err  error // the import's, else the recording's
	rec  recording
}

// importRooms imports the rooms feeds brings, roomsAtOnce at a time, and
// gives each room's result on a channel of its own, in the rooms' order.
// Every import ends when ctx does.
func (r *importRun) importRooms(ctx context.Context, feeds <-chan *roomFeed, bar *progress) <-chan chan roomDone {
	order := make(chan chan roomDone, roomsAtOnce)
	slots := make(chan struct{}, roomsAtOnce)
	var mu sync.Mutex // the progress bar's
	var read int64
	go func() {
		defer close(order)
		for feed := range feeds {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			done := make(chan roomDone, 1)
			order <- done
			go func() {
				defer func() { <-slots }()
				rm, last := feed.room, 0
				opts := roomstate.ImportOptions{BatchSize: r.batch, AnyOrder: true, RoomVersion: rm.Version, KeepGoing: true,
					Progress: func(n int) {
						mu.Lock()
						read += int64(n - last)
						last = n
						bar.set(read)
						mu.Unlock()
					}}
				d := roomDone{room: rm}
				d.res, d.err = r.st.ImportPDUs(ctx, feed.next, "room "+rm.ID, opts)
				if d.err == nil {
					d.rec = <-feed.recorded
					d.err = d.rec.err
				}
				done <- d
			}()
		}
	}()
	return order
}

// roomFeed is one room as readRooms reads it: its PDUs in batches, then what
// writing its recording gave.
type roomFeed struct {
	room     serverdb.Room
	pdus     chan []roomstate.SourcePDU
	pduErr   error // the read's error, set before pdus is closed
	batch    []roomstate.SourcePDU
	recorded chan recording
}

// recording is what WriteRecording gave for a room.
type recording struct {
	states int
	err    error
}

// Read-ahead bounds: PDUs travel from the reader in batches of at most
// feedBatchPDUs PDUs or feedBatchBytes bytes, and at most feedBatches batches
// wait: 8,192 PDUs (at most 32 MiB) read ahead, so that the reader writes a
// room's recording while the room's last PDUs are imported.
const (
	feedBatchPDUs  = 256
	feedBatchBytes = 1 << 20
	feedBatches    = 32
)

// next is the room's next PDU for ImportPDUs (io.EOF after the last, or the
// read's error).
func (f *roomFeed) next() (roomstate.SourcePDU, error) {
	for len(f.batch) == 0 {
		b, ok := <-f.pdus
		if !ok {
			if f.pduErr != nil {
				return roomstate.SourcePDU{}, f.pduErr
			}
			return roomstate.SourcePDU{}, io.EOF
		}
		f.batch = b
	}
	p := f.batch[0]
	f.batch = f.batch[1:]
	return p, nil
}

// readRooms reads the rooms from src on one goroutine (the source's read
// transaction is used by nothing else), in order: a room's PDUs, then its
// recording, written into recordedDir while the room is imported. Feeds come
// in the rooms' order; stop ends the reading early and waits for it.
func readRooms(ctx context.Context, src serverdb.Source, rooms []serverdb.Room, label, recordedDir string) (<-chan *roomFeed, func()) {
	ctx, cancel := context.WithCancel(ctx)
	feeds := make(chan *roomFeed, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		defer close(feeds)
		for _, rm := range rooms {
			feed := &roomFeed{room: rm, pdus: make(chan []roomstate.SourcePDU, feedBatches), recorded: make(chan recording, 1)}
			select {
			case feeds <- feed:
			case <-ctx.Done():
				return
			}
			feed.pduErr = sendPDUs(ctx, src, rm.ID, feed.pdus)
			close(feed.pdus)
			if feed.pduErr != nil {
				feed.recorded <- recording{err: feed.pduErr}
				return
			}
			n, err := serverdb.WriteRecording(ctx, src, rm, label, filepath.Join(recordedDir, serverdb.RecordingDir(rm.ID)))
			feed.recorded <- recording{n, err}
			if err != nil {
				return
			}
		}
	}()
	return feeds, func() {
		cancel() // every send of the reader gives up on ctx
		<-finished
	}
}

// sendPDUs reads a room's PDUs from src into pdus in batches.
func sendPDUs(ctx context.Context, src serverdb.Source, roomID string, pdus chan<- []roomstate.SourcePDU) error {
	var batch []roomstate.SourcePDU
	size := 0
	send := func() error {
		select {
		case pdus <- batch:
			batch, size = nil, 0
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	err := src.PDUs(ctx, roomID, func(eventID string, pdu []byte) error {
		if interrupted() {
			return errInterrupted // the import stops at this PDU, as a file import does
		}
		batch = append(batch, roomstate.SourcePDU{EventID: eventID, JSON: pdu})
		if size += len(pdu); len(batch) >= feedBatchPDUs || size >= feedBatchBytes {
			return send()
		}
		return nil
	})
	if err == nil && len(batch) > 0 {
		err = send()
	}
	return err
}

// fromBatch is --batch with --from unless given: a database import is one long
// run, so its batches are larger (about 10 MB of PDUs, and about 100 MB more
// peak memory than 1,000) and written and synced less often. An interrupted
// import loses at most the batch it was staging.
const fromBatch = 10000

// runFrom is mtxdb import --from: the store opened (created if missing), every
// room of the server's database imported with its recording, then --repack.
func (f *importFlags) runFrom(cmd *cobra.Command, opts repackplan.Options) error {
	ctx := cmd.Context()
	if err := nonEmptyFlag(cmd, "room", f.fromRoom); err != nil {
		return err
	}
	if f.anyOrder || f.roomVersion != "" || f.keysFile != "" {
		return fmt.Errorf("--from takes each room's version from the database and imports in any order; --any-order, --room-version and --keys do not apply")
	}
	if !cmd.Flags().Changed("batch") {
		f.batch = fromBatch
	}
	src, closeSrc, what, err := f.fromSource(ctx)
	if err != nil {
		return err
	}
	defer closeSrc()
	return f.run(cmd, opts, 1, func(r *importRun) error { return r.importFrom(ctx, src, what) })
}
