package serverdb

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestParseNIDs: both forms Dendrite stores lists of NIDs in, and what is
// neither refused.
func TestParseNIDs(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []int64
		ok   bool
	}{
		{"[]", nil, true},
		{"[1,2,30]", []int64{1, 2, 30}, true},
		{" [7] ", []int64{7}, true},
		{"{}", nil, true},
		{"{1,2,30}", []int64{1, 2, 30}, true},
		{"{ 4 , 5 }", []int64{4, 5}, true},
		{"", nil, false},
		{"1,2", nil, false},
		{"[1,", nil, false},
		{"{1,x}", nil, false},
		{"{1", nil, false},
		{`["1"]`, nil, false},
	} {
		got, err := parseNIDs(c.in)
		if (err == nil) != c.ok || (c.ok && !slices.Equal(got, c.want)) {
			t.Errorf("parseNIDs(%q) = %v, %v; want %v (ok %v)", c.in, got, err, c.want, c.ok)
		}
	}
}

// FuzzParseNIDs: any input is a list or an error, never a panic; a list
// printed back in either form parses to itself.
func FuzzParseNIDs(f *testing.F) {
	for _, s := range []string{"[]", "[1,2]", "{3,4}", "{", "[9223372036854775807]", "{-1}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseNIDs(s)
		if err != nil {
			return
		}
		var parts []string
		for _, n := range got {
			parts = append(parts, strconv.FormatInt(n, 10))
		}
		for _, form := range []string{"[" + strings.Join(parts, ",") + "]", "{" + strings.Join(parts, ",") + "}"} {
			again, err := parseNIDs(form)
			if err != nil || !slices.Equal(again, got) {
				t.Fatalf("%q -> %v; %q -> %v, %v", s, got, form, again, err)
			}
		}
	})
}
