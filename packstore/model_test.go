package packstore

import (
	"bytes"
	"errors"
	"flag"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// model is the reference: a plain map of collections to records.
type model map[ID]map[ID][]byte

func (m model) put(coll, id ID, data []byte) {
	if m[coll] == nil {
		m[coll] = make(map[ID][]byte)
	}
	m[coll][id] = append([]byte{}, data...)
}

// compareAll checks every collection and record of the model against e.
func compareAll(t *testing.T, e *PackfileStorage, m model, when string) {
	t.Helper()
	var want []ID
	for c, recs := range m {
		if len(recs) > 0 {
			want = append(want, c)
		}
	}
	slices.SortFunc(want, ID.Compare)
	if got := e.Collections(); !slices.Equal(got, want) {
		t.Fatalf("%s: Collections = %d ids, want %d", when, len(got), len(want))
	}
	for c, recs := range m {
		ids, err := e.CollectionRecords(c)
		if err != nil {
			t.Fatalf("%s: CollectionRecords: %v", when, err)
		}
		if len(ids) != len(recs) {
			t.Fatalf("%s: collection %s has %d records, model %d", when, c, len(ids), len(recs))
		}
		for _, id := range ids {
			if _, ok := recs[id]; !ok {
				t.Fatalf("%s: collection %s lists %s, absent from model", when, c, id)
			}
		}
		for id, d := range recs {
			got, err := e.Get(c, id)
			if err != nil || !bytes.Equal(got, d) {
				t.Fatalf("%s: Get(%s, %s) = %d bytes, %v; want %d bytes", when, c, id, len(got), err, len(d))
			}
		}
	}
}

// recordPool returns the IDs a collection draws from: random ones plus
// groups sharing bucket and tag bytes, which force tag collisions.
func recordPool(r *rand.Rand, n int) []ID {
	var ids []ID
	for len(ids) < n {
		base := randID(r)
		ids = append(ids, base)
		if r.IntN(4) == 0 {
			twin := base
			twin[15] ^= 0x5a
			twin[12] = byte(r.Uint32())
			ids = append(ids, twin)
		}
	}
	return ids
}

var stepsFlag = flag.Int("packstore.steps", 0, "steps of TestModelRandom (0: 2500, 500 with -short)")

// history tracks, per record, what a crash may leave: the value acknowledged
// by the last completed Sync (durable) and every value written since
// (unsynced), plus whether the record may be gone since (a delete or a
// repack that dropped it).
type history struct {
	durable model
	since   map[[2]ID][][]byte
	mayGo   map[[2]ID]bool
}

func newHistory() *history {
	return &history{durable: model{}, since: map[[2]ID][][]byte{}, mayGo: map[[2]ID]bool{}}
}

func (h *history) put(c, id ID, d []byte) {
	h.since[[2]ID{c, id}] = append(h.since[[2]ID{c, id}], append([]byte{}, d...))
}

func (h *history) gone(c, id ID) { h.mayGo[[2]ID{c, id}] = true }

// synced records that m is now durable.
func (h *history) synced(m model) {
	h.durable = model{}
	for c, recs := range m {
		for id, d := range recs {
			h.durable.put(c, id, d)
		}
	}
	clear(h.since)
	clear(h.mayGo)
}

// checkCrash compares the store after a crash with the history and returns
// the store's contents as the new model: every record acknowledged by a
// Sync is there byte-exact unless overwritten or removed since; any other
// record present is whole (one of the values written).
func (h *history) checkCrash(t *testing.T, s *PackfileStorage, pools map[ID][]ID, seed uint64, step int) model {
	t.Helper()
	got := model{}
	for c, pool := range pools {
		for _, id := range pool {
			d, err := s.Get(c, id)
			k := [2]ID{c, id}
			want, durable := h.durable[c][id]
			ok := false
			switch {
			case errors.Is(err, ErrNotFound):
				ok = !durable || h.mayGo[k]
			case err != nil:
			default:
				ok = durable && bytes.Equal(d, want)
				for _, v := range h.since[k] {
					ok = ok || bytes.Equal(d, v)
				}
				got.put(c, id, d)
			}
			if !ok {
				t.Fatalf("seed %d step %d: after crash, Get(%s, %s) = %d bytes, %v; durable %v (%d bytes), %d unsynced values, may be gone %v",
					seed, step, c, id, len(d), err, durable, len(want), len(h.since[k]), h.mayGo[k])
			}
		}
	}
	return got
}

func TestModelRandom(t *testing.T) {
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ffs := newFaultFS()
	opts := Options{Dir: t.TempDir(), MaxShardBytes: 16 << 10, Compress: r.IntN(2) == 0, fs: ffs}
	s := openStore(t, opts)
	h := newHistory()
	crashes := 0
	defer func() { s.Close() }()
	m := model{}
	colls := make([]ID, 6)
	pools := make(map[ID][]ID)
	for i := range colls {
		colls[i] = randID(r)
		pools[colls[i]] = recordPool(r, 40)
	}
	pick := func() (ID, ID) {
		c := colls[r.IntN(len(colls))]
		p := pools[c]
		return c, p[r.IntN(len(p))]
	}
	data := func() []byte { return payload(r, r.IntN(700), r.IntN(2) == 0) }
	steps := 2500
	if testing.Short() {
		steps = 500
	}
	if *stepsFlag > 0 {
		steps = *stepsFlag
	}
	for step := range steps {
		switch op := r.IntN(100); {
		case op < 35:
			c, id := pick()
			d := data()
			if err := s.Put(c, id, d); err != nil {
				t.Fatalf("seed %d step %d: Put: %v", seed, step, err)
			}
			m.put(c, id, d)
			h.put(c, id, d)
		case op < 50:
			c, _ := pick()
			var recs []Record
			for range 1 + r.IntN(20) {
				id := pools[c][r.IntN(len(pools[c]))]
				recs = append(recs, Record{ID: id, Data: data()})
			}
			if err := s.PutMany(c, recs); err != nil {
				t.Fatalf("seed %d step %d: PutMany: %v", seed, step, err)
			}
			for _, rec := range recs {
				m.put(c, rec.ID, rec.Data)
				h.put(c, rec.ID, rec.Data)
			}
		case op < 65:
			c, id := pick()
			got, err := s.Get(c, id)
			want, ok := m[c][id]
			if ok && (err != nil || !bytes.Equal(got, want)) || !ok && !errors.Is(err, ErrNotFound) {
				t.Fatalf("seed %d step %d: Get = %d bytes, %v; model has %v", seed, step, len(got), err, ok)
			}
		case op < 75:
			c, _ := pick()
			ids := make([]ID, 1+r.IntN(30))
			for i := range ids {
				ids[i] = pools[c][r.IntN(len(pools[c]))]
			}
			got, err := s.GetMany(c, ids)
			if err != nil {
				t.Fatalf("seed %d step %d: GetMany: %v", seed, step, err)
			}
			for i, id := range ids {
				want, ok := m[c][id]
				if ok != (got[i] != nil) || !bytes.Equal(got[i], want) {
					t.Fatalf("seed %d step %d: GetMany[%d] mismatch (model has %v)", seed, step, i, ok)
				}
			}
		case op < 79:
			c, _ := pick()
			if err := s.DeleteCollection(c); err != nil {
				t.Fatalf("seed %d step %d: DeleteCollection: %v", seed, step, err)
			}
			for id := range m[c] {
				h.gone(c, id)
			}
			delete(m, c)
		case op < 87:
			plan, bad := randomPlan(r, m, colls, pools)
			st, err := s.Repack(plan)
			if bad {
				if err == nil {
					t.Fatalf("seed %d step %d: invalid repack plan accepted", seed, step)
				}
				break
			}
			if err != nil {
				t.Fatalf("seed %d step %d: Repack: %v", seed, step, err)
			}
			dropped := 0
			for _, cp := range plan.Collections {
				dropped += len(m[cp.Collection]) - len(cp.Records)
				keep := make(map[ID][]byte)
				for _, id := range cp.Records {
					keep[id] = m[cp.Collection][id]
				}
				for id := range m[cp.Collection] {
					if _, ok := keep[id]; !ok {
						h.gone(cp.Collection, id)
					}
				}
				if len(keep) == 0 {
					delete(m, cp.Collection)
				} else {
					m[cp.Collection] = keep
				}
			}
			if st.RecordsDropped != dropped {
				t.Fatalf("seed %d step %d: RecordsDropped %d, model %d", seed, step, st.RecordsDropped, dropped)
			}
		case op < 90:
			if err := s.Sync(); err != nil {
				t.Fatalf("seed %d step %d: Sync: %v", seed, step, err)
			}
			h.synced(m)
		case op < 95:
			// Crash: unsynced bytes are dropped (or, half the time, a
			// random part of them survives) and directory changes not
			// fsynced are undone; then reopen.
			crashes++
			var keep func(string, int64, int64) int64
			if r.IntN(2) == 0 {
				keep = func(_ string, synced, size int64) int64 { return synced + r.Int64N(size-synced+1) }
			}
			ffs.crash()
			s.Close()
			if err := ffs.applyCrash(keep); err != nil {
				t.Fatal(err)
			}
			ffs = newFaultFS()
			opts.fs = ffs
			s = openStore(t, opts)
			if err := s.Check(); err != nil {
				t.Fatalf("seed %d step %d: after crash: %v", seed, step, err)
			}
			m = h.checkCrash(t, s, pools, seed, step)
			compareAll(t, s, m, "after crash")
			// Acknowledged records that came back stay durable; what else
			// survived is on disk but not necessarily fsynced (the next
			// Sync makes it durable).
			durable := model{}
			clear(h.since)
			clear(h.mayGo)
			for c, recs := range m {
				for id, d := range recs {
					if want, ok := h.durable[c][id]; ok && bytes.Equal(want, d) {
						durable.put(c, id, d)
					} else {
						h.put(c, id, d)
						h.gone(c, id)
					}
				}
			}
			h.durable = durable
		default:
			if err := s.Check(); err != nil {
				t.Fatalf("seed %d step %d: before reopen: %v", seed, step, err)
			}
			if err := s.Close(); err != nil {
				t.Fatalf("seed %d step %d: Close: %v", seed, step, err)
			}
			h.synced(m)
			s = openStore(t, opts)
			if err := s.Check(); err != nil {
				t.Fatalf("seed %d step %d: after reopen: %v", seed, step, err)
			}
			compareAll(t, s, m, "after reopen")
		}
	}
	mustCheck(t, s)
	compareAll(t, s, m, "end")
	st := s.Stats()
	t.Logf("end: %+v, %d crashes", st, crashes)
	s.Close()
	s = openStore(t, opts)
	mustCheck(t, s)
	compareAll(t, s, m, "final reopen")
}

// randomPlan builds a repack plan over some collections: a random subset of
// the live records in random order. With small probability it is invalid
// (a record that does not exist); bad reports that.
func randomPlan(r *rand.Rand, m model, colls []ID, pools map[ID][]ID) (RepackPlan, bool) {
	var plan RepackPlan
	bad := false
	for _, c := range colls {
		if r.IntN(3) != 0 {
			continue
		}
		var ids []ID
		for id := range m[c] {
			if r.IntN(4) != 0 {
				ids = append(ids, id)
			}
		}
		slices.SortFunc(ids, ID.Compare)
		r.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		if r.IntN(15) == 0 {
			for _, id := range pools[c] {
				if _, ok := m[c][id]; !ok {
					ids = append(ids, id)
					bad = true
					break
				}
			}
		}
		plan.Collections = append(plan.Collections, CollectionPlan{Collection: c, Records: ids})
	}
	return plan, bad
}

// TestConcurrentReadersDuringRepack reads stable records while a writer
// keeps appending and repacking (which moves them and retires shards).
func TestConcurrentReadersDuringRepack(t *testing.T) {
	seed := testSeed(t)
	r := rand.New(rand.NewPCG(seed, 7))
	s := openStore(t, Options{Dir: t.TempDir(), MaxShardBytes: 8 << 10})
	defer s.Close()
	stable := idN(1, 0)
	var ids []ID
	want := map[ID][]byte{}
	for i := range 100 {
		id := idN(2, i)
		ids = append(ids, id)
		want[id] = payload(r, 50+i, false)
		if err := s.Put(stable, id, want[id]); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rr := rand.New(rand.NewPCG(seed, uint64(g)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := ids[rr.IntN(len(ids))]
				got, err := s.Get(stable, id)
				if err != nil || !bytes.Equal(got, want[id]) {
					errs <- errors.Join(errors.New("Get mismatch"), err)
					return
				}
				many, err := s.GetMany(stable, ids[:10])
				if err != nil || !bytes.Equal(many[3], want[ids[3]]) {
					errs <- errors.Join(errors.New("GetMany mismatch"), err)
					return
				}
			}
		}()
	}
	other := idN(3, 0)
	for i := range 60 {
		s.Put(other, idN(4, i%7), payload(r, 300, false))
		// Superseding a record with the same bytes moves it while its
		// slot changes in place (same table), so the shard the readers'
		// slot pointed to can be retired and its pack ID taken by the
		// next shard while they read (pack IDs are reused).
		for range 5 {
			id := ids[r.IntN(len(ids))]
			if err := s.Put(stable, id, want[id]); err != nil {
				t.Fatal(err)
			}
		}
		plan := RepackPlan{Collections: []CollectionPlan{{Collection: other}}}
		if i%3 == 0 {
			order := slices.Clone(ids)
			r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			plan.Collections = append(plan.Collections, CollectionPlan{Collection: stable, Records: order})
		}
		if _, err := s.Repack(plan); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	mustCheck(t, s)
	if st := s.Stats(); st.Shards > 8 {
		t.Fatalf("repacks left %d shards (%+v), want retirement to keep few", st.Shards, st)
	}
}
