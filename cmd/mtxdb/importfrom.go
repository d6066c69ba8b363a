package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

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

// source2 is --from for meta.json and messages: a URL's password masked.
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
	states := 0
	var done int64
	for _, rm := range rooms {
		opts := roomstate.ImportOptions{BatchSize: r.batch, AnyOrder: true, RoomVersion: rm.Version, KeepGoing: true,
			Progress: func(read int) { bar.set(done + int64(read)) }}
		res, err := importRoomPDUs(ctx, r.st, src, rm.ID, opts)
		done += int64(rm.Events)
		bar.clear()
		source := "room " + rm.ID
		r.printRefusals(source, res.Refused)
		r.refused += len(res.Refused)
		for _, e := range res.Refused {
			r.tally.add(e)
		}
		if errors.Is(err, errInterrupted) || interrupted() {
			return r.interruptedIn(source, res, 0)
		}
		if err != nil {
			return err
		}
		n, err := serverdb.WriteRecording(ctx, src, rm, sourceLabel(r.from), filepath.Join(r.store, recordedSubdir, serverdb.RecordingDir(rm.ID)))
		if err != nil {
			return err
		}
		states += n
		r.touched[rm.ID] = true
		r.all.Read, r.all.Imported, r.all.Skipped, r.all.Variants = r.all.Read+res.Read, r.all.Imported+res.Imported, r.all.Skipped+res.Skipped, r.all.Variants+res.Variants
		r.all.Redacted += res.Redacted
		printLine(r.out, r.asJSON, "room", kv{"room", rm.ID}, kv{"version", rm.Version}, kv{"read", res.Read}, kv{"imported", res.Imported},
			kv{"skipped", res.Skipped}, kv{"refused", len(res.Refused)}, kv{"redacted", res.Redacted}, kv{"recorded_states", n})
	}
	bar.finish()
	printLine(r.out, r.asJSON, "import", kv{"from", what}, kv{"rooms", len(rooms)}, kv{"read", r.all.Read}, kv{"imported", r.all.Imported},
		kv{"skipped", r.all.Skipped}, kv{"refused", r.refused}, kv{"redacted", r.all.Redacted}, kv{"recorded_states", states},
		kv{"recorded", filepath.Join(r.store, recordedSubdir)})
	return nil
}

// withEventID returns a PDU that carries the event ID its server's database
// names it by: as it is when it has an event_id field (room versions 1 and 2
// store one), else with a top-level event_id added, which import checks against
// the reference hash (pdu.ErrEventIDMismatch refuses a PDU whose content no
// longer gives the ID the server knows it by).
func withEventID(pdu []byte, eventID string) []byte {
	trimmed := bytes.TrimLeft(pdu, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' || hasTopLevelKey(trimmed, "event_id") {
		return pdu
	}
	id, _ := json.Marshal(eventID)
	out := make([]byte, 0, len(trimmed)+len(id)+16)
	out = append(out, `{"event_id":`...)
	out = append(out, id...)
	rest := bytes.TrimLeft(trimmed[1:], " \t\r\n")
	if len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, rest...)
}

// hasTopLevelKey reports whether the JSON object obj has key at its top level
// (false for JSON that does not decode: import refuses it then).
func hasTopLevelKey(obj []byte, key string) bool {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return false
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return false
		}
		if t == key {
			return true
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return false
		}
	}
	return false
}

// importRoomPDUs streams a room's PDUs from src into the store as JSON lines.
func importRoomPDUs(ctx context.Context, st *roomstate.Store, src serverdb.Source, roomID string, opts roomstate.ImportOptions) (roomstate.ImportResult, error) {
	pr, pw := io.Pipe()
	go func() {
		w := bufio.NewWriterSize(pw, 1<<20)
		err := src.PDUs(ctx, roomID, func(eventID string, pdu []byte) error {
			if interrupted() {
				return errInterrupted // Import stops at this read, as a file import does
			}
			if _, err := w.Write(withEventID(pdu, eventID)); err != nil {
				return err
			}
			return w.WriteByte('\n')
		})
		if err == nil {
			err = w.Flush()
		}
		pw.CloseWithError(err)
	}()
	res, err := st.Import(ctx, pr, "room "+roomID, opts)
	pr.CloseWithError(io.ErrClosedPipe) // ends the writer if Import stopped early
	return res, err
}

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
	src, closeSrc, what, err := f.fromSource(ctx)
	if err != nil {
		return err
	}
	defer closeSrc()
	return f.run(cmd, opts, 1, func(r *importRun) error { return r.importFrom(ctx, src, what) })
}
