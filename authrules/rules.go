package authrules

import (
	"fmt"
	"strconv"
	"strings"
)

// Rule is one numbered rule of a room version's authorization rules (Matrix spec
// v1.19, each room version's "Authorisation rules": v1 and v2 share one text,
// v3-v5 another, v8 and v9 another; v6, v7, v10, v11 and v12 have their own).
type Rule struct {
	// ID is our stable name for the rule, the same in every version that has it
	// ("auth_events.duplicate").
	ID string
	// Num is the rule's number on that version's v1.19 page as the page renders it
	// (matrix-spec commit d0ba2aa, whose room pages are v1.19's) ("2.1"). The v12
	// page's source numbers the auth_events room check "5." after "3." and has two
	// items "10."; rendered (and here) they are 3.4 and 10.11.
	Num string
	// Text says what the rule does, in our words.
	Text string
	// Leaf: the rule decides (allow or reject); the others only head the rules
	// numbered under them ("If type is m.room.member:").
	Leaf bool
}

// ruleOutline is every rule of every version 1-12 in spec order: depth in the
// numbered outline, ID, text, and the versions that have it (from..to, to 0 = 12).
// Numbers are assigned by counting, per version, the entries it has at each depth:
// nobody types a rule number, so a rule that a version removes or adds renumbers
// the rest exactly as that version's page does.
var ruleOutline = []struct {
	depth    int
	id, text string
	from, to int
}{
	{1, "create", "If type is m.room.create:", 1, 0},
	{2, "create.prev_events", "it has prev_events: reject", 1, 0},
	{2, "create.room_domain", "the room_id's domain is not the sender's: reject", 1, 11},
	{2, "create.room_id", "the event has a room_id: reject", 12, 0},
	{2, "create.room_version", "content.room_version is present and not a known version: reject", 1, 0},
	{2, "create.creator", "content has no creator: reject", 1, 10},
	{2, "create.additional_creators", "content.additional_creators is present and not an array of valid user IDs: reject", 12, 0},
	{2, "create.allow", "otherwise allow", 1, 0},
	{1, "room_id.create", "the room_id is not an accepted m.room.create's event ID with ! for $: reject", 12, 0},
	{1, "auth_events", "Considering the event's auth_events:", 1, 0},
	{2, "auth_events.duplicate", "two entries with one (type, state_key): reject", 1, 0},
	{2, "auth_events.selection", "an entry whose (type, state_key) the auth events selection does not name: reject", 1, 0},
	{2, "auth_events.rejected", "an entry that was itself rejected: reject", 1, 0},
	{2, "auth_events.no_create", "no m.room.create among the entries: reject", 1, 11},
	{2, "auth_events.other_room", "an entry whose room_id is not the event's: reject", 1, 0},
	{1, "federate", "the create event's content has m.federate false and the sender's domain is not the create event sender's: reject", 1, 0},
	{1, "aliases", "If type is m.room.aliases:", 1, 5},
	{2, "aliases.no_state_key", "no state_key: reject", 1, 5},
	{2, "aliases.domain", "the state_key is not the sender's domain: reject", 1, 5},
	{2, "aliases.allow", "otherwise allow", 1, 5},
	{1, "member", "If type is m.room.member:", 1, 0},
	{2, "member.fields", "no state_key, or no membership in content: reject", 1, 0},
	{2, "member.via", "If content has join_authorised_via_users_server:", 8, 0},
	{3, "member.via.signature", "the event is not signed by that user's server: reject", 8, 0},
	{2, "join", "If membership is join:", 1, 0},
	{3, "join.first", "the only prev_event is the m.room.create and the state_key is its creator: allow", 1, 0},
	{3, "join.sender", "the sender is not the state_key: reject", 1, 0},
	{3, "join.banned", "the sender is banned: reject", 1, 0},
	{3, "join.invite", "join_rule invite (v7+: or knock): allow if the membership is invite or join", 1, 0},
	{3, "join.restricted", "If join_rule is restricted (v10+: or knock_restricted):", 8, 0},
	{4, "join.restricted.member", "the membership is join or invite: allow", 8, 0},
	{4, "join.restricted.via", "join_authorised_via_users_server is not a joined user with the invite level: reject", 8, 0},
	{4, "join.restricted.allow", "otherwise allow", 8, 0},
	{3, "join.public", "join_rule public: allow", 1, 0},
	{3, "join.reject", "otherwise reject", 1, 0},
	{2, "invite", "If membership is invite:", 1, 0},
	{3, "invite.tpi", "If content has third_party_invite:", 1, 0},
	{4, "invite.tpi.banned", "the target is banned: reject", 1, 0},
	{4, "invite.tpi.signed", "third_party_invite has no signed: reject", 1, 0},
	{4, "invite.tpi.mxid_token", "signed has no mxid or no token: reject", 1, 0},
	{4, "invite.tpi.mxid", "mxid is not the state_key: reject", 1, 0},
	{4, "invite.tpi.event", "no m.room.third_party_invite with the token as state_key: reject", 1, 0},
	{4, "invite.tpi.sender", "the sender is not that m.room.third_party_invite's sender: reject", 1, 0},
	{4, "invite.tpi.signature", "a signature in signed verifies with a public key of that event: allow", 1, 0},
	{5, "invite.tpi.signature.public_key", "the key in public_key", 1, 0},
	{5, "invite.tpi.signature.public_keys", "the keys in public_keys", 1, 0},
	{4, "invite.tpi.reject", "otherwise reject", 1, 0},
	{3, "invite.sender", "the sender's membership is not join: reject", 1, 0},
	{3, "invite.target", "the target's membership is join or ban: reject", 1, 0},
	{3, "invite.allow", "the sender's power level is at least the invite level: allow", 1, 0},
	{3, "invite.reject", "otherwise reject", 1, 0},
	{2, "leave", "If membership is leave:", 1, 0},
	{3, "leave.self", "the sender is the state_key: allow if and only if the membership is invite or join (v7+: or knock)", 1, 0},
	{3, "leave.sender", "the sender's membership is not join: reject", 1, 0},
	{3, "leave.banned", "the target is banned and the sender's level is below the ban level: reject", 1, 0},
	{3, "leave.kick", "the sender's level is at least the kick level and above the target's: allow", 1, 0},
	{3, "leave.reject", "otherwise reject", 1, 0},
	{2, "ban", "If membership is ban:", 1, 0},
	{3, "ban.sender", "the sender's membership is not join: reject", 1, 0},
	{3, "ban.allow", "the sender's level is at least the ban level and above the target's: allow", 1, 0},
	{3, "ban.reject", "otherwise reject", 1, 0},
	{2, "knock", "If membership is knock:", 7, 0},
	{3, "knock.join_rule", "join_rule is not knock (v10+: nor knock_restricted): reject", 7, 0},
	{3, "knock.sender", "the sender is not the state_key: reject", 7, 0},
	{3, "knock.allow", "the sender's membership is not ban, invite or join: allow", 7, 0},
	{3, "knock.reject", "otherwise reject", 7, 0},
	{2, "member.unknown", "any other membership: reject", 1, 0},
	{1, "sender", "the sender's membership is not join: reject", 1, 0},
	{1, "third_party_invite", "If type is m.room.third_party_invite:", 1, 0},
	{2, "third_party_invite.level", "allow if and only if the sender's level is at least the invite level", 1, 0},
	{1, "required_level", "the event type's required power level is above the sender's: reject", 1, 0},
	{1, "state_key", "a state_key starting with @ that is not the sender: reject", 1, 0},
	{1, "power_levels", "If type is m.room.power_levels:", 1, 0},
	{2, "power_levels.integers", "users_default, events_default, state_default, ban, redact, kick or invite present and not an integer: reject", 10, 0},
	{2, "power_levels.maps", "events or notifications present and not an object of integers: reject", 10, 0},
	{2, "power_levels.users", "users is not an object of valid user IDs to integers (v1-9: or integer strings): reject", 1, 0},
	{2, "power_levels.creators", "users names a room creator: reject", 12, 0},
	{2, "power_levels.first", "no previous m.room.power_levels: allow", 1, 0},
	{2, "power_levels.named", "For each of users_default, events_default, state_default, ban, redact, kick, invite added, changed or removed:", 1, 0},
	{3, "power_levels.named.old", "the old value is above the sender's level: reject", 1, 0},
	{3, "power_levels.named.new", "the new value is above the sender's level: reject", 1, 0},
	{2, "power_levels.events_old", "For each events (v6+: and notifications) entry changed or removed:", 1, 0},
	{3, "power_levels.events_old.level", "the old value is above the sender's level: reject", 1, 0},
	{2, "power_levels.events_new", "For each events (v6+: and notifications) entry added or changed:", 1, 0},
	{3, "power_levels.events_new.level", "the new value is above the sender's level: reject", 1, 0},
	{2, "power_levels.users_old", "For each users entry changed or removed, other than the sender's own:", 1, 0},
	{3, "power_levels.users_old.level", "the old value is at least the sender's level: reject", 1, 0},
	{2, "power_levels.users_new", "For each users entry added or changed:", 1, 0},
	{3, "power_levels.users_new.level", "the new value is above the sender's level: reject", 1, 0},
	{2, "power_levels.allow", "otherwise allow", 1, 0},
	{1, "redaction", "If type is m.room.redaction:", 1, 2},
	{2, "redaction.level", "the sender's level is at least the redact level: allow", 1, 2},
	{2, "redaction.domain", "the redacted event ID's domain is the redaction's event ID's: allow", 1, 2},
	{2, "redaction.reject", "otherwise reject", 1, 2},
	{1, "allow", "otherwise allow", 1, 0},
}

// MaxVersion is the newest room version whose rules this package numbers.
const MaxVersion = 12

// rulesByVersion holds Rules per version 1..MaxVersion, and ruleIndex the
// rules by ID.
var rulesByVersion, ruleIndex = buildRules()

func buildRules() ([][]Rule, []map[string]Rule) {
	all := make([][]Rule, MaxVersion+1)
	idx := make([]map[string]Rule, MaxVersion+1)
	for v := 1; v <= MaxVersion; v++ {
		idx[v] = map[string]Rule{}
		var counters []int
		var list []Rule
		for i, e := range ruleOutline {
			to := e.to
			if to == 0 {
				to = MaxVersion
			}
			if v < e.from || v > to {
				continue
			}
			for len(counters) < e.depth {
				counters = append(counters, 0)
			}
			counters = counters[:e.depth]
			counters[e.depth-1]++
			parts := make([]string, e.depth)
			for j, c := range counters {
				parts[j] = strconv.Itoa(c)
			}
			leaf := true
			for _, n := range ruleOutline[i+1:] {
				nto := n.to
				if nto == 0 {
					nto = MaxVersion
				}
				if v < n.from || v > nto {
					continue
				}
				leaf = n.depth <= e.depth
				break
			}
			r := Rule{ID: e.id, Num: strings.Join(parts, "."), Text: e.text, Leaf: leaf}
			list = append(list, r)
			idx[v][e.id] = r
		}
		all[v] = list
	}
	return all, idx
}

// Rules returns the authorization rules of a room version (1-12) in spec order,
// numbered as its spec page numbers them; nil for other versions.
func Rules(version string) []Rule {
	v := ruleVersion(version)
	if v == 0 {
		return nil
	}
	return rulesByVersion[v]
}

// ruleVersion maps a room version string to 1..MaxVersion, 0 for others.
func ruleVersion(version string) int {
	v, err := strconv.Atoi(version)
	if err != nil || v < 1 || v > MaxVersion {
		return 0
	}
	return v
}

// rule returns the rule id of version v; it panics on an id the version does
// not have (a programming error: every call names a rule of the outline).
func rule(v int, id string) Rule {
	r, ok := ruleIndex[v][id]
	if !ok {
		panic(fmt.Sprintf("authrules: room version %d has no authorization rule %q", v, id))
	}
	return r
}

// RuleError is a rejection by one authorization rule: the version, the rule
// (number and ID) and what in the event broke it. CheckAuthEvents and Authorize
// return it where these rules decide.
type RuleError struct {
	Version string
	Rule    Rule
	Detail  string
}

// Error gives the rule and the detail: "authorization rule 2.1 of room version 10
// (auth_events.duplicate: <rule text>): <detail>".
func (e *RuleError) Error() string {
	return fmt.Sprintf("authorization rule %s of room version %s (%s: %s): %s",
		e.Rule.Num, e.Version, e.Rule.ID, e.Rule.Text, e.Detail)
}
