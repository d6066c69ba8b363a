// Package enginetest is the conformance suite of storage.Engine: the
// cases about the interface (no files, no crashes), run against every engine (packstore's PackfileStorage and
// MemStorage in packstore's tests, pgstore over a real PostgreSQL in pgstore's).
//
// Run drives fixed cases (owned copies, empty payloads, supersede, GetMany order
// and absences, DeleteCollection, Repack validation and dropping, Close) and a
// model-based random test against a plain map (seed printed on failure; set it
// with -enginetest.seed, the length with -enginetest.steps). Engines that
// implement storage.ConditionalPutter also get its compare-and-set cases,
// including writers racing on one record.
package enginetest

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/mtxdb/mtxdb/internal/storage"
	"github.com/mtxdb/mtxdb/internal/testseed"
)

// ID is storage.ID (packstore.ID), the 16-byte collection or record ID every engine takes.
type ID = storage.ID

// Engine is what the suite drives: the StorageEngine plus the repack and
// listing operations every implementation offers.
type Engine interface {
	storage.Engine
	Repack(storage.RepackPlan) (storage.RepackStats, error)
	CollectionRecords(ID) ([]ID, error)
}

// Open returns a fresh, empty engine for one subtest; it registers its own
// cleanup. Reopen, when not nil, closes e and opens the same store again (the
// model test then checks that everything survived); engines without a notion of
// reopening pass nil.
type Open func(t *testing.T) Engine

// Reopen closes an engine and opens the same store again.
type Reopen func(t *testing.T, e Engine) Engine

var (
	seedFlag  = flag.Uint64("enginetest.seed", 0, "seed of the enginetest model test (0: time-based, printed)")
	stepsFlag = flag.Int("enginetest.steps", 0, "steps of the enginetest model test (0: 1500, 300 with -short)")
)

// ident returns a deterministic 16-byte ID: SHA-256 of (group, n), truncated.
func ident(group byte, n int) ID {
	var in [9]byte
	in[0] = group
	binary.LittleEndian.PutUint64(in[1:], uint64(n))
	sum := sha256.Sum256(in[:])
	return ID(sum[:16])
}

// blob returns n bytes: random, or (text) a JSON-like run that compresses.
func blob(r *rand.Rand, n int, text bool) []byte {
	out := make([]byte, 0, n)
	if text {
		for len(out) < n {
			out = fmt.Appendf(out, `{"k":%d}`, r.IntN(10))
		}
		return out[:n]
	}
	for len(out) < n {
		out = binary.LittleEndian.AppendUint64(out, r.Uint64())
	}
	return out[:n]
}

// expect checks one record: want nil means absent (ErrNotFound).
func expect(t testing.TB, e storage.Engine, coll, id ID, want []byte) {
	t.Helper()
	got, err := e.Get(coll, id)
	switch {
	case want == nil && !errors.Is(err, storage.ErrNotFound):
		t.Fatalf("Get(%s, %s) = %d bytes, %v; want ErrNotFound", coll, id, len(got), err)
	case want != nil && err != nil:
		t.Fatalf("Get(%s, %s): %v", coll, id, err)
	case want != nil && (got == nil || !bytes.Equal(got, want)):
		t.Fatalf("Get(%s, %s) = %d bytes (nil %v), want %d bytes", coll, id, len(got), got == nil, len(want))
	}
}

func sorted(ids ...ID) []ID {
	slices.SortFunc(ids, ID.Compare)
	return ids
}

// c1 and c2 are the collections the fixed cases write.
var c1, c2 = ident(1, 1), ident(1, 2)

// Run runs the whole suite; each subtest calls open for a fresh engine.
func Run(t *testing.T, open Open, reopen Reopen) {
	r := rand.New(rand.NewPCG(1, 2))
	t.Run("PutGet", func(t *testing.T) { casePutGet(t, open(t), r) })
	t.Run("NotFound", func(t *testing.T) { caseNotFound(t, open(t)) })
	t.Run("GetMany", func(t *testing.T) { caseGetMany(t, open(t), r) })
	t.Run("Supersede", func(t *testing.T) { caseSupersede(t, open(t)) })
	t.Run("DeleteCollection", func(t *testing.T) { caseDeleteCollection(t, open(t)) })
	t.Run("Repack", func(t *testing.T) { caseRepack(t, open(t)) })
	t.Run("Closed", func(t *testing.T) { caseClosed(t, open(t)) })
	t.Run("Model", func(t *testing.T) { runModel(t, open, reopen) })
	t.Run("ConditionalPut", func(t *testing.T) {
		e := open(t)
		if _, ok := e.(storage.ConditionalPutter); !ok {
			t.Skip("engine has one writer per store: no storage.ConditionalPutter")
		}
		runConditional(t, e)
	})
}

// casePutGet checks Put and Get of small, large and empty payloads; Get returns an
// owned copy and Put copies its input; a record written again with the same bytes
// stays one record.
func casePutGet(t *testing.T, e Engine, r *rand.Rand) {
	small, big, empty := blob(r, 10, false), blob(r, 5000, true), []byte{}
	for i, d := range [][]byte{small, big, empty} {
		if err := e.Put(c1, ident(2, i), d); err != nil {
			t.Fatal(err)
		}
	}
	expect(t, e, c1, ident(2, 0), small)
	expect(t, e, c1, ident(2, 1), big)
	expect(t, e, c1, ident(2, 2), empty) // non-nil and empty
	// Owned copy: mutating the result does not change the store.
	got, _ := e.Get(c1, ident(2, 0))
	got[0] ^= 0xff
	expect(t, e, c1, ident(2, 0), small)
	// Mutating the caller's buffer after Put does not either.
	buf := []byte("abc")
	if err := e.Put(c1, ident(2, 9), buf); err != nil {
		t.Fatal(err)
	}
	buf[0] = 'x'
	expect(t, e, c1, ident(2, 9), []byte("abc"))
	// Re-writing a record with the same bytes (a content-addressed
	// record stored twice) is harmless.
	if err := e.PutMany(c1, []storage.Record{{ID: ident(2, 1), Data: big}, {ID: ident(2, 0), Data: small}}); err != nil {
		t.Fatal(err)
	}
	expect(t, e, c1, ident(2, 1), big)
	if ids, err := e.CollectionRecords(c1); err != nil || len(ids) != 4 {
		t.Fatalf("CollectionRecords = %d ids, %v; want 4", len(ids), err)
	}
}

// caseNotFound checks that Get of a record never written, in a known and an
// unknown collection, is ErrNotFound.
func caseNotFound(t *testing.T, e Engine) {
	expect(t, e, c1, ident(2, 0), nil)
	if err := e.Put(c1, ident(2, 0), []byte("x")); err != nil {
		t.Fatal(err)
	}
	expect(t, e, c1, ident(2, 1), nil)
	expect(t, e, c2, ident(2, 0), nil)
}

// caseGetMany checks that GetMany answers in the order asked: nil for absent
// records, a separate copy for an ID asked twice, all nil for an unknown
// collection, nothing for nothing.
func caseGetMany(t *testing.T, e Engine, r *rand.Rand) {
	var recs []storage.Record
	for i := range 200 {
		recs = append(recs, storage.Record{ID: ident(3, i), Data: blob(r, r.IntN(300), i%2 == 0)})
	}
	if err := e.PutMany(c1, recs); err != nil {
		t.Fatal(err)
	}
	ids := []ID{ident(3, 5), ident(9, 9), ident(3, 199), ident(3, 5), ident(3, 0)}
	got, err := e.GetMany(c1, ids)
	if err != nil || len(got) != len(ids) {
		t.Fatalf("GetMany = %d entries, %v", len(got), err)
	}
	want := [][]byte{recs[5].Data, nil, recs[199].Data, recs[5].Data, recs[0].Data}
	for i := range want {
		if (got[i] == nil) != (want[i] == nil) || !bytes.Equal(got[i], want[i]) {
			t.Fatalf("GetMany[%d] = %d bytes (nil %v), want %d bytes (nil %v)", i, len(got[i]), got[i] == nil, len(want[i]), want[i] == nil)
		}
	}
	if len(got[0]) > 0 {
		got[0][0] ^= 0xff // the two entries for one ID are separate copies
		if !bytes.Equal(got[3], recs[5].Data) {
			t.Fatal("GetMany returned one buffer for an ID asked twice")
		}
	}
	got, err = e.GetMany(c2, ids)
	if err != nil || len(got) != len(ids) || slices.ContainsFunc(got, func(b []byte) bool { return b != nil }) {
		t.Fatalf("GetMany on unknown collection = %v, %v", got, err)
	}
	if got, err := e.GetMany(c1, nil); err != nil || len(got) != 0 {
		t.Fatalf("GetMany of nothing = %v, %v", got, err)
	}
}

// caseSupersede checks that the last write of a record wins, within one PutMany
// too, and that the same record ID in another collection is another record.
func caseSupersede(t *testing.T, e Engine) {
	id := ident(4, 0)
	e.Put(c1, id, []byte("v1"))
	e.Put(c1, id, []byte("v2"))
	expect(t, e, c1, id, []byte("v2"))
	e.PutMany(c1, []storage.Record{{ID: id, Data: []byte("v3")}, {ID: ident(4, 1), Data: []byte("a")}, {ID: id, Data: []byte("v4")}})
	expect(t, e, c1, id, []byte("v4"))
	ids, _ := e.CollectionRecords(c1)
	if len(ids) != 2 {
		t.Fatalf("CollectionRecords = %d ids, want 2", len(ids))
	}
	// Same record ID in another collection is independent.
	e.Put(c2, id, []byte("other"))
	expect(t, e, c1, id, []byte("v4"))
	expect(t, e, c2, id, []byte("other"))
}

// caseDeleteCollection checks that DeleteCollection removes one collection's
// records and leaves the others, that deleting an unknown collection is no error,
// and that the collection can be written again.
func caseDeleteCollection(t *testing.T, e Engine) {
	e.Put(c1, ident(5, 0), []byte("a"))
	e.Put(c2, ident(5, 0), []byte("b"))
	if got := e.Collections(); !slices.Equal(got, sorted(c1, c2)) {
		t.Fatalf("Collections = %v", got)
	}
	if err := e.DeleteCollection(c1); err != nil {
		t.Fatal(err)
	}
	if err := e.DeleteCollection(ident(9, 9)); err != nil {
		t.Fatalf("deleting an unknown collection: %v", err)
	}
	expect(t, e, c1, ident(5, 0), nil)
	expect(t, e, c2, ident(5, 0), []byte("b"))
	if got := e.Collections(); !slices.Equal(got, []ID{c2}) {
		t.Fatalf("Collections after delete = %v", got)
	}
	e.Put(c1, ident(5, 1), []byte("new"))
	expect(t, e, c1, ident(5, 0), nil)
	expect(t, e, c1, ident(5, 1), []byte("new"))
}

// caseRepack checks that Repack keeps the listed records of a collection and drops
// the rest, with the stats to match; that a plan listing a missing record, a record
// twice or a collection twice fails before anything changes; and that an empty
// list empties the collection.
func caseRepack(t *testing.T, e Engine) {
	for i := range 50 {
		e.Put(c1, ident(6, i), []byte{byte(i)})
		e.Put(c2, ident(6, i), []byte{byte(i), 2})
	}
	e.Put(c1, ident(6, 3), []byte("v2"))
	keep := []ID{ident(6, 10), ident(6, 3), ident(6, 7)}
	st, err := e.Repack(storage.RepackPlan{Collections: []storage.CollectionPlan{{Collection: c1, Records: keep}}})
	if err != nil {
		t.Fatal(err)
	}
	if st.CollectionsRepacked != 1 || st.RecordsCopied != 3 || st.RecordsDropped != 47 {
		t.Fatalf("stats %+v", st)
	}
	expect(t, e, c1, ident(6, 3), []byte("v2"))
	expect(t, e, c1, ident(6, 10), []byte{10})
	expect(t, e, c1, ident(6, 11), nil)
	expect(t, e, c2, ident(6, 11), []byte{11, 2})
	if ids, _ := e.CollectionRecords(c1); len(ids) != 3 {
		t.Fatalf("after repack %d records, want 3", len(ids))
	}
	// A listed record that does not exist fails before anything changes.
	_, err = e.Repack(storage.RepackPlan{Collections: []storage.CollectionPlan{
		{Collection: c2, Records: []ID{ident(6, 1)}},
		{Collection: c1, Records: []ID{ident(6, 3), ident(6, 11)}},
	}})
	if !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("repack with missing record: %v, want ErrNotFound", err)
	}
	// The error names the collection (the caller leaves that one out and
	// repacks the others), and the record where the engine names one.
	var miss *storage.RepackMissingError
	if !errors.As(err, &miss) || miss.Collection != c1 || (miss.Record != ID{} && miss.Record != ident(6, 11)) {
		t.Fatalf("repack with missing record: %v, want a RepackMissingError naming collection %s", err, c1)
	}
	if ids, _ := e.CollectionRecords(c2); len(ids) != 50 {
		t.Fatalf("failed repack changed c2: %d records", len(ids))
	}
	if _, err := e.Repack(storage.RepackPlan{Collections: []storage.CollectionPlan{{Collection: c1, Records: []ID{ident(6, 3), ident(6, 3)}}}}); err == nil {
		t.Fatal("repack listing a record twice succeeded")
	}
	if _, err := e.Repack(storage.RepackPlan{Collections: []storage.CollectionPlan{{Collection: c1}, {Collection: c1}}}); err == nil {
		t.Fatal("repack listing a collection twice succeeded")
	}
	// An empty list empties the collection.
	if _, err := e.Repack(storage.RepackPlan{Collections: []storage.CollectionPlan{{Collection: c1}}}); err != nil {
		t.Fatal(err)
	}
	expect(t, e, c1, ident(6, 3), nil)
	if got := e.Collections(); !slices.Equal(got, []ID{c2}) {
		t.Fatalf("Collections after emptying repack = %v", got)
	}
}

// caseClosed checks that Get, Put and Sync after Close return ErrClosed.
func caseClosed(t *testing.T, e Engine) {
	e.Put(c1, ident(7, 0), []byte("x"))
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Get(c1, ident(7, 0)); !errors.Is(err, storage.ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
	if err := e.Put(c1, ident(7, 1), nil); !errors.Is(err, storage.ErrClosed) {
		t.Fatalf("Put after Close: %v", err)
	}
	if err := e.Sync(); !errors.Is(err, storage.ErrClosed) {
		t.Fatalf("Sync after Close: %v", err)
	}
}

// runConditional checks PutManyIf: a stale condition writes nothing, and
// writers racing to increment one counter record never lose an increment.
func runConditional(t *testing.T, e Engine) {
	cp := e.(storage.ConditionalPutter)
	c, head, other := ident(8, 0), ident(8, 1), ident(8, 2)
	put := func(old, data []byte, extra ...storage.Record) error {
		return cp.PutManyIf(c, append(extra, storage.Record{ID: head, Data: data}), head, old)
	}
	if err := put(nil, []byte("h1"), storage.Record{ID: other, Data: []byte("o1")}); err != nil {
		t.Fatalf("create with absent condition: %v", err)
	}
	expect(t, e, c, head, []byte("h1"))
	expect(t, e, c, other, []byte("o1"))
	for _, old := range [][]byte{nil, []byte("h0"), []byte("")} {
		if err := put(old, []byte("bad"), storage.Record{ID: other, Data: []byte("bad")}); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("PutManyIf with stale condition %q: %v, want ErrConflict", old, err)
		}
	}
	expect(t, e, c, head, []byte("h1"))
	expect(t, e, c, other, []byte("o1")) // nothing of a refused batch is written
	if err := put([]byte("h1"), []byte("h2"), storage.Record{ID: other, Data: []byte("o2")}); err != nil {
		t.Fatal(err)
	}
	expect(t, e, c, head, []byte("h2"))
	expect(t, e, c, other, []byte("o2"))
	if err := cp.PutManyIf(c, []storage.Record{{ID: other, Data: []byte("x")}}, head, []byte("h2")); err == nil || errors.Is(err, storage.ErrConflict) {
		t.Fatalf("PutManyIf without the condition record in the batch: %v, want a usage error", err)
	}

	// Racing increments: each writer reads the counter and writes n+1 under
	// the condition; every success must be one increment.
	ctr := ident(8, 3)
	if err := cp.PutManyIf(c, []storage.Record{{ID: ctr, Data: binary.LittleEndian.AppendUint64(nil, 0)}}, ctr, nil); err != nil {
		t.Fatal(err)
	}
	const writers, each = 4, 25
	var wg sync.WaitGroup
	var mu sync.Mutex
	conflicts := 0
	errc := make(chan error, writers)
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done := 0; done < each; {
				old, err := e.Get(c, ctr)
				if err != nil {
					errc <- err
					return
				}
				next := binary.LittleEndian.AppendUint64(nil, binary.LittleEndian.Uint64(old)+1)
				err = cp.PutManyIf(c, []storage.Record{{ID: ctr, Data: next}}, ctr, old)
				switch {
				case errors.Is(err, storage.ErrConflict):
					mu.Lock()
					conflicts++
					mu.Unlock()
				case err != nil:
					errc <- err
					return
				default:
					done++
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	got, err := e.Get(c, ctr)
	if err != nil {
		t.Fatal(err)
	}
	if n := binary.LittleEndian.Uint64(got); n != writers*each {
		t.Fatalf("counter = %d after %d acknowledged increments (%d conflicts): an update was lost", n, writers*each, conflicts)
	}
	t.Logf("%d increments, %d conflicts retried", writers*each, conflicts)
}

// model is the reference: collection -> record -> payload.
type model map[ID]map[ID][]byte

// verify compares the engine with the model: the collection list, each
// collection's record IDs, and every payload through one GetMany per
// collection.
func (m model) verify(t *testing.T, e Engine, seed uint64, step int) {
	t.Helper()
	var colls []ID
	for c := range m {
		colls = append(colls, c)
	}
	slices.SortFunc(colls, ID.Compare)
	if got := e.Collections(); !slices.Equal(got, colls) {
		t.Fatalf("seed %d step %d: Collections = %v, model %v", seed, step, got, colls)
	}
	for _, c := range colls {
		var ids []ID
		for id := range m[c] {
			ids = append(ids, id)
		}
		slices.SortFunc(ids, ID.Compare)
		listed, err := e.CollectionRecords(c)
		slices.SortFunc(listed, ID.Compare)
		if err != nil || !slices.Equal(listed, ids) {
			t.Fatalf("seed %d step %d: collection %s lists %d records (%v), model %d", seed, step, c, len(listed), err, len(ids))
		}
		got, err := e.GetMany(c, ids)
		if err != nil {
			t.Fatalf("seed %d step %d: GetMany: %v", seed, step, err)
		}
		for i, id := range ids {
			if !bytes.Equal(got[i], m[c][id]) {
				t.Fatalf("seed %d step %d: record %s/%s = %d bytes, model %d", seed, step, c, id, len(got[i]), len(m[c][id]))
			}
		}
	}
}

// runModel applies random operations to the engine and to a model and compares
// them after every read and at the end.
func runModel(t *testing.T, open Open, reopen Reopen) {
	seed := testseed.Seed(t, "enginetest.seed", *seedFlag, "")
	steps := 1500
	if testing.Short() {
		steps = 300
	}
	if *stepsFlag > 0 {
		steps = *stepsFlag
	}
	t.Logf("%d steps (-enginetest.steps)", steps)
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	mr := &modelRun{t: t, e: open(t), m: model{}, r: r, seed: seed, colls: make([]ID, 5)}
	for i := range mr.colls {
		mr.colls[i] = ident(20, int(r.Uint32()))
	}
	for step := range steps {
		mr.step = step
		switch op := r.IntN(100); {
		case op < 30:
			mr.put()
		case op < 45:
			mr.putMany()
		case op < 62:
			mr.get()
		case op < 74:
			mr.getMany()
		case op < 78:
			mr.deleteCollection()
		case op < 88:
			mr.repack()
		case op < 93:
			if err := mr.e.Sync(); err != nil {
				mr.fatalf("Sync: %v", err)
			}
		case op < 96 && reopen != nil:
			mr.e = reopen(t, mr.e)
			mr.m.verify(t, mr.e, seed, step)
		default:
			mr.m.verify(t, mr.e, seed, step)
		}
	}
	mr.m.verify(t, mr.e, seed, steps)
}

// modelRun is one run of the model test: the engine, the model it must match, the
// random source that picks each operation, and the step being run.
type modelRun struct {
	t     *testing.T
	e     Engine
	m     model
	r     *rand.Rand
	colls []ID // the collections written
	seed  uint64
	step  int
}

// perColl is how many record IDs each collection draws from: enough repeats to
// supersede.
const perColl = 60

// rec picks a collection and a record ID.
func (mr *modelRun) rec() (ID, ID) {
	return mr.colls[mr.r.IntN(len(mr.colls))], ident(21, mr.r.IntN(perColl))
}

// write records a write in the model.
func (mr *modelRun) write(c, id ID, d []byte) {
	if mr.m[c] == nil {
		mr.m[c] = map[ID][]byte{}
	}
	mr.m[c][id] = d
}

// fatalf fails the test naming the seed and the step.
func (mr *modelRun) fatalf(format string, args ...any) {
	mr.t.Helper()
	mr.t.Fatalf("seed %d step %d: "+format, append([]any{mr.seed, mr.step}, args...)...)
}

// put writes one record of random bytes or text.
func (mr *modelRun) put() {
	c, id := mr.rec()
	d := blob(mr.r, mr.r.IntN(600), mr.r.IntN(2) == 0)
	if err := mr.e.Put(c, id, d); err != nil {
		mr.fatalf("Put: %v", err)
	}
	mr.write(c, id, d)
}

// putMany writes a batch of 1-25 records to one collection (an ID may repeat).
func (mr *modelRun) putMany() {
	c, _ := mr.rec()
	batch := make([]storage.Record, 1+mr.r.IntN(25))
	for i := range batch {
		_, id := mr.rec()
		batch[i] = storage.Record{ID: id, Data: blob(mr.r, mr.r.IntN(400), mr.r.IntN(2) == 0)}
	}
	if err := mr.e.PutMany(c, batch); err != nil {
		mr.fatalf("PutMany: %v", err)
	}
	for _, b := range batch {
		mr.write(c, b.ID, b.Data)
	}
}

// get reads one record and compares it with the model.
func (mr *modelRun) get() {
	c, id := mr.rec()
	want, ok := mr.m[c][id]
	got, err := mr.e.Get(c, id)
	if ok && (err != nil || !bytes.Equal(got, want)) || !ok && !errors.Is(err, storage.ErrNotFound) {
		mr.fatalf("Get = %d bytes, %v; model has it: %v", len(got), err, ok)
	}
}

// getMany reads 1-40 records of one collection and compares them with the model.
func (mr *modelRun) getMany() {
	c, _ := mr.rec()
	ids := make([]ID, 1+mr.r.IntN(40))
	for i := range ids {
		_, ids[i] = mr.rec()
	}
	got, err := mr.e.GetMany(c, ids)
	if err != nil || len(got) != len(ids) {
		mr.fatalf("GetMany = %d entries, %v", len(got), err)
	}
	for i, id := range ids {
		want, ok := mr.m[c][id]
		if ok != (got[i] != nil) || !bytes.Equal(got[i], want) {
			mr.fatalf("GetMany[%d] = %d bytes, model has it: %v", i, len(got[i]), ok)
		}
	}
}

// deleteCollection deletes one collection.
func (mr *modelRun) deleteCollection() {
	c, _ := mr.rec()
	if err := mr.e.DeleteCollection(c); err != nil {
		mr.fatalf("DeleteCollection: %v", err)
	}
	delete(mr.m, c)
}

// repack repacks one or two collections, keeping a random subset in a random
// order, and checks the records dropped.
func (mr *modelRun) repack() {
	r, m := mr.r, mr.m
	var plan storage.RepackPlan
	dropped := 0
	for _, c := range mr.colls[:1+r.IntN(2)] {
		if r.IntN(2) == 0 {
			continue
		}
		var keep []ID
		for id := range m[c] {
			if r.IntN(3) > 0 {
				keep = append(keep, id)
			}
		}
		slices.SortFunc(keep, ID.Compare)
		r.Shuffle(len(keep), func(i, j int) { keep[i], keep[j] = keep[j], keep[i] })
		plan.Collections = append(plan.Collections, storage.CollectionPlan{Collection: c, Records: keep})
		dropped += len(m[c]) - len(keep)
	}
	st, err := mr.e.Repack(plan)
	if err != nil {
		mr.fatalf("Repack: %v", err)
	}
	if st.RecordsDropped != dropped {
		mr.fatalf("Repack dropped %d, model %d", st.RecordsDropped, dropped)
	}
	for _, cp := range plan.Collections {
		kept := map[ID][]byte{}
		for _, id := range cp.Records {
			kept[id] = m[cp.Collection][id]
		}
		if len(kept) == 0 {
			delete(m, cp.Collection)
		} else {
			m[cp.Collection] = kept
		}
	}
}
