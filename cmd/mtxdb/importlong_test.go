package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/pdu"
	"github.com/mtxdb/mtxdb/roomstate"
)

// TestCLIImportOverLongPDU: a PDU of 300,000 bytes (over the line limit) is
// refused as a PDU over the size limit, as one of 100,000 bytes is, and the PDUs
// after it are counted as following from that refusal, not as out of order.
func TestCLIImportOverLongPDU(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(room("room003"), "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	for _, size := range []int{100_000, 300_000} {
		var ev map[string]any
		if err := json.Unmarshal([]byte(lines[50]), &ev); err != nil {
			t.Fatal(err)
		}
		ev["content"].(map[string]any)["body"] = strings.Repeat("x", size)
		long, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		in := append(append([]string{}, lines[:50]...), string(long))
		file := filepath.Join(t.TempDir(), "events.jsonl")
		if err := os.WriteFile(file, []byte(strings.Join(append(in, lines[51:]...), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out, code := run(t, "import", "--store", filepath.Join(t.TempDir(), "s"), file)
		want := "refused only because an event they name was refused before them"
		if code != 2 || !strings.Contains(out, "line 51 (event "+ev["event_id"].(string)+"): pdu: PDU over the 65,536-byte size limit") ||
			!strings.Contains(out, fmt.Sprintf("%d %s", len(lines)-51, want)) || strings.Contains(out, "--any-order") || strings.Contains(out, "jq") {
			t.Errorf("a PDU of %d bytes: exit %d, want 2, the PDU refused for size and %d refusals following from it\n%s", size, code, len(lines)-51, lastLines(out, 3))
		}
	}
}

// TestRefusalTallyUnnamed: a PDU refused for a prev event not stored, after a
// line refused as too large whose event ID was not read, may follow from it: the
// hint says so.
func TestRefusalTallyUnnamed(t *testing.T) {
	var tally refusalTally
	tally.add(&roomstate.ImportError{Line: 1, Err: fmt.Errorf("%w: a line over the limit", pdu.ErrTooLarge)})
	tally.add(&roomstate.ImportError{Line: 2, EventID: "$b", Missing: "$a", Err: roomstate.ErrMissingPrevEvent})
	if h := tally.hint(); !strings.Contains(h, "1 refused for a prev or auth event not stored before it (the event may be one of the 1 refused as too large whose event ID could not be read)") {
		t.Errorf("hint: %s", h)
	}
}

// TestRefusalTallyRefusedAbove: PDUs refused for a missing m.room.create after a
// create refused for its unknown room version may follow from it: the hint sends
// the user to that refusal before --any-order; without one it does not.
func TestRefusalTallyRefusedAbove(t *testing.T) {
	var tally refusalTally
	tally.add(&roomstate.ImportError{Line: 1, EventID: "$create", Err: fmt.Errorf("%w: %q", pdu.ErrUnknownRoomVersion, "99")})
	tally.add(&roomstate.ImportError{Line: 2, EventID: "$b", Err: roomstate.ErrNoCreateEvent})
	if h := tally.hint(); !strings.Contains(h, "first look at the 1 refused above for another reason") {
		t.Errorf("hint: %s", h)
	}
	var plain refusalTally
	plain.add(&roomstate.ImportError{Line: 2, EventID: "$b", Missing: "$a", Err: roomstate.ErrMissingPrevEvent})
	if h := plain.hint(); strings.Contains(h, "refused above") {
		t.Errorf("hint without another refusal: %s", h)
	}
}
