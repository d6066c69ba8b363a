package smallroom

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// roomIDWithDomain is the room ID of both renderings in room versions 1-11: the
// creator's server is s0.test, and the create rules (v1-11) want the room ID of
// the creator's domain.
const roomIDWithDomain = "!room:s0.test"

// v12Pad fills a v12 fixture create event's ID up to the 43 characters of
// unpadded URL-safe base64 a domainless room ID must have (its room ID is the
// create event's ID with "!" for "$"): "$e0___...". Names are "e" and digits, so
// the padding is never part of one.
const v12Pad = "_"

// Rendering is a Room written one way: per event (Room.Events order) its JSON, its
// event ID and its parsed PDU.
type Rendering struct {
	Room   *Room
	RoomID string
	Lines  [][]byte
	IDs    []string
	PDUs   []gomatrixserverlib.PDU
	Index  map[string]int // event ID -> index

	ver        gomatrixserverlib.IRoomVersion
	v1         bool     // event format 1 (room versions 1-2): references are [ID, hashes] pairs
	domainless bool     // room version 12: the create event has no room_id
	hashes     []string // reference hashes by index, for v1 references (nil: {} written)
}

// JSONL is the rendering as JSON lines, one event a line, in the room's order.
func (rd *Rendering) JSONL() []byte {
	var b bytes.Buffer
	for _, l := range rd.Lines {
		b.Write(l)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func (r *Room) newRendering() (*Rendering, error) {
	if err := r.validate(); err != nil {
		return nil, err
	}
	verImpl, err := gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersion(r.Version))
	if err != nil {
		return nil, fmt.Errorf("smallroom: %w", err)
	}
	n := len(r.Events)
	return &Rendering{Room: r, RoomID: roomIDWithDomain, Lines: make([][]byte, n), IDs: make([]string, n),
		PDUs: make([]gomatrixserverlib.PDU, n), Index: make(map[string]int, n), ver: verImpl,
		v1: verImpl.EventFormat() == gomatrixserverlib.EventFormatV1, domainless: verImpl.DomainlessRoomIDs()}, nil
}

// add records event i's JSON, ID and PDU.
func (rd *Rendering) add(i int, line []byte, pdu gomatrixserverlib.PDU) error {
	id := pdu.EventID()
	if _, dup := rd.Index[id]; dup {
		return fmt.Errorf("smallroom: two events with ID %s", id)
	}
	rd.Lines[i], rd.IDs[i], rd.PDUs[i], rd.Index[id] = line, id, pdu, i
	return nil
}

// fields returns the PDU fields of event i both renderings share: content,
// origin_server_ts, sender, type, state_key, prev_events and auth_events (IDs, or
// in room versions 1-2 [ID, {"sha256": hash}] pairs, {} without hashes), and
// room_id but on a v12 create event.
func (rd *Rendering) fields(i int) map[string]any {
	e := &rd.Room.Events[i]
	m := map[string]any{
		"content":          json.RawMessage(e.Content),
		"origin_server_ts": e.TS,
		"sender":           e.Sender,
		"type":             e.Type,
		"prev_events":      rd.refs(e.Prev),
		"auth_events":      rd.refs(e.Auth),
	}
	if e.StateKey != nil {
		m["state_key"] = *e.StateKey
	}
	if !(rd.domainless && i == 0) {
		m["room_id"] = rd.RoomID
	}
	return m
}

func (rd *Rendering) refs(idx []int) []any {
	out := make([]any, 0, len(idx))
	for _, j := range idx {
		if !rd.v1 {
			out = append(out, rd.IDs[j])
			continue
		}
		h := map[string]string{}
		if rd.hashes != nil {
			h["sha256"] = rd.hashes[j]
		}
		out = append(out, []any{rd.IDs[j], h})
	}
	return out
}

func canonical(m map[string]any) ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return gomatrixserverlib.CanonicalJSON(b)
}

func b64(sum [32]byte) string { return base64.RawStdEncoding.EncodeToString(sum[:]) }

// Hashed renders the room as its room version's real PDUs: depth, content hash
// (Matrix spec v1.19, Server-Server API, "Calculating the content hash for an
// event"), event IDs that are reference hashes from room version 3 and
// "$<name>:<origin>" before, prev/auth references with their reference hashes in
// versions 1-2, and in version 12 the room ID named after the create event; from
// version 3 the event's name in a top-level "smallroom_name". No signatures, no
// unsigned. Each line is canonical JSON that roomstate.Store.Import accepts.
func (r *Room) Hashed() (*Rendering, error) {
	rd, err := r.newRendering()
	if err != nil {
		return nil, err
	}
	depth := make([]int64, len(r.Events))
	rd.hashes = make([]string, len(r.Events))
	for i := range r.Events {
		e := &r.Events[i]
		m := rd.fields(i)
		origin := serverOf(e.Sender)
		m["origin"] = origin
		for _, p := range e.Prev {
			depth[i] = max(depth[i], depth[p])
		}
		depth[i]++
		m["depth"] = depth[i]
		if rd.v1 {
			m["event_id"] = "$" + e.Name + ":" + origin
		} else {
			// Two events alike in every field (two leaves on the same prev events at
			// the same time) would be one event: the name, in a top-level key the
			// redaction algorithm drops, makes each content hash, and so each
			// reference hash, its own.
			m["smallroom_name"] = e.Name
		}
		unhashed, err := canonical(m)
		if err != nil {
			return nil, fmt.Errorf("smallroom: event %s: %w", e.Name, err)
		}
		m["hashes"] = map[string]string{"sha256": b64(sha256.Sum256(unhashed))}
		line, err := canonical(m)
		if err != nil {
			return nil, fmt.Errorf("smallroom: event %s: %w", e.Name, err)
		}
		pdu, err := rd.ver.NewEventFromTrustedJSON(line, false)
		if err != nil {
			return nil, fmt.Errorf("smallroom: event %s: %w", e.Name, err)
		}
		if rd.v1 {
			redacted, err := rd.ver.RedactEventJSON(line)
			if err == nil {
				redacted, err = gomatrixserverlib.CanonicalJSON(redacted)
			}
			if err != nil {
				return nil, fmt.Errorf("smallroom: event %s: %w", e.Name, err)
			}
			rd.hashes[i] = b64(sha256.Sum256(redacted))
		}
		if rd.domainless && i == 0 {
			rd.RoomID = pdu.RoomID().String()
		}
		if err := rd.add(i, line, pdu); err != nil {
			return nil, err
		}
	}
	return rd, nil
}

// FixtureID is the made-up event ID the fixture rendering gives an event: "$" and
// its name, for a v12 create event padded to a valid room ID's length.
func (r *Room) FixtureID(i int) string {
	id := "$" + r.Events[i].Name
	if i == 0 && r.Version == "12" {
		id += strings.Repeat(v12Pad, 44-len(id))
	}
	return id
}

// Fixture renders the room as test vectors write one: made-up IDs ("$e7"; the
// same names recur in every room, for different events), no depth, no hashes, no
// origin; prev and auth references in versions 1-2 as [ID, {}]; the generator's
// note in unsigned. PDUs are parsed with NewEventFromTrustedJSONWithEventID. In
// room version 12 the room ID is the padded create event ID (FixtureID), so
// RoomID() parses and the room still names its create event.
func (r *Room) Fixture() (*Rendering, error) {
	rd, err := r.newRendering()
	if err != nil {
		return nil, err
	}
	if rd.domainless {
		rd.RoomID = "!" + r.FixtureID(0)[1:]
	}
	for i := range r.Events {
		e := &r.Events[i]
		m := rd.fields(i)
		id := r.FixtureID(i)
		m["event_id"] = id
		if e.Note != "" {
			m["unsigned"] = map[string]string{"note": e.Note}
		}
		line, err := canonical(m)
		if err != nil {
			return nil, fmt.Errorf("smallroom: event %s: %w", e.Name, err)
		}
		pdu, err := rd.ver.NewEventFromTrustedJSONWithEventID(id, line, false)
		if err != nil {
			return nil, fmt.Errorf("smallroom: event %s: %w", e.Name, err)
		}
		if err := rd.add(i, line, pdu); err != nil {
			return nil, err
		}
	}
	return rd, nil
}

// fixtureLine is what ParseFixture reads of a line.
type fixtureLine struct {
	EventID    string            `json:"event_id"`
	Sender     string            `json:"sender"`
	Type       string            `json:"type"`
	StateKey   *string           `json:"state_key"`
	Content    json.RawMessage   `json:"content"`
	TS         int64             `json:"origin_server_ts"`
	PrevEvents []json.RawMessage `json:"prev_events"`
	AuthEvents []json.RawMessage `json:"auth_events"`
	Unsigned   struct {
		Note string `json:"note"`
	} `json:"unsigned"`
}

// ParseFixture reads a room from its fixture rendering's JSON lines (blank lines
// and lines starting with "#" or "//" skipped). The room version is the create
// event's content.room_version ("1" when absent).
func ParseFixture(in io.Reader) (*Room, error) {
	r := &Room{Version: "1"}
	index := map[string]int{}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 || b[0] == '#' || bytes.HasPrefix(b, []byte("//")) {
			continue
		}
		var f fixtureLine
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("smallroom: line %d: %w", line, err)
		}
		e := Event{Name: strings.TrimRight(strings.TrimPrefix(f.EventID, "$"), v12Pad), Sender: f.Sender, Type: f.Type,
			StateKey: f.StateKey, Content: f.Content, TS: f.TS, Note: f.Unsigned.Note}
		if len(r.Events) == 0 && f.Type == spec.MRoomCreate {
			var c struct {
				RoomVersion string `json:"room_version"`
			}
			if json.Unmarshal(f.Content, &c) == nil && c.RoomVersion != "" {
				r.Version = c.RoomVersion
			}
		}
		var err error
		if e.Prev, err = refIndexes(f.PrevEvents, index); err == nil {
			e.Auth, err = refIndexes(f.AuthEvents, index)
		}
		if err != nil {
			return nil, fmt.Errorf("smallroom: line %d (%s): %w", line, f.EventID, err)
		}
		index[f.EventID] = len(r.Events)
		r.Events = append(r.Events, e)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if err := r.validate(); err != nil {
		return nil, err
	}
	return r, nil
}

// refIndexes reads prev or auth references (IDs, or [ID, hashes] pairs) as indexes
// of the events read so far.
func refIndexes(list []json.RawMessage, index map[string]int) ([]int, error) {
	var out []int
	for _, raw := range list {
		var id string
		if json.Unmarshal(raw, &id) != nil {
			var pair []json.RawMessage
			if err := json.Unmarshal(raw, &pair); err != nil || len(pair) == 0 || json.Unmarshal(pair[0], &id) != nil {
				return nil, fmt.Errorf("reference %s is neither an ID nor an [ID, hashes] pair", raw)
			}
		}
		i, ok := index[id]
		if !ok {
			return nil, fmt.Errorf("reference to %s, not an earlier event", id)
		}
		out = append(out, i)
	}
	return out, nil
}

// serverOf returns a user ID's server name.
func serverOf(userID string) string {
	_, s, _ := strings.Cut(userID, ":")
	return s
}
