package gen

import (
	"os"
	"strconv"
	"testing"
)

// TestProfileGen generates one room of GEN_PROFILE events (room version 10, or
// GEN_VERSION), for profiling the generator at a size the other tests do not
// reach:
//
//	GEN_PROFILE=100000 go test -run '^TestProfileGen$' -cpuprofile cpu.out ./testrooms/gen
//
// It checks that the room has the events asked for and that the reference
// implementation agreed with the generator's resolution at every event it
// checked. Without GEN_PROFILE it is skipped: the other tests cover the
// generator at small sizes, and a profile needs a size they do not run.
func TestProfileGen(t *testing.T) {
	v := os.Getenv("GEN_PROFILE")
	if v == "" {
		t.Skip("GEN_PROFILE is not set: it is the number of events of the room to generate and profile (GEN_PROFILE=100000 go test -run '^TestProfileGen$' -cpuprofile cpu.out ./testrooms/gen)")
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("GEN_PROFILE=%q: want a positive number of events", v)
	}
	o := DefaultOptions()
	o.Events, o.RoomVersion = n, "10"
	if v := os.Getenv("GEN_VERSION"); v != "" {
		o.RoomVersion = v
	}
	m, err := Generate(o, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d events, %d joined members, resolution %+v", m.Counts.Events, m.Counts.JoinedMembers, m.Resolution)
	if m.Counts.Events != n {
		t.Errorf("generated %d events, asked for %d", m.Counts.Events, n)
	}
	if ref := m.Reference; ref == nil {
		t.Error("no reference check: DefaultOptions runs one")
	} else if ref.Mismatches != 0 || ref.CurrentStateMismatchedKeys != 0 {
		t.Errorf("the reference disagrees with the generator's resolution at %d events and in %d keys of the current state; first: %v",
			ref.Mismatches, ref.CurrentStateMismatchedKeys, ref.First)
	}
}
