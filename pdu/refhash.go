package pdu

import (
	"strings"
	"unicode/utf8"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/tidwall/gjson"
)

// redaction is one of gomatrixserverlib's redaction algorithms (its
// redactEventJSONV1 to V5): the top-level keys it keeps and, by event type,
// the content keys it keeps (an empty list: every key; a type not listed:
// none).
type redaction struct {
	top     map[string]bool
	content map[string][]string
}

var (
	redactTopV1 = keySet("event_id", "type", "room_id", "sender", "state_key", "content", "hashes", "signatures", "depth",
		"prev_events", "prev_state", "auth_events", "origin", "origin_server_ts", "membership")
	redactTopV2 = keySet("event_id", "type", "room_id", "sender", "state_key", "content", "hashes", "signatures", "depth",
		"prev_events", "auth_events", "origin_server_ts")
	powerLevelKeys = []string{"ban", "events", "events_default", "kick", "redact", "state_default", "users", "users_default"}

	redactV1 = &redaction{top: redactTopV1, content: map[string][]string{
		"m.room.member": {"membership"}, "m.room.create": {"creator"}, "m.room.join_rules": {"join_rule"},
		"m.room.power_levels": powerLevelKeys, "m.room.aliases": {"aliases"}, "m.room.history_visibility": {"history_visibility"},
	}}
	redactV2 = &redaction{top: redactTopV1, content: map[string][]string{
		"m.room.member": {"membership"}, "m.room.create": {"creator"}, "m.room.join_rules": {"join_rule"},
		"m.room.power_levels": powerLevelKeys, "m.room.history_visibility": {"history_visibility"},
	}}
	redactV3 = &redaction{top: redactTopV1, content: map[string][]string{
		"m.room.member": {"membership"}, "m.room.create": {"creator"}, "m.room.join_rules": {"join_rule", "allow"},
		"m.room.power_levels": powerLevelKeys, "m.room.history_visibility": {"history_visibility"},
	}}
	redactV4 = &redaction{top: redactTopV1, content: map[string][]string{
		"m.room.member": {"membership", "join_authorised_via_users_server"}, "m.room.create": {"creator"},
		"m.room.join_rules": {"join_rule", "allow"}, "m.room.power_levels": powerLevelKeys,
		"m.room.history_visibility": {"history_visibility"},
	}}
	redactV5 = &redaction{top: redactTopV2, content: map[string][]string{
		"m.room.member": {"membership", "join_authorised_via_users_server"}, "m.room.create": {},
		"m.room.join_rules": {"join_rule", "allow"}, "m.room.power_levels": append(powerLevelKeys[:len(powerLevelKeys):len(powerLevelKeys)], "invite"),
		"m.room.history_visibility": {"history_visibility"}, "m.room.redaction": {"redacts"},
	}}
)

// redactions is the redaction algorithm of each room version, as
// gomatrixserverlib's version table assigns them (TestCanonicalRedacted
// checks every version against gomatrixserverlib). A version not listed
// takes gomatrixserverlib's own redaction.
var redactions = map[gomatrixserverlib.RoomVersion]*redaction{
	gomatrixserverlib.RoomVersionV1: redactV1, gomatrixserverlib.RoomVersionV2: redactV1,
	gomatrixserverlib.RoomVersionV3: redactV1, gomatrixserverlib.RoomVersionV4: redactV1,
	gomatrixserverlib.RoomVersionV5: redactV1, gomatrixserverlib.RoomVersionV6: redactV2,
	gomatrixserverlib.RoomVersionV7: redactV2, gomatrixserverlib.RoomVersionV8: redactV3,
	gomatrixserverlib.RoomVersionV9: redactV4, gomatrixserverlib.RoomVersionV10: redactV4,
	gomatrixserverlib.RoomVersionV11: redactV5, gomatrixserverlib.RoomVersionV12: redactV5,
}

func keySet(keys ...string) map[string]bool {
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}

// topEntry is one top-level key of an event and its value.
type topEntry struct {
	key string
	val gjson.Result
}

// canonicalRedacted appends to dst what referenceHashID hashes for the event
// canon (canonical JSON: gomatrixserverlib's PDU.JSON()): its redacted form
// for the room version, without signatures and event_id, as canonical JSON.
// It filters canon's keys in place of gomatrixserverlib's decoding into Go
// values and encoding back, and so gives up (ok false) wherever that round
// trip could change bytes: a version without an entry in redactions, bytes
// that are not UTF-8, a top-level key outside [a-z0-9_] (encoding/json
// matches field names in any case) or given twice, a kept value that is null
// or holds a backslash escape, a number with a fraction, an exponent or more
// than 15 digits, or a key given twice in kept content, no string type, or
// content that is not an object.
func canonicalRedacted(version gomatrixserverlib.RoomVersion, canon, dst []byte) (out []byte, ok bool) {
	r := redactions[version]
	if r == nil || !utf8.Valid(canon) {
		return nil, false
	}
	root := gjson.ParseBytes(canon)
	if !root.IsObject() {
		return nil, false
	}
	var buf [24]topEntry
	kept := buf[:0]
	prev, typ, haveContent := "", "", false
	ok = true
	root.ForEach(func(k, v gjson.Result) bool {
		key := k.Raw
		if len(key) < 2 || !plainKey(key[1:len(key)-1]) || key == prev {
			ok = false
			return false
		}
		prev = key
		name := key[1 : len(key)-1]
		if !r.top[name] || name == "signatures" || name == "event_id" {
			return true
		}
		switch {
		case v.Type == gjson.Null || (name != "content" && hasBackslash(v.Raw)):
			ok = false // redactedContent checks the content it keeps
		case name == "type":
			ok, typ = v.Type == gjson.String, v.Str
		case name == "content":
			ok, haveContent = v.IsObject(), true
		}
		kept = append(kept, topEntry{name, v})
		return ok
	})
	if !ok || typ == "" || !haveContent {
		return nil, false
	}
	out = append(dst, '{')
	for i, e := range kept {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, '"')
		out = append(out, e.key...)
		out = append(out, '"', ':')
		if e.key != "content" {
			out = append(out, e.val.Raw...)
			continue
		}
		if out, ok = redactedContent(out, e.val, r.content, typ); !ok {
			return nil, false
		}
	}
	return append(out, '}'), true
}

// redactedContent appends the content object c as the redaction keeps it
// for event type typ, or reports false where encoding/json's round trip
// could change its bytes (roundTrips).
func redactedContent(out []byte, c gjson.Result, rules map[string][]string, typ string) ([]byte, bool) {
	keep, listed := rules[typ]
	if !listed {
		return append(out, '{', '}'), true
	}
	if len(keep) == 0 {
		if !roundTrips(c) {
			return nil, false
		}
		return append(out, c.Raw...), true
	}
	out = append(out, '{')
	first, prev, ok := true, "", true
	c.ForEach(func(k, v gjson.Result) bool {
		if ok = !hasBackslash(k.Raw) && k.Raw != prev; !ok {
			return false
		}
		prev = k.Raw
		name := k.Raw[1 : len(k.Raw)-1]
		for _, want := range keep {
			if name != want {
				continue
			}
			if ok = roundTrips(v); !ok {
				return false
			}
			if !first {
				out = append(out, ',')
			}
			first = false
			out = append(out, k.Raw...)
			out = append(out, ':')
			out = append(out, v.Raw...)
		}
		return true
	})
	if !ok {
		return nil, false
	}
	return append(out, '}'), true
}

// roundTrips reports whether the canonical JSON value v comes out of
// encoding/json's decoding into interface{} values and encoding back,
// canonicalised, as the same bytes: no backslash escape, no key given twice,
// and only integers of at most 15 digits (exact in a float64).
func roundTrips(v gjson.Result) bool {
	switch v.Type {
	case gjson.String:
		return !hasBackslash(v.Raw)
	case gjson.Number:
		digits := 0
		for i := 0; i < len(v.Raw); i++ {
			switch c := v.Raw[i]; {
			case c >= '0' && c <= '9':
				digits++
			case c == '-' && i == 0:
			default:
				return false
			}
		}
		return digits > 0 && digits <= 15 && !strings.HasPrefix(v.Raw, "-0")
	case gjson.JSON:
		ok, prev, isObject := true, "", v.IsObject()
		v.ForEach(func(k, e gjson.Result) bool {
			if isObject {
				if ok = !hasBackslash(k.Raw) && k.Raw != prev; !ok {
					return false
				}
				prev = k.Raw
			}
			ok = roundTrips(e)
			return ok
		})
		return ok
	}
	return true // true, false, null
}

// plainKey reports whether a top-level key is made only of [a-z0-9_], which
// encoding/json can match to no field but the one of exactly that name.
func plainKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func hasBackslash(s string) bool { return strings.IndexByte(s, '\\') >= 0 }
