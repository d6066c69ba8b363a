package recorded

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/testrooms"
)

// TestOpenStreamsLikeLoad: Compare against a streamed recording
// (Open) finds what it finds against a loaded one, on a real room and
// on a copy whose recorded state was edited in one line; a line that does not
// decode fails the comparison naming the file and line.
func TestOpenStreamsLikeLoad(t *testing.T) {
	ctx := t.Context()
	src := filepath.Join(testrooms.Dir(), "real", "room003")
	room, err := testrooms.ImportReplayed(packstore.NewMemStorage(), src)
	if err != nil {
		t.Fatal(err)
	}
	edited := copyWithExpectedEdit(t, src, func(lines []string) {
		i := len(lines) / 2
		if !strings.Contains(lines[i], `"$`) {
			t.Fatalf("line %d of room003's expected_state.jsonl names no event: %q", i+1, lines[i])
		}
		lines[i] = strings.Replace(lines[i], `"$`, `"$edited`, 1)
	})
	for _, dir := range []string{src, edited} {
		loaded, err := Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		opened, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		if opened.After != nil || opened.States != loaded.States || loaded.States != len(loaded.After) {
			t.Fatalf("%s: Open holds %d states (count %d), Load %d (count %d)", dir, len(opened.After), opened.States, len(loaded.After), loaded.States)
		}
		var mA, mB []string
		a, err := Compare(ctx, room, loaded, func(m Mismatch) { mA = append(mA, m.String()) })
		if err != nil {
			t.Fatal(err)
		}
		b, err := Compare(ctx, room, opened, func(m Mismatch) { mB = append(mB, m.String()) })
		if err != nil {
			t.Fatal(err)
		}
		if a != b || strings.Join(mA, "\n") != strings.Join(mB, "\n") {
			t.Fatalf("%s: loaded %+v %q, streamed %+v %q", dir, a, mA, b, mB)
		}
		if want := dir == edited; (a.Mismatches > 0) != want || a.Events == 0 {
			t.Fatalf("%s: %+v (mismatches expected: %v)", dir, a, want)
		}
	}
	// Damage a line after opening: the streamed comparison reports it.
	opened, err := Open(edited)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(edited, "expected_state.jsonl")
	b, _ := os.ReadFile(p)
	if err := os.WriteFile(p, append([]byte("{not json\n"), b...), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Compare(ctx, room, opened, func(Mismatch) {}); err == nil || !strings.Contains(err.Error(), "expected_state.jsonl line 1") {
		t.Fatalf("Compare over a damaged file: %v", err)
	}
}

// TestCompareEventRecordedTwice: a recording in which one line is replaced by a
// copy of the line before it (same number of lines, one event's state lost) is a
// mismatch naming the event and both states, loaded or streamed.
func TestCompareEventRecordedTwice(t *testing.T) {
	ctx := t.Context()
	src := filepath.Join(testrooms.Dir(), "real", "room003")
	room, err := testrooms.ImportReplayed(packstore.NewMemStorage(), src)
	if err != nil {
		t.Fatal(err)
	}
	dir := copyWithExpectedEdit(t, src, func(lines []string) { lines[21] = lines[20] })
	for _, open := range []func(string) (*Expected, error){Load, Open} {
		exp, err := open(dir)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		res, err := Compare(ctx, room, exp, func(m Mismatch) { got = append(got, m.String()) })
		if err != nil {
			t.Fatal(err)
		}
		if res.Mismatches != 1 || len(got) != 1 || !strings.Contains(got[0], "recorded twice: states 21 and 22") {
			t.Errorf("%d mismatches %q, want one naming states 21 and 22", res.Mismatches, got)
		}
	}
}

// copyWithExpectedEdit copies a room directory's recording (expected_state.jsonl,
// current_state.json, meta.json) to a temporary directory, edit changing the
// lines of expected_state.jsonl, and returns the copy.
func copyWithExpectedEdit(t *testing.T, src string, edit func(lines []string)) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"expected_state.jsonl", "current_state.json", "meta.json"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "expected_state.jsonl" {
			lines := strings.Split(string(b), "\n")
			edit(lines)
			b = []byte(strings.Join(lines, "\n"))
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
