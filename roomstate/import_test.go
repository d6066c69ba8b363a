package roomstate_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/pdu"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/roomstate/roomstatetest"
	"github.com/mtxdb/mtxdb/testrooms"
)

// roomLines returns the PDU lines of a bundled real room.
func roomLines(t *testing.T, room string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(testrooms.Dir(), "real", room, "events.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	require.NoError(t, sc.Err())
	return lines
}

// TestImportBadInput feeds import a file whose line 6 is bad in one way per row and
// requires a named error with the line and event, the five good events before it kept
// after a reopen, and a clean re-import of the corrected file.
func TestImportBadInput(t *testing.T) {
	ctx := t.Context()
	good := roomLines(t, "room002")[:12]
	var roomID string
	for _, tc := range []struct {
		name    string
		lines   func() []string
		line    int
		want    error
		eventIn string // substring the error must name
	}{
		{"malformed json", func() []string {
			l := append([]string(nil), good...)
			l[5] = `{"type": "m.room.message", "content": {`
			return l
		}, 6, pdu.ErrMalformedPDU, ""},
		{"not a pdu", func() []string {
			l := append([]string(nil), good...)
			l[5] = `{"type": "m.room.message", "room_id": "` + "!x:y" + `"}`
			return l
		}, 6, roomstate.ErrNoCreateEvent, ""},
		{"missing prev_event", func() []string {
			l := append([]string(nil), good[:5]...)
			return append(l, good[6:]...) // line 6 is now good[6], whose prev was dropped
		}, 6, roomstate.ErrMissingPrevEvent, "$"},
		{"event_id mismatch", func() []string {
			l := append([]string(nil), good...)
			l[5] = strings.Replace(l[5], `"event_id":"$`, `"event_id":"$X`, 1)
			return l
		}, 6, pdu.ErrEventIDMismatch, "$X"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			eng, st := roomstatetest.Open(t, dir)
			in := strings.Join(tc.lines(), "\n") + "\n"
			res, err := st.Import(ctx, strings.NewReader(in), "bad.jsonl", roomstate.ImportOptions{BatchSize: 2})
			require.Error(t, err)
			require.True(t, errors.Is(err, tc.want), "got %v, want %v", err, tc.want)
			var ie *roomstate.ImportError
			require.True(t, errors.As(err, &ie))
			require.Equal(t, tc.line, ie.Line, "line in %v", err)
			require.Contains(t, err.Error(), "bad.jsonl line 6")
			if tc.eventIn != "" {
				require.Contains(t, ie.EventID, tc.eventIn)
				require.Contains(t, err.Error(), ie.EventID)
			}
			require.Equal(t, 5, res.Imported)
			require.NoError(t, eng.Close())

			// The store reopens with the five events before the bad line.
			eng, st = roomstatetest.Open(t, dir)
			defer eng.Close()
			rooms, err := st.Rooms(ctx)
			require.NoError(t, err)
			require.Len(t, rooms, 1)
			roomID = rooms[0].ID()
			ids, err := rooms[0].EventIDs()
			require.NoError(t, err)
			require.Len(t, ids, 5)
			_, err = rooms[0].Check(ctx, nil)
			require.NoError(t, err)

			// Re-importing the good file skips what is there and adds the rest.
			res, err = st.Import(ctx, strings.NewReader(strings.Join(good, "\n")), "good.jsonl", roomstate.ImportOptions{})
			require.NoError(t, err)
			require.Equal(t, 5, res.Skipped)
			require.Equal(t, len(good)-5, res.Imported)
		})
	}
	require.NotEmpty(t, roomID)
}

// TestImportMalformedNamesEventID: a malformed line is refused under the event ID
// it carries when one can be read: a top-level event_id read before or after the
// field that broke the header, one in JSON cut short, a v1 event whose body does
// not parse; a v10 event without event_id is named by its reference hash; an
// event_id nested in content names nothing.
func TestImportMalformedNamesEventID(t *testing.T) {
	ctx := t.Context()
	v1 := roomLines(t, "room003")[:6] // room version 1: every PDU carries event_id
	const id = "$154714264912SGfjg:server1.test"
	require.Contains(t, v1[5], `"event_id":"`+id+`"`)
	v10 := roomLines(t, "room002")[:6]
	noID := regexp.MustCompile(`"event_id":"[^"]*",`)
	for _, tc := range []struct {
		name string
		base []string
		bad  func(l string) string
		want string // the refusal's event ID; "ref" for the line's reference hash
	}{
		{"header field after event_id", v1, func(l string) string {
			return strings.Replace(l, `"sender":"`, `"sender":7,"x":"`, 1)
		}, id},
		{"header field before event_id", v1, func(l string) string {
			return `{"room_id":5,` + l[1:]
		}, id},
		{"cut short", v1, func(l string) string { return l[:len(l)-40] }, id},
		{"v1 body", v1, func(l string) string {
			return strings.Replace(l, `"depth":`, `"depth":"x","d":`, 1)
		}, id},
		{"v10 body", v10, func(l string) string {
			return strings.Replace(noID.ReplaceAllString(l, ""), `"depth":`, `"depth":"x","d":`, 1)
		}, "ref"},
		{"nested only", v1, func(l string) string {
			return `{"content":{"event_id":"$nested:x"},"type":"m.room.message"`
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lines := append([]string(nil), tc.base...)
			lines[5] = tc.bad(lines[5])
			st := roomstate.New(packstore.NewMemStorage())
			res, err := st.Import(ctx, strings.NewReader(strings.Join(lines, "\n")), "bad.jsonl", roomstate.ImportOptions{KeepGoing: true})
			require.NoError(t, err)
			require.Equal(t, 5, res.Imported)
			require.Len(t, res.Refused, 1)
			r := res.Refused[0]
			require.ErrorIs(t, r, pdu.ErrMalformedPDU)
			want := tc.want
			if want == "ref" {
				verImpl, err := gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersionV10)
				require.NoError(t, err)
				want = pdu.ReferenceEventID(verImpl, []byte(lines[5]))
				require.NotEmpty(t, want)
			}
			require.Equal(t, want, r.EventID, "%v", r)
			if want != "" {
				require.Contains(t, r.Error(), "bad.jsonl line 6 (event "+want+"): ")
			}
		})
	}
}

// TestImportUnknownRoomVersion: a create event naming a room version nobody knows is
// refused with the line and event, and nothing is stored.
func TestImportUnknownRoomVersion(t *testing.T) {
	ctx := t.Context()
	lines := roomLines(t, "room002")[:3]
	lines[0] = strings.Replace(lines[0], `"room_version":"10"`, `"room_version":"99"`, 1)
	require.Contains(t, lines[0], `"99"`)
	eng, st := roomstatetest.Open(t, t.TempDir())
	defer eng.Close()
	_, err := st.Import(ctx, strings.NewReader(strings.Join(lines, "\n")), "v99.jsonl", roomstate.ImportOptions{})
	require.ErrorIs(t, err, pdu.ErrUnknownRoomVersion)
	require.Contains(t, err.Error(), "v99.jsonl line 1 (event $")
	require.Contains(t, err.Error(), `"99"`)
	rooms, err := st.Rooms(ctx)
	require.NoError(t, err)
	require.Empty(t, rooms)
}

// TestImportNonIntegerNumber: a number v6+ does not allow in a PDU (a fraction,
// an exponent, -0, beyond 2^53-1) is refused with a reason that says so
// (gomatrixserverlib's own is "value is outside of safe range" for all of them).
func TestImportNonIntegerNumber(t *testing.T) {
	ctx := t.Context()
	for _, n := range []string{"1.5", "1e3", "-0", "9007199254740992"} {
		lines := roomLines(t, "room002")[:2] // v10: the create event and the creator's join
		require.Contains(t, lines[1], `"membership":"join"`)
		lines[1] = strings.Replace(lines[1], `"membership":"join"`, `"membership":"join","n":`+n, 1)
		eng, st := roomstatetest.Open(t, t.TempDir())
		_, err := st.Import(ctx, strings.NewReader(strings.Join(lines, "\n")), "n.jsonl", roomstate.ImportOptions{})
		eng.Close()
		require.ErrorIs(t, err, pdu.ErrMalformedPDU, n)
		require.Contains(t, err.Error(), "n.jsonl line 2", n)
		require.Contains(t, err.Error(), "a number that room version 10 does not allow", n)
	}
}

// TestImportJSONArray: the same PDUs as one JSON array import alike, and an error
// names the array element.
func TestImportJSONArray(t *testing.T) {
	ctx := t.Context()
	lines := roomLines(t, "room002")[:8]
	eng, st := roomstatetest.Open(t, t.TempDir())
	defer eng.Close()
	arr := "[" + strings.Join(lines, ",\n") + "]"
	res, err := st.Import(ctx, strings.NewReader(arr), "arr.json", roomstate.ImportOptions{})
	require.NoError(t, err)
	require.Equal(t, 8, res.Imported)

	bad := "[" + strings.Join(append(append([]string(nil), lines...), `{"type":1}`), ",") + "]"
	_, err = st.Import(ctx, bytes.NewReader([]byte(bad)), "arr.json", roomstate.ImportOptions{})
	require.ErrorIs(t, err, pdu.ErrMalformedPDU)
	require.Contains(t, err.Error(), "arr.json element 9")

	// A broken end is an error, not a silent stop (a second array's events are
	// not dropped with exit 0).
	for name, in := range map[string]string{
		"no closing ]":   "[" + strings.Join(lines[:3], ","),
		"trailing bytes": "[" + strings.Join(lines[:3], ",") + "]garbage",
		"second array":   "[" + strings.Join(lines[:3], ",") + "] [" + lines[3] + "]",
	} {
		e, st := roomstatetest.Open(t, t.TempDir())
		_, err := st.Import(ctx, strings.NewReader(in), "arr.json", roomstate.ImportOptions{})
		e.Close()
		require.ErrorIs(t, err, pdu.ErrMalformedPDU, name)
	}
	// Keeping going, an element that cannot be decoded is read and refused, so
	// the counts add up (every refused element is counted as read).
	e3, st3 := roomstatetest.Open(t, t.TempDir())
	res, err = st3.Import(ctx, strings.NewReader("["+strings.Join(lines[:2], ",")+`,{"type":"x","bad":[1,2`), "cut.json", roomstate.ImportOptions{KeepGoing: true})
	e3.Close()
	require.NoError(t, err)
	require.Equal(t, 3, res.Read)
	require.Equal(t, 2, res.Imported)
	require.Len(t, res.Refused, 1)
	require.Contains(t, res.Refused[0].Error(), "cut.json element 3")

	e2, st2 := roomstatetest.Open(t, t.TempDir())
	defer e2.Close()
	_, err = st2.Import(ctx, strings.NewReader("["+strings.Join(lines[:3], ",")+"]\n \n"), "arr.json", roomstate.ImportOptions{})
	require.NoError(t, err, "white space after the array")
}

// TestImportV1Identity: a v1 PDU must name itself; reusing a stored v1 event ID with
// a different content hash is refused; a byte-identical duplicate is skipped.
func TestImportV1Identity(t *testing.T) {
	ctx := t.Context()
	lines := roomLines(t, "room003")[:6]
	eng, st := roomstatetest.Open(t, t.TempDir())
	defer eng.Close()
	_, err := st.Import(ctx, strings.NewReader(strings.Join(lines[:5], "\n")), "v1", roomstate.ImportOptions{})
	require.NoError(t, err)

	noID := strings.Replace(lines[5], `"event_id":`, `"x_event_id":`, 1)
	_, err = st.Import(ctx, strings.NewReader(noID), "noid", roomstate.ImportOptions{})
	require.ErrorIs(t, err, pdu.ErrMalformedPDU)
	require.Contains(t, err.Error(), "event_id")

	i := strings.Index(lines[4], `"hashes":{"sha256":"`)
	require.Positive(t, i)
	j := i + len(`"hashes":{"sha256":"`)
	other := lines[4][:j] + "A" + lines[4][j+1:]
	_, err = st.Import(ctx, strings.NewReader(other), "dup", roomstate.ImportOptions{})
	require.ErrorIs(t, err, roomstate.ErrConflictingEvent)

	res, err := st.Import(ctx, strings.NewReader(lines[4]), "same", roomstate.ImportOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, res.Skipped)
}

// FuzzImport feeds import arbitrary input (JSON lines or a JSON array, seeded with
// real PDUs): it may refuse it, but only with an error, never a panic, and every
// event it reports imported must be readable afterwards.
func FuzzImport(f *testing.F) {
	ctx := f.Context()
	lines := roomLines(&testing.T{}, "room002")[:4]
	f.Add([]byte(strings.Join(lines, "\n")))
	f.Add([]byte("[" + strings.Join(lines, ",") + "]"))
	f.Add([]byte("[" + lines[0] + "] [" + lines[1] + "]"))
	f.Add([]byte(`{"type":"m.room.create"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		// Keeping going: no error from a memory store, and every PDU read is
		// imported, skipped or refused (plus at most one refusal of a JSON
		// array's broken end, which is not a PDU).
		kg := roomstate.New(packstore.NewMemStorage())
		kres, err := kg.Import(ctx, bytes.NewReader(data), "fuzz", roomstate.ImportOptions{KeepGoing: true})
		if err != nil {
			t.Fatalf("KeepGoing import: %v", err)
		}
		if n := kres.Imported + kres.Skipped + len(kres.Refused); n < kres.Read || n > kres.Read+1 {
			t.Fatalf("read %d, imported %d, skipped %d, refused %d", kres.Read, kres.Imported, kres.Skipped, len(kres.Refused))
		}
		for _, r := range kres.Refused {
			if r.Line <= 0 {
				t.Fatalf("refusal without a line: %v", r)
			}
		}
		st := roomstate.New(packstore.NewMemStorage())
		res, err := st.Import(ctx, bytes.NewReader(data), "fuzz", roomstate.ImportOptions{AnyOrder: true, RoomVersion: "10"})
		if err != nil && res.Imported == 0 {
			return
		}
		for _, id := range res.Rooms {
			room, err := st.Room(ctx, id)
			if err != nil {
				t.Fatalf("room %s reported imported: %v", id, err)
			}
			ids, err := room.EventIDs()
			if err != nil {
				t.Fatalf("room %s: %v", id, err)
			}
			for _, e := range ids {
				if _, err := room.Event(e); err != nil {
					t.Fatalf("event %s reported imported: %v", e, err)
				}
			}
		}
	})
}

// TestImportCountsRedacted: a PDU whose content no longer matches its content hash
// (a field added to the last event's content; its event ID, the reference hash of
// the redacted form, stays the same) is stored in redacted form, as the spec says,
// and counted: ImportResult.Redacted is 1, and the stored event is the redacted one.
func TestImportCountsRedacted(t *testing.T) {
	ctx := t.Context()
	lines := roomLines(t, "room002")
	var last map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &last))
	last["content"].(map[string]any)["zz_added"] = "after signing"
	b, err := json.Marshal(last)
	require.NoError(t, err)
	lines[len(lines)-1] = string(b)

	eng, st := roomstatetest.Open(t, t.TempDir())
	defer eng.Close()
	res, err := st.Import(ctx, strings.NewReader(strings.Join(lines, "\n")), "room002-edited", roomstate.ImportOptions{})
	require.NoError(t, err)
	require.Equal(t, len(lines), res.Imported)
	require.Equal(t, 1, res.Redacted)
	room, err := st.Room(ctx, res.Rooms[0])
	require.NoError(t, err)
	meta, err := room.Meta(last["event_id"].(string))
	require.NoError(t, err)
	require.True(t, meta.Redacted)
	pdu, err := room.Event(last["event_id"].(string))
	require.NoError(t, err)
	require.NotContains(t, string(pdu.Content()), "zz_added")

	// The untouched room: nothing redacted.
	eng2, st2 := roomstatetest.Open(t, t.TempDir())
	defer eng2.Close()
	res, err = st2.Import(ctx, strings.NewReader(strings.Join(roomLines(t, "room002"), "\n")), "room002", roomstate.ImportOptions{})
	require.NoError(t, err)
	require.Zero(t, res.Redacted)
}
