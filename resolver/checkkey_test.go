package resolver

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// A check key does not depend on the order of the auth events' IDs, and
// differs when a part moves across a boundary, when an auth event is added,
// dropped, repeated or replaced, and when an ID moves between the parts that
// name the event and the auth events. Random sets of IDs (printed seed) get
// no two equal keys.
func TestCheckKey(t *testing.T) {
	key := func(head []string, ids ...string) checkKey {
		k := newCheckKey(head...)
		for _, id := range ids {
			k.addAuthEvent(id)
		}
		return k
	}
	base := key([]string{"$e"}, "$a", "$b", "$c")
	if got := key([]string{"$e"}, "$c", "$a", "$b"); got != base {
		t.Fatalf("auth events reordered: %x, want %x", got, base)
	}
	for name, other := range map[string]checkKey{
		"one more":           key([]string{"$e"}, "$a", "$b", "$c", "$d"),
		"one fewer":          key([]string{"$e"}, "$a", "$b"),
		"repeated":           key([]string{"$e"}, "$a", "$b", "$c", "$c"),
		"replaced":           key([]string{"$e"}, "$a", "$b", "$x"),
		"other event":        key([]string{"$f"}, "$a", "$b", "$c"),
		"id moved into head": key([]string{"$e", "$a"}, "$b", "$c"),
		"head boundary":      key([]string{"$", "e"}, "$a", "$b", "$c"),
	} {
		if other == base {
			t.Errorf("%s: same key %x", name, other)
		}
	}
	seed := uint64(rand.Int64())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 7))
	seen := map[checkKey]string{}
	for i := range 20000 {
		ids := make([]string, 1+r.IntN(6))
		desc := ""
		for j := range ids {
			ids[j] = "$" + strconv.Itoa(r.IntN(50))
			desc += ids[j] + ","
		}
		k := key([]string{"$" + strconv.Itoa(i%7)}, ids...)
		desc = strconv.Itoa(i%7) + ":" + desc
		if prev, dup := seen[k]; dup && !sameMultiset(prev, desc) {
			t.Fatalf("%q and %q share key %x", prev, desc, k)
		}
		seen[k] = desc
	}
}

// sameMultiset reports whether two descriptions "head:id,id,...," name the
// same head and the same IDs with the same counts.
func sameMultiset(a, b string) bool {
	count := func(s string) map[string]int {
		m := map[string]int{}
		head, rest, _ := strings.Cut(s, ":")
		m["head "+head]++
		for rest != "" {
			var id string
			id, rest, _ = strings.Cut(rest, ",")
			m[id]++
		}
		return m
	}
	ca, cb := count(a), count(b)
	if len(ca) != len(cb) {
		return false
	}
	for k, v := range ca {
		if cb[k] != v {
			return false
		}
	}
	return true
}

// Cache.allowed keeps every outcome noted in its last maxAllowedChecks to
// 2*maxAllowedChecks notes, with the outcome noted, and forgets older ones.
func TestAllowedGenerations(t *testing.T) {
	c := NewCache()
	key := func(i int) checkKey { return newCheckKey("$" + strconv.Itoa(i)) }
	n := 2*maxAllowedChecks + 1
	for i := range n {
		c.noteAllowed(key(i), i%3 == 0)
	}
	for _, i := range []int{0, maxAllowedChecks - 1} {
		if _, hit := c.lookupAllowed(key(i)); hit {
			t.Errorf("check %d of %d notes is still kept", i, n)
		}
	}
	for _, i := range []int{maxAllowedChecks, 2*maxAllowedChecks - 1, 2 * maxAllowedChecks} {
		ok, hit := c.lookupAllowed(key(i))
		if !hit || ok != (i%3 == 0) {
			t.Errorf("check %d of %d notes: allowed %v, kept %v; want %v, kept", i, n, ok, hit, i%3 == 0)
		}
	}
}
