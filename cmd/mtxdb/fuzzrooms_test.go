package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/roomstate"
)

// fuzzBaseRooms are the real rooms of FuzzImportReplayRooms's store: small, of
// three room versions (1, 6 with a fork, 9), so that an iteration imports,
// replays and verifies them in milliseconds.
var fuzzBaseRooms = []string{"room238", "room051", "room028"}

// roomPrint is what replay leaves of a room: its head (but the arrival-log chunk
// count, which follows the import's batches) and every event's state record.
type roomPrint struct {
	head   roomrecord.Head
	states map[string]roomrecord.EventState
}

func printRoom(r *roomstate.Room) (roomPrint, error) {
	p := roomPrint{head: r.Head(), states: map[string]roomrecord.EventState{}}
	p.head.LogChunks = 0
	ids, err := r.EventIDs()
	if err != nil {
		return p, fmt.Errorf("room %s: %w", r.ID(), err)
	}
	for _, id := range ids {
		es, _, err := r.EventState(id)
		if err != nil {
			return p, fmt.Errorf("room %s event %s: %w", r.ID(), id, err)
		}
		p.states[id] = es
	}
	return p, nil
}

// diff describes how p differs from want, or returns "".
func (p roomPrint) diff(want roomPrint) string {
	if fmt.Sprint(p.head) != fmt.Sprint(want.head) {
		return fmt.Sprintf("head %+v, want %+v", p.head, want.head)
	}
	if len(p.states) != len(want.states) {
		return fmt.Sprintf("%d events, want %d", len(p.states), len(want.states))
	}
	for id, w := range want.states {
		if g, ok := p.states[id]; !ok || g != w {
			return fmt.Sprintf("event %s: state %+v (stored %v), want %+v", id, g, ok, w)
		}
	}
	return ""
}

// fuzzRoomsStore imports the base rooms and, before or after them, the fuzzed
// input as the CLI's import does (KeepGoing; AnyOrder and RoomVersion as
// given), then replays every room as the CLI's replay does. It returns the
// store's rooms, the rooms the fuzzed import touched and replay's problems;
// an error is a store error (a memory store has none) or an import that
// stopped.
func fuzzRoomsStore(data []byte, first bool, opts roomstate.ImportOptions) ([]*roomstate.Room, map[string]bool, roomProblems, error) {
	ctx := context.Background()
	st := roomstate.New(packstore.NewMemStorage())
	touched := map[string]bool{}
	fuzzed := func() error {
		opts.KeepGoing = true
		res, err := st.Import(ctx, bytes.NewReader(data), "fuzz.jsonl", opts)
		for _, id := range res.Rooms {
			touched[id] = true
		}
		if err != nil {
			return fmt.Errorf("import of the fuzzed input: %w", err)
		}
		return nil
	}
	if first && data != nil {
		if err := fuzzed(); err != nil {
			return nil, nil, nil, err
		}
	}
	for _, name := range fuzzBaseRooms {
		if _, err := importFile(ctx, st, filepath.Join(room(name), "events.jsonl"), roomstate.ImportOptions{KeepGoing: true}, io.Discard); err != nil {
			return nil, nil, nil, fmt.Errorf("import %s: %w", name, err)
		}
	}
	if !first && data != nil {
		if err := fuzzed(); err != nil {
			return nil, nil, nil, err
		}
	}
	rooms, err := st.Rooms(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	_, problems, err := replayRooms(ctx, rooms, false, io.Discard, nil)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("replay: %w", err)
	}
	return rooms, touched, problems, nil
}

// fuzzReference is the base rooms' store without fuzzed input, replayed: each
// room's print by room ID, and their recorded states.
var fuzzReference = sync.OnceValues(func() (fuzzRef, error) {
	ref := fuzzRef{prints: map[string]roomPrint{}}
	rooms, _, problems, err := fuzzRoomsStore(nil, false, roomstate.ImportOptions{})
	if err != nil {
		return ref, err
	}
	if len(problems) > 0 {
		return ref, fmt.Errorf("the base rooms replay with problems: %+v", problems)
	}
	for _, r := range rooms {
		if ref.prints[r.ID()], err = printRoom(r); err != nil {
			return ref, err
		}
	}
	var dirs []string
	for _, name := range fuzzBaseRooms {
		dirs = append(dirs, room(name))
	}
	if ref.exps, err = loadExpectedDirs(dirs, io.Discard); err != nil {
		return ref, err
	}
	if len(ref.prints) != len(fuzzBaseRooms) || len(ref.exps) != len(fuzzBaseRooms) {
		return ref, fmt.Errorf("%d base rooms stored, %d recorded; want %d", len(ref.prints), len(ref.exps), len(fuzzBaseRooms))
	}
	return ref, nil
})

// fuzzRef is fuzzReference's result.
type fuzzRef struct {
	prints map[string]roomPrint
	exps   map[string][]*recorded.Expected
}

// fuzzSeeds returns PDU lines of the base rooms made into hostile input: a v1
// room's events under another room ID (the same event IDs in a second room), a
// v1 event naming itself in prev_events and one naming it, two naming each
// other, a v6 room's events reversed, a room's last event with its content
// changed, and a room imported again as it is.
func fuzzSeeds(t testing.TB) [][]byte {
	t.Helper()
	read := func(name string) []string {
		b, err := os.ReadFile(filepath.Join(room(name), "events.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	join := func(ls []string) []byte { return []byte(strings.Join(ls, "\n") + "\n") }
	v1, v6, v9 := read("room238"), read("room051"), read("room028")
	roomID := regexp.MustCompile(`"room_id":"([^"]+)"`).FindStringSubmatch(v1[0])[1]
	eventID := regexp.MustCompile(`"event_id":"([^"]+)"`)
	prev := regexp.MustCompile(`"prev_events":\[.*?\]\]`)
	last := v1[len(v1)-1]
	lastID := eventID.FindStringSubmatch(last)[1]
	withPrev := func(id, prevID string) string {
		l := prev.ReplaceAllLiteralString(last, `"prev_events":[["`+prevID+`",{"sha256":"AAAA"}]]`)
		return strings.Replace(l, lastID, id, 1)
	}
	var other []string
	for _, l := range v1 {
		other = append(other, strings.ReplaceAll(l, roomID, "!fuzzcopy:server1.test"))
	}
	reversed := slices.Clone(v6)
	slices.Reverse(reversed)
	edited := slices.Clone(v9)
	edited[len(edited)-1] = strings.Replace(edited[len(edited)-1], `"content":{`, `"content":{"fuzz":1,`, 1)
	return [][]byte{
		join(other),
		join([]string{withPrev("$self:server1.test", "$self:server1.test"), withPrev("$selfchild:server1.test", "$self:server1.test")}),
		join([]string{withPrev("$ma:server1.test", "$mb:server1.test"), withPrev("$mb:server1.test", "$ma:server1.test")}),
		join(reversed),
		join(edited[len(edited)-3:]),
		join(v9),
	}
}

// FuzzImportReplayRooms imports fuzzed PDU lines (seeded from real rooms) into a
// store beside three real rooms, as the CLI's import does, before or after them,
// and replays every room as the CLI's replay does. Whatever the input: no panic,
// no store error; and each real room the fuzzed import did not touch (no PDU of
// it placed in that room) is as in a store without the input (head, every
// event's state record), is not named in a replay problem, and verifies clean
// against its recorded states. flags: bit 0 imports the input first, bit 1
// with AnyOrder, bits 2-3 choose its RoomVersion ("", "1", "6", "10").
func FuzzImportReplayRooms(f *testing.F) {
	ctx := f.Context()
	for i, seed := range fuzzSeeds(f) {
		f.Add(seed, uint8(i%8))
	}
	f.Fuzz(func(t *testing.T, data []byte, flags uint8) {
		ref, err := fuzzReference()
		if err != nil {
			t.Fatal(err)
		}
		want, exps := ref.prints, ref.exps
		opts := roomstate.ImportOptions{AnyOrder: flags&2 != 0}
		if opts.AnyOrder {
			opts.RoomVersion = []string{"", "1", "6", "10"}[flags>>2&3]
		}
		rooms, touched, problems, err := fuzzRoomsStore(data, flags&1 != 0, opts)
		if err != nil {
			t.Fatal(err)
		}
		byID := map[string]*roomstate.Room{}
		for _, r := range rooms {
			byID[r.ID()] = r
		}
		var untouched []*roomstate.Room
		for id, w := range want {
			if touched[id] {
				continue
			}
			r, ok := byID[id]
			if !ok {
				t.Fatalf("room %s, which the input did not touch, is not in the store", id)
			}
			p, err := printRoom(r)
			if err != nil {
				t.Fatal(err)
			}
			if d := p.diff(w); d != "" {
				t.Fatalf("room %s, which the input did not touch: %s", id, d)
			}
			untouched = append(untouched, r)
		}
		for _, p := range problems {
			if _, base := want[p.room]; base && !touched[p.room] {
				t.Fatalf("replay problem in room %s, which the input did not touch: %s", p.room, p.what)
			}
		}
		uexps := map[string][]*recorded.Expected{}
		for _, r := range untouched {
			uexps[r.ID()] = exps[r.ID()]
		}
		var out bytes.Buffer
		v, err := verifyRoomsTo(ctx, untouched, uexps, &out, false)
		if err != nil || v.problems != 0 || v.mismatches != 0 || v.comparedRooms != len(untouched) {
			t.Fatalf("verify of the %d rooms the input did not touch: %+v, %v\n%s", len(untouched), v, err, out.String())
		}
	})
}
