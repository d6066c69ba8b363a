package jsonstr

import (
	"encoding/json"
	"testing"
)

// FuzzAppend: Append writes what encoding/json's Marshal writes, after what b
// held.
func FuzzAppend(f *testing.F) {
	for _, s := range []string{"", "@a:b.test", `q"\`, "\x00\x1f\t\n", "\xff\xfe", "\u00e9\u2028", "<&>"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := Append([]byte("x"), s); string(got) != "x"+string(want) {
			t.Fatalf("%q: got %s, want x%s", s, got, want)
		}
	})
}
