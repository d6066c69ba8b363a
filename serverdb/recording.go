package serverdb

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/mtxdb/mtxdb/internal/jsonstr"
	"github.com/mtxdb/mtxdb/recorded"
)

// Source is a server's database as import --from reads it: OpenSynapse's.
type Source interface {
	Rooms(ctx context.Context) ([]Room, error)
	PDUs(ctx context.Context, roomID string, fn func(eventID string, pdu []byte) error) error
	// RecordedGroups calls group for each state group the first time an event
	// names it or a group builds on it (before that), then event for each event
	// with a recorded state, in the server's order.
	RecordedGroups(ctx context.Context, roomID string, group func(recorded.Group) error, event func(eventID string, group int64) error) error
	CurrentState(ctx context.Context, roomID string) (map[string]string, error)
	ForwardExtremities(ctx context.Context, roomID string) ([]string, error)
}

// RecordingDir is the directory name under which a room's recording is written:
// the room ID with every byte but ASCII letters, digits, '.', '-' and '_'
// replaced by '_' (room IDs are "!opaque:server"), which keeps distinct room IDs
// apart in practice; WriteRecording's meta.json names the room exactly.
func RecordingDir(roomID string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
			return r
		}
		return '_'
	}, roomID)
}

// WriteRecording writes what the server recorded for a room into dir, as
// package recorded reads it: state_groups.jsonl (each state group once, as its
// differences from an earlier one: recorded.Group), expected_state.jsonl (a
// line per event with a recorded state, in the server's order: {"event_id",
// "state_group"}), current_state.json and meta.json (room_id, room_version,
// forward_extremities, counts.events, expected_state.lines, source). It
// returns the number of states written. The files are written to dir.tmp and
// renamed, so a failed run leaves no partial recording at dir.
func WriteRecording(ctx context.Context, src Source, room Room, source, dir string) (int, error) {
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return 0, err
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return 0, err
	}
	states, err := writeStates(ctx, src, room.ID, tmp)
	if err != nil {
		os.RemoveAll(tmp)
		return 0, err
	}
	cur, err := src.CurrentState(ctx, room.ID)
	if err == nil {
		err = writeJSON(filepath.Join(tmp, "current_state.json"), cur)
	}
	var fwd []string
	if err == nil {
		fwd, err = src.ForwardExtremities(ctx, room.ID)
	}
	if err == nil {
		meta := map[string]any{
			"room_id": room.ID, "room_version": room.Version, "forward_extremities": fwd,
			"counts":         map[string]int{"events": room.Events},
			"expected_state": map[string]int{"lines": states},
			"source":         source,
		}
		if fwd == nil {
			meta["forward_extremities"] = []string{}
		}
		err = writeJSON(filepath.Join(tmp, "meta.json"), meta)
	}
	if err == nil {
		if err = os.RemoveAll(dir); err == nil {
			err = os.Rename(tmp, dir)
		}
	}
	if err != nil {
		os.RemoveAll(tmp)
		return 0, fmt.Errorf("serverdb: recording of room %s in %s: %w", room.ID, dir, err)
	}
	return states, nil
}

func writeStates(ctx context.Context, src Source, roomID, dir string) (int, error) {
	var files [2]*os.File
	var ws [2]*bufio.Writer
	for i, name := range []string{"state_groups.jsonl", "expected_state.jsonl"} {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return 0, err
		}
		defer f.Close()
		files[i], ws[i] = f, bufio.NewWriterSize(f, 1<<20)
	}
	var buf []byte
	n := 0
	err := src.RecordedGroups(ctx, roomID, func(g recorded.Group) error {
		buf = appendGroup(buf[:0], g)
		_, err := ws[0].Write(buf)
		return err
	}, func(eventID string, group int64) error {
		n++
		buf = append(jsonstr.Append(append(buf[:0], `{"event_id":`...), eventID), `,"state_group":`...)
		buf = append(strconv.AppendInt(buf, group, 10), "}\n"...)
		_, err := ws[1].Write(buf)
		return err
	})
	for i := range files {
		if err == nil {
			err = ws[i].Flush()
		}
		if err == nil {
			err = files[i].Sync()
		}
	}
	return n, err
}

// appendGroup appends g as a JSON line, as encoding/json writes a
// recorded.Group (its keys in order, set's keys sorted), without reflection.
func appendGroup(b []byte, g recorded.Group) []byte {
	b = strconv.AppendInt(append(b, `{"state_group":`...), g.ID, 10)
	if g.Prev != 0 {
		b = strconv.AppendInt(append(b, `,"prev_state_group":`...), g.Prev, 10)
	}
	if len(g.Set) > 0 {
		b = append(b, `,"set":{`...)
		for i, k := range slices.Sorted(maps.Keys(g.Set)) {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(jsonstr.Append(b, k), ':')
			b = jsonstr.Append(b, g.Set[k])
		}
		b = append(b, '}')
	}
	if len(g.Removed) > 0 {
		b = append(b, `,"removed":[`...)
		for i, k := range g.Removed {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonstr.Append(b, k)
		}
		b = append(b, ']')
	}
	return append(b, "}\n"...)
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
