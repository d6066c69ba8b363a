package packstore

import (
	"bytes"
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/mtxdb/mtxdb/internal/testseed"
)

var longFlag = flag.Bool("packstore.long", false, "run the long versions of exhaustive tests (env PACKSTORE_LONG=1 also works)")

// long reports whether exhaustive tests should cover every case rather
// than a sample (make crash / make fuzz set it).
func long() bool { return *longFlag || os.Getenv("PACKSTORE_LONG") != "" }

// sampled returns the offsets 0..n-1 to test: all of them in long mode,
// otherwise every offset below dense plus every stride-th one and the last.
func sampled(n, dense, stride int) []int {
	var out []int
	for o := 0; o < n; o++ {
		if long() || o < dense || o%stride == 0 || o == n-1 {
			out = append(out, o)
		}
	}
	return out
}

var seedFlag = flag.Uint64("packstore.seed", 0, "seed for randomized packstore tests (0: time-based; env PACKSTORE_SEED also works)")

// testSeed returns the seed for a randomized test and logs it so that a
// failure can be replayed with -packstore.seed=N or PACKSTORE_SEED=N.
func testSeed(t testing.TB) uint64 {
	t.Helper()
	return testseed.Seed(t, "packstore.seed", *seedFlag, "PACKSTORE_SEED")
}

func randID(r *rand.Rand) ID {
	var id ID
	for i := range id {
		id[i] = byte(r.Uint32())
	}
	return id
}

// idN returns a deterministic ID whose bytes spread over the index.
func idN(prefix byte, n int) ID {
	var id ID
	id[0] = prefix
	r := rand.New(rand.NewPCG(uint64(prefix), uint64(n)))
	for i := 1; i < len(id); i++ {
		id[i] = byte(r.Uint32())
	}
	return id
}

// payload returns n bytes; compressible ones repeat a short pattern.
func payload(r *rand.Rand, n int, compressible bool) []byte {
	b := make([]byte, n)
	if compressible {
		pat := []byte("{\"type\":\"m.room.member\",\"content\":{}}")
		for i := range b {
			b[i] = pat[i%len(pat)]
		}
		if n > 0 {
			b[r.IntN(n)] = byte(r.Uint32())
		}
		return b
	}
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func openStore(t testing.TB, opts Options) *PackfileStorage {
	t.Helper()
	s, err := Open(opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", opts.Dir, err)
	}
	return s
}

func mustCheck(t testing.TB, s *PackfileStorage) {
	t.Helper()
	if err := s.Check(); err != nil {
		t.Fatalf("Check: %v", err)
	}
}

func mustGet(t testing.TB, e StorageEngine, coll, id ID, want []byte) {
	t.Helper()
	got, err := e.Get(coll, id)
	if err != nil {
		t.Fatalf("Get(%s, %s): %v", coll, id, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Get(%s, %s) = %d bytes, want %d bytes", coll, id, len(got), len(want))
	}
}

func mustNotFound(t testing.TB, e StorageEngine, coll, id ID) {
	t.Helper()
	if got, err := e.Get(coll, id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get(%s, %s) = %d bytes, %v; want ErrNotFound", coll, id, len(got), err)
	}
}

func shardPath(dir string, id uint16) string { return dir + "/" + shardFileName(id) }

// envInt returns the integer in environment variable name, or def when it
// is unset or not a number (the knobs make crash sets).
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return n
	}
	return def
}

// framesEnd returns where the frames of a shard file's bytes end: at the
// file's end, or where the zeros the writer writes ahead of them start.
func framesEnd(t testing.TB, b []byte) int64 {
	t.Helper()
	off := int64(HeaderSize)
	for off < int64(len(b)) && !allZero(b[off:]) {
		fv, err := decodeFrame(b[off:])
		if err != nil {
			t.Fatalf("frame at %d: %v", off, err)
		}
		off += int64(fv.Size)
	}
	return off
}
