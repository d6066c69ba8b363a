package serverdb

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

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
	groups, lines := json.NewEncoder(ws[0]), json.NewEncoder(ws[1])
	n := 0
	err := src.RecordedGroups(ctx, roomID, func(g recorded.Group) error {
		return groups.Encode(g)
	}, func(eventID string, group int64) error {
		n++
		return lines.Encode(struct {
			EventID    string `json:"event_id"`
			StateGroup int64  `json:"state_group"`
		}{eventID, group})
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

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
