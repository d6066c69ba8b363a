// Package authrules decides whether a room's authorization rules allow an event
// against a set of auth events (Matrix spec v1.19, each room version's
// "Authorization rules", room versions 1-12), and names the rule that decided.
//
// The rules of every version are one outline (rules.go): each rule has a stable ID
// ("auth_events.duplicate") and the number its version's spec page gives it
// ("2.1"), so a rejection (RuleError) says which rule of which version the event
// broke. Rules lists them per version.
//
// Two checks make up authorisation, as a server applies them on receipt (Matrix
// spec v1.19, Server-Server API, "Checks performed on receipt of a PDU"):
//
//   - CheckAuthEvents: the rules on the event's own auth_events list (duplicates,
//     entries the auth events selection does not name, rejected entries, a
//     missing create event, entries of another room), which need the list as the
//     event gives it.
//   - Authorize: every other rule, against auth events given one per state key
//     (the event's auth events, or the state before it), then gomatrixserverlib's
//     Allowed. NewAuthorizer returns Authorize with what it parses of power levels
//     and create events kept from one call to the next.
//
// The package reads events through gomatrixserverlib's PDU and keeps no state of
// its own: state resolution (package resolver), the Dendrite adapter and the room
// generator call it with the events they hold.
package authrules
