package testrooms

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// RumaDir is the directory of Ruma's state-resolution vectors (peer/ruma: cases.json,
// fixtures/, expected/; source note in peer/README.md).
func RumaDir() string { return filepath.Join(Dir(), "peer", "ruma") }

// standInPDU gives a fixture's made-up v12 room ID ("!00-m-room-create", not the
// 43-character form) a valid stand-in, because gomatrixserverlib's RoomID() panics
// on it. Every event of one load gets the same stand-in, so room checks still
// compare equal; nothing else changes.
type standInPDU struct {
	gomatrixserverlib.PDU
	roomID spec.RoomID
}

func (p standInPDU) RoomID() spec.RoomID { return p.roomID }

// LoadFixtures reads fixture files in the Ruma vectors' form: JSON arrays of PDUs
// with made-up event IDs, no hashes, no depth, parsed as trusted JSON with the given
// ID. Each file is one batch, its events in file order; an event ID seen in an
// earlier file is left out of later batches. The room version is the room_version
// of the first file's first event (its m.room.create). It returns the version, the
// batches and every event by ID; an error names the file or event that failed.
func LoadFixtures(paths []string) (gomatrixserverlib.RoomVersion, [][]gomatrixserverlib.PDU, map[string]gomatrixserverlib.PDU, error) {
	if len(paths) == 0 {
		return "", nil, nil, fmt.Errorf("testrooms: no fixture files")
	}
	var raws [][]json.RawMessage
	for _, f := range paths {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", nil, nil, err
		}
		var evs []json.RawMessage
		if err := json.Unmarshal(b, &evs); err != nil {
			return "", nil, nil, fmt.Errorf("testrooms: %s: %w", f, err)
		}
		raws = append(raws, evs)
	}
	if len(raws[0]) == 0 {
		return "", nil, nil, fmt.Errorf("testrooms: %s holds no events", paths[0])
	}
	var first struct {
		Content struct {
			RoomVersion string `json:"room_version"`
		} `json:"content"`
	}
	if err := json.Unmarshal(raws[0][0], &first); err != nil {
		return "", nil, nil, fmt.Errorf("testrooms: %s: first event: %w", paths[0], err)
	}
	version := gomatrixserverlib.RoomVersion(first.Content.RoomVersion)
	verImpl, err := gomatrixserverlib.GetRoomVersion(version)
	if err != nil {
		return "", nil, nil, fmt.Errorf("testrooms: %s: room version %q: %w", paths[0], version, err)
	}
	sum := sha256.Sum256([]byte(filepath.Base(paths[0])))
	stand, err := spec.NewRoomID("!" + base64.RawURLEncoding.EncodeToString(sum[:])[:43])
	if err != nil {
		return "", nil, nil, err
	}
	events := map[string]gomatrixserverlib.PDU{}
	var batches [][]gomatrixserverlib.PDU
	for i, evs := range raws {
		var batch []gomatrixserverlib.PDU
		for _, e := range evs {
			var h struct {
				EventID string `json:"event_id"`
			}
			if err := json.Unmarshal(e, &h); err != nil {
				return "", nil, nil, fmt.Errorf("testrooms: %s: %w", paths[i], err)
			}
			p, err := verImpl.NewEventFromTrustedJSONWithEventID(h.EventID, e, false)
			if err != nil {
				return "", nil, nil, fmt.Errorf("testrooms: %s: %s: %w", paths[i], h.EventID, err)
			}
			var pdu gomatrixserverlib.PDU = p
			if verImpl.DomainlessRoomIDs() {
				pdu = standInPDU{PDU: p, roomID: *stand}
			}
			if _, dup := events[h.EventID]; !dup {
				events[h.EventID] = pdu
				batch = append(batch, pdu)
			}
		}
		batches = append(batches, batch)
	}
	return version, batches, events, nil
}
