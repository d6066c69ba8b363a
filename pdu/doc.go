// Package pdu holds the checks that make a PDU a valid event before any room
// holds it, and its parsing: the size limits (MaxPDUBytes of canonical JSON,
// MaxFieldBytes per identifier field), the event ID of room versions 3 and up
// (the reference hash), the content hash (a PDU whose hash fails is used
// redacted), signatures from a KeyRing, and parsing with gomatrixserverlib with
// its panics turned into ErrMalformedPDU (Matrix spec v1.19, Server-Server API,
// "Checks performed on receipt of a PDU", steps 1 and 2). It reads no store:
// roomstate's import runs these checks on every line before it places a PDU in
// its room.
package pdu
