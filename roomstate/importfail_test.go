package roomstate_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/pdu"

	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomstate"
	"github.com/mtxdb/mtxdb/testrooms"
)

// failingPuts is a MemStorage whose PutMany fails from the failAt-th call on (or
// whose Sync fails, with failSync).
type failingPuts struct {
	*packstore.MemStorage
	calls, failAt int
	failSync      bool
}

var errInjected = errors.New("injected write failure")

func (f *failingPuts) PutMany(coll packstore.ID, recs []packstore.Record) error {
	f.calls++
	if !f.failSync && f.calls >= f.failAt {
		return errInjected
	}
	return f.MemStorage.PutMany(coll, recs)
}

func (f *failingPuts) Sync() error {
	if f.failSync && f.calls >= f.failAt {
		return errInjected
	}
	return f.MemStorage.Sync()
}

// TestImportFailedBatchNotCounted: when a batch's write or sync fails, Import
// returns the error and ImportResult.Imported counts only the batches stored
// and synced before it, not the failed batch (nor the one staged behind it).
func TestImportFailedBatchNotCounted(t *testing.T) {
	ctx := t.Context()
	b, err := os.ReadFile(filepath.Join(testrooms.Dir(), "real", "room003", "events.jsonl"))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	require.Greater(t, len(lines), 30)
	for _, failSync := range []bool{false, true} {
		eng := &failingPuts{MemStorage: packstore.NewMemStorage(), failAt: 3, failSync: failSync}
		st := roomstate.New(eng)
		res, err := st.Import(ctx, strings.NewReader(string(b)), "room003", roomstate.ImportOptions{BatchSize: 10})
		require.ErrorIs(t, err, errInjected, "failSync %v", failSync)
		require.Equal(t, 20, res.Imported, "failSync %v: two batches of 10 stored before the failure", failSync)
		// A batch's sync runs while the next batch is read and staged: a
		// failed sync is seen when that batch is to be written.
		read := map[bool]int{false: 30, true: 40}[failSync]
		require.Equal(t, read, res.Read, "failSync %v", failSync)
		if !failSync {
			room, err := st.Room(ctx, res.Rooms[0])
			require.NoError(t, err)
			require.Equal(t, uint32(20), room.Head().Events)
			// A re-run on a working engine imports the rest.
			eng.failAt = 1 << 30
			res, err = st.Import(ctx, strings.NewReader(string(b)), "room003", roomstate.ImportOptions{BatchSize: 10})
			require.NoError(t, err)
			require.Equal(t, len(lines)-20, res.Imported)
			require.Equal(t, 20, res.Skipped)
		}
	}
}

// failingReader returns data up to n bytes, then err.
type failingReader struct {
	data []byte
	n    int
	err  error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, f.err
	}
	k := copy(p, f.data[:min(len(f.data), f.n)])
	f.data, f.n = f.data[k:], f.n-k
	return k, nil
}

// TestImportReadErrorMidLine: a read error in the middle of a PDU is returned as
// itself (errors.Is), not as a malformed PDU made of the partial line, and the
// PDUs before it are stored; in JSON lines and in a JSON array.
func TestImportReadErrorMidLine(t *testing.T) {
	ctx := t.Context()
	b, err := os.ReadFile(filepath.Join(testrooms.Dir(), "real", "room003", "events.jsonl"))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	errRead := errors.New("read failed")
	for _, array := range []bool{false, true} {
		in := string(b)
		cut := len(strings.Join(lines[:10], "\n")) + 1 + len(lines[10])/2 // halfway through PDU 11
		if array {
			in = "[" + strings.Join(lines, ",\n") + "]"
			cut = len("[") + len(strings.Join(lines[:10], ",\n")) + 2 + len(lines[10])/2
		}
		st := roomstate.New(packstore.NewMemStorage())
		res, err := st.Import(ctx, &failingReader{data: []byte(in), n: cut, err: errRead}, "cut", roomstate.ImportOptions{})
		require.ErrorIs(t, err, errRead, "array %v", array)
		require.NotErrorIs(t, err, pdu.ErrMalformedPDU, "array %v", array)
		require.Equal(t, 10, res.Imported, "array %v", array)
	}
}

// TestImportCanceled: Import under a canceled context stores nothing and
// returns context.Canceled; the same input imports under a live one.
func TestImportCanceled(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testrooms.Dir(), "real", "room003", "events.jsonl"))
	require.NoError(t, err)
	st := roomstate.New(packstore.NewMemStorage())
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	res, err := st.Import(ctx, strings.NewReader(string(b)), "room003", roomstate.ImportOptions{})
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, res.Imported)
	rooms, err := st.Rooms(t.Context())
	require.NoError(t, err)
	require.Empty(t, rooms)
	_, err = st.Rooms(ctx)
	require.ErrorIs(t, err, context.Canceled)

	res, err = st.Import(t.Context(), strings.NewReader(string(b)), "room003", roomstate.ImportOptions{})
	require.NoError(t, err)
	require.Positive(t, res.Imported)
}
