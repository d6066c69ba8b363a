package pdu

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// ErrBadSignature is returned for a PDU without a valid signature from a server
// that must sign it (Matrix spec v1.19, Server-Server API, "Checks performed on
// receipt of a PDU", step 2: such an event is dropped; "Validating hashes and
// signatures on received events").
var ErrBadSignature = errors.New("pdu: signature check failed")

// KeyRing holds servers' ed25519 public keys: server name -> key ID -> key.
type KeyRing map[string]map[gomatrixserverlib.KeyID]ed25519.PublicKey

// LoadKeyRing reads a key file: a JSON object of server name to an object of key ID
// ("ed25519:...") to the public key in unpadded (or padded) base64, e.g.
// {"server1.test": {"ed25519:gen": "lx5..."}} (the shape of the verify_keys of the
// Matrix spec v1.19 Server-Server API's "Retrieving server keys" responses, without
// the "key" wrapper). `mtxdb gen --keys FILE` writes one for its rooms.
func LoadKeyRing(path string) (KeyRing, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseKeyRing(raw, path)
}

// ParseKeyRing parses a key file's bytes (LoadKeyRing); source names it in errors.
func ParseKeyRing(raw []byte, source string) (KeyRing, error) {
	path := source
	var m map[string]map[string]string
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("key file %s: %v (want {\"server\": {\"ed25519:ID\": \"base64 public key\"}})", path, err)
	}
	k := KeyRing{}
	for server, keys := range m {
		k[server] = map[gomatrixserverlib.KeyID]ed25519.PublicKey{}
		for id, b64 := range keys {
			var b spec.Base64Bytes
			if err := b.Decode(b64); err != nil || len(b) != ed25519.PublicKeySize {
				return nil, fmt.Errorf("key file %s: server %s key %s: not a base64 ed25519 public key", path, server, id)
			}
			k[server][gomatrixserverlib.KeyID(id)] = ed25519.PublicKey(b)
		}
	}
	return k, nil
}

// Encode returns the key file form LoadKeyRing reads, sorted.
func (k KeyRing) Encode() []byte {
	servers := make([]string, 0, len(k))
	for s := range k {
		servers = append(servers, s)
	}
	sort.Strings(servers)
	var b strings.Builder
	b.WriteString("{")
	for i, s := range servers {
		if i > 0 {
			b.WriteString(",")
		}
		ids := make([]string, 0, len(k[s]))
		for id := range k[s] {
			ids = append(ids, string(id))
		}
		sort.Strings(ids)
		fmt.Fprintf(&b, "\n  %s: {", jsonString(s))
		for j, id := range ids {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s: %s", jsonString(id), jsonString(spec.Base64Bytes(k[s][gomatrixserverlib.KeyID(id)]).Encode()))
		}
		b.WriteString("}")
	}
	b.WriteString("\n}\n")
	return []byte(b.String())
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// CheckSignatures verifies the signatures a PDU needs (Matrix spec v1.19,
// Server-Server API, "Validating hashes and signatures on received events"): over
// its redacted form, from the sender's server; in room versions 1 and 2 also from
// the server of the event_id; for a restricted join (room versions 8 and up,
// content join_authorised_via_users_server) also from that user's server (Matrix
// spec v1.19, "Authorisation rules": "If the event is not validly signed by the
// homeserver of the user ID denoted by the key, reject": rule 4.2.1 in versions
// 8-11, 5.2.1 in 12). A third party invite may be sent by another server than the
// sender's: for it one valid signature from a known key suffices. Every signature
// from a known key of a required server must verify, and each required server needs
// one; signatures from unknown keys are skipped.
func (k KeyRing) CheckSignatures(verImpl gomatrixserverlib.IRoomVersion, pdu gomatrixserverlib.PDU, raw []byte) error {
	red, err := verImpl.RedactEventJSON(raw)
	if err != nil {
		return fmt.Errorf("%w: redact: %v", ErrBadSignature, err)
	}
	if verImpl.EventFormat() != gomatrixserverlib.EventFormatV1 {
		// A v3+ event carries no event_id over federation; a copy's convenience
		// field is not signed.
		var m map[string]json.RawMessage
		if json.Unmarshal(red, &m) == nil {
			delete(m, "event_id")
			red, _ = json.Marshal(m)
		}
	}
	sender := domainOfID(string(pdu.SenderID()))
	type need struct{ server, why string }
	needs := []need{{sender, "the sender's server"}}
	if verImpl.EventFormat() == gomatrixserverlib.EventFormatV1 {
		if d := domainOfID(pdu.EventID()); d != sender {
			needs = append(needs, need{d, "the server of the event_id (room versions 1 and 2)"})
		}
	}
	var c struct {
		Membership       string          `json:"membership"`
		Via              string          `json:"join_authorised_via_users_server"`
		ThirdPartyInvite json.RawMessage `json:"third_party_invite"`
	}
	if pdu.Type() == spec.MRoomMember {
		_ = json.Unmarshal(pdu.Content(), &c)
	}
	if n, err := strconv.Atoi(string(pdu.Version())); err == nil && n >= 8 && c.Membership == spec.Join && c.Via != "" {
		rule := "4.2.1"
		if n >= 12 {
			rule = "5.2.1"
		}
		needs = append(needs, need{domainOfID(c.Via), fmt.Sprintf("the server of join_authorised_via_users_server %s (authorization rule %s of room version %d)", c.Via, rule, n)})
	}
	var sigs map[string]map[gomatrixserverlib.KeyID]json.RawMessage
	var top struct {
		Signatures json.RawMessage `json:"signatures"`
	}
	_ = json.Unmarshal(red, &top)
	_ = json.Unmarshal(top.Signatures, &sigs)
	if c.Membership == spec.Invite && len(c.ThirdPartyInvite) > 0 && string(c.ThirdPartyInvite) != "null" {
		for server, byID := range sigs {
			for id := range byID {
				if key, ok := k[server][id]; ok && gomatrixserverlib.VerifyJSON(server, id, key, red) == nil {
					return nil
				}
			}
		}
		return fmt.Errorf("%w: third party invite %s: no valid signature from a known key", ErrBadSignature, pdu.EventID())
	}
	for _, n := range needs {
		keys, ok := k[n.server]
		if !ok {
			return fmt.Errorf("%w: no key for %s %s in the key file", ErrBadSignature, n.why, n.server)
		}
		valid := 0
		for id := range sigs[n.server] {
			key, known := keys[id]
			if !known {
				continue // unknown keys are skipped
			}
			if err := gomatrixserverlib.VerifyJSON(n.server, id, key, red); err != nil {
				return fmt.Errorf("%w: %s %s, key %s: %v", ErrBadSignature, n.why, n.server, id, err)
			}
			valid++
		}
		if valid == 0 {
			return fmt.Errorf("%w: no signature of %s %s with a known key", ErrBadSignature, n.why, n.server)
		}
	}
	return nil
}

// domainOfID is the server name of a user, room or event ID ("" if it has none).
func domainOfID(id string) string {
	if i := strings.IndexByte(id, ':'); i >= 0 {
		return id[i+1:]
	}
	return ""
}
