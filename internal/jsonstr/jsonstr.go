// Package jsonstr writes a Go string as a JSON string, byte for byte as
// encoding/json's Marshal writes it, without Marshal's reflection where the
// string needs no escaping.
package jsonstr

import "encoding/json"

// Append appends s to b as a JSON string: between quotes as it is when it holds
// only printable ASCII other than ", \ and what encoding/json escapes for HTML
// (<, >, &), else as encoding/json's Marshal writes it.
func Append(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	return append(append(append(b, '"'), s...), '"')
}
