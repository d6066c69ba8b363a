package roomstate_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/pdu"

	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomstate"
)

// repeatReader yields n bytes of b, without holding them.
type repeatReader struct {
	b byte
	n int64
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.n {
		p = p[:r.n]
	}
	for i := range p {
		p[i] = r.b
	}
	r.n -= int64(len(p))
	return len(p), nil
}

// TestImportBoundedReading: a 64 MiB line, a 64 MiB line without a newline and a
// 64 MiB JSON array element are refused as ErrTooLarge, naming the line or
// element, while import allocates a small fraction of their size; the PDUs around
// them are imported.
func TestImportBoundedReading(t *testing.T) {
	ctx := t.Context()
	lines := roomLines(t, "room002")
	const big = 64 << 20
	huge := func() io.Reader { return &repeatReader{b: 'a', n: big} }
	for _, c := range []struct {
		name     string
		in       func() io.Reader
		imported int
		at       string
	}{
		{"line", func() io.Reader {
			return io.MultiReader(strings.NewReader(strings.Join(lines[:5], "\n")+"\n"+`{"type":"`), huge(),
				strings.NewReader("\"}\n"+strings.Join(lines[5:], "\n")))
		}, len(lines), "line 6"},
		{"no newline", func() io.Reader {
			return io.MultiReader(strings.NewReader(strings.Join(lines[:5], "\n")+"\n"), huge())
		}, 5, "line 6"},
		{"array element", func() io.Reader {
			return io.MultiReader(strings.NewReader("["+strings.Join(lines[:5], ",")+`,{"type":"`), huge(),
				strings.NewReader(`"},`+strings.Join(lines[5:], ",")+"]"))
		}, 5, "element 6"},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := roomstate.New(packstore.NewMemStorage())
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			res, err := st.Import(ctx, c.in(), "big", roomstate.ImportOptions{KeepGoing: true})
			runtime.ReadMemStats(&after)
			require.NoError(t, err)
			require.Equal(t, c.imported, res.Imported)
			require.Len(t, res.Refused, 1)
			require.True(t, errors.Is(res.Refused[0], pdu.ErrTooLarge), "%v", res.Refused[0])
			require.Contains(t, res.Refused[0].Error(), c.at)
			alloc := after.TotalAlloc - before.TotalAlloc
			require.Less(t, alloc, uint64(big/4), "import allocated %d bytes for a %d-byte input", alloc, big)
		})
	}
	// A line just under the limit is read and judged as a PDU (too large, by its
	// canonical size), not dropped unread.
	st := roomstate.New(packstore.NewMemStorage())
	pad := `{"type":"` + string(bytes.Repeat([]byte{'a'}, roomstate.MaxLineBytesForTest-20)) + `"}`
	res, err := st.Import(ctx, strings.NewReader(pad), "pad", roomstate.ImportOptions{KeepGoing: true})
	require.NoError(t, err)
	require.Len(t, res.Refused, 1)
	require.NotContains(t, res.Refused[0].Error(), "not read whole")
}

// TestImportWrappedArray: a JSON object wrapping an array of events (an API
// response) is refused naming the key to take the PDUs from, whether or not it is
// over the PDU size limit; a PDU without type is still "no type".
func TestImportWrappedArray(t *testing.T) {
	ctx := t.Context()
	lines := roomLines(t, "room002")
	st := roomstate.New(packstore.NewMemStorage())
	in := `{"chunk":[` + strings.Join(lines[:3], ",") + "]}\n" +
		`{"next_batch":"x","chunk":[` + strings.Join(lines[:100], ",") + "]}\n" +
		`{"room_id":"!a:b","content":{}}` + "\n"
	res, err := st.Import(ctx, strings.NewReader(in), "wrapped", roomstate.ImportOptions{KeepGoing: true})
	require.NoError(t, err)
	require.Len(t, res.Refused, 3)
	for _, r := range res.Refused[:2] {
		require.ErrorIs(t, r, pdu.ErrMalformedPDU)
		require.Contains(t, r.Error(), `an array of events under "chunk"`)
	}
	require.Contains(t, res.Refused[2].Error(), "no type")

	// A real export's wrapper is longer than a line may be: still named, from the
	// line's head, without the line being read whole.
	var all []string
	for len(strings.Join(all, ",")) <= roomstate.MaxLineBytesForTest {
		all = append(all, lines...)
	}
	for _, key := range []string{"chunk", "pdus"} {
		in := " {\"" + key + "\": [" + strings.Join(all, ",") + "]}\n"
		res, err := st.Import(ctx, strings.NewReader(in), "wrapped-long", roomstate.ImportOptions{KeepGoing: true})
		require.NoError(t, err)
		require.Len(t, res.Refused, 1)
		require.ErrorIs(t, res.Refused[0], pdu.ErrTooLarge)
		require.Contains(t, res.Refused[0].Error(), `it opens a JSON object holding an array under "`+key+`"`)
		require.Contains(t, res.Refused[0].Error(), "jq -c '."+key+"[]'")
	}
	// An over-long PDU-like object names no wrapper.
	in = `{"type":"m.room.message","content":{"body":"` + strings.Repeat("a", roomstate.MaxLineBytesForTest) + `"}}` + "\n"
	res, err = st.Import(ctx, strings.NewReader(in), "long-pdu", roomstate.ImportOptions{KeepGoing: true})
	require.NoError(t, err)
	require.Len(t, res.Refused, 1)
	require.NotContains(t, res.Refused[0].Error(), "it opens a JSON object")
}

// TestImportOverLongPDU: a PDU on a line over the line limit opens with a PDU
// field ("auth_events", first in canonical JSON, holds an array as a wrapper's
// member does): it is refused as a PDU over the size limit, under its top-level
// event_id (not one nested in its content), so that the PDUs naming it are
// refused as following from it.
func TestImportOverLongPDU(t *testing.T) {
	lines := roomLines(t, "room003")
	var ev map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[50]), &ev))
	id := ev["event_id"].(string)
	ev["content"] = map[string]any{"msgtype": "m.text", "event_id": "$nested:server1.test",
		"body": `"quoted\"` + strings.Repeat("a", roomstate.MaxLineBytesForTest)}
	long, err := json.Marshal(ev)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(long, []byte(`{"auth_events":[`)), "%.40s", long)
	in := strings.Join(lines[:50], "\n") + "\n" + string(long) + "\n" + strings.Join(lines[51:], "\n") + "\n"

	st := roomstate.New(packstore.NewMemStorage())
	res, err := st.Import(t.Context(), strings.NewReader(in), "long", roomstate.ImportOptions{KeepGoing: true})
	require.NoError(t, err)
	require.Equal(t, 50, res.Imported)
	require.Len(t, res.Refused, len(lines)-50)
	r := res.Refused[0]
	require.ErrorIs(t, r, pdu.ErrTooLarge)
	require.Equal(t, 51, r.Line)
	require.Equal(t, id, r.EventID)
	require.Contains(t, r.Error(), `its first member, "auth_events", is a PDU field: a PDU over the size limit`)
	require.NotContains(t, r.Error(), "jq")
	require.Equal(t, id, res.Refused[1].Missing)
}
