package pdu_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/pdu"
)

// TestParseKeyRing: a key file round-trips through Encode; bad keys and shapes are
// errors naming the file.
func TestParseKeyRing(t *testing.T) {
	in := `{"a.test": {"ed25519:1": "wqWS45Vn06dZjdUxXKZ69PQlXYi4m7UBVNvM4DEqsf0"}}`
	k, err := pdu.ParseKeyRing([]byte(in), "k.json")
	require.NoError(t, err)
	require.Len(t, k["a.test"]["ed25519:1"], 32)
	k2, err := pdu.ParseKeyRing(k.Encode(), "again")
	require.NoError(t, err)
	require.Equal(t, k, k2)
	odd := pdu.KeyRing{"a\x00\x7f\"b": k["a.test"]}
	k3, err := pdu.ParseKeyRing(odd.Encode(), "odd")
	require.NoError(t, err, string(odd.Encode()))
	require.Equal(t, odd, k3)
	for _, bad := range []string{`[]`, `{"a.test": {"ed25519:1": "short"}}`, `{"a.test": "x"}`, `{`} {
		_, err := pdu.ParseKeyRing([]byte(bad), "k.json")
		require.ErrorContains(t, err, "k.json", bad)
	}
}

// FuzzParseKeyRing: any bytes give a key ring or an error, never a panic; a key
// ring parsed encodes to a file that parses to the same ring.
func FuzzParseKeyRing(f *testing.F) {
	f.Add([]byte(`{"a.test": {"ed25519:1": "wqWS45Vn06dZjdUxXKZ69PQlXYi4m7UBVNvM4DEqsf0"}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := pdu.ParseKeyRing(b, "fuzz")
		if err != nil {
			return
		}
		k2, err := pdu.ParseKeyRing(k.Encode(), "again")
		require.NoError(t, err)
		require.Equal(t, len(k), len(k2))
	})
}
