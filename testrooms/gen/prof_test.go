package gen

import (
	"os"
	"strconv"
	"testing"
)

func TestProfileGen(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("GEN_PROFILE"))
	if n == 0 {
		t.Skip()
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
	t.Logf("%+v %+v", m.Counts.JoinedMembers, m.Resolution)
}
