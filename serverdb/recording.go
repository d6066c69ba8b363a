package serverdb

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Source is a server's database as import --from reads it: OpenSynapse's.
type Source interface {
	Rooms(ctx context.Context) ([]Room, error)
	PDUs(ctx context.Context, roomID string, fn func(eventID string, pdu []byte) error) error
	RecordedState(ctx context.Context, roomID string, fn func(eventID string, group int64, state map[string]string) error) error
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
// package recorded reads it: expected_state.jsonl (a line per event with a
// state group, in stream order: {"event_id", "state_group", "state"}),
// current_state.json and meta.json (room_id, room_version,
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
	states, err := writeStates(ctx, src, room.ID, filepath.Join(tmp, "expected_state.jsonl"))
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

func writeStates(ctx context.Context, src Source, roomID, path string) (int, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	enc := json.NewEncoder(w)
	n := 0
	err = src.RecordedState(ctx, roomID, func(eventID string, group int64, state map[string]string) error {
		n++
		return enc.Encode(struct {
			EventID    string            `json:"event_id"`
			StateGroup int64             `json:"state_group"`
			State      map[string]string `json:"state"`
		}{eventID, group, state})
	})
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		err = f.Sync()
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
