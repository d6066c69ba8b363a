package statetables

import (
	"database/sql"
	"encoding/binary"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/matrix-org/dendrite/roomserver/types"
	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
)

// recordOf returns the decoded snapshot record of a room's seq, read from the
// records themselves (no cache).
func recordOf(t *testing.T, s *Store, room types.RoomNID, seq uint32) snapRecord {
	t.Helper()
	b, err := s.at(ctx, nil).Get(RoomCollection(room), snapshotRecordID(seq))
	if err != nil {
		t.Fatalf("snapshot record seq %d: %v", seq, err)
	}
	sr, err := decodeSnapshotRecord(b, seq)
	if err != nil {
		t.Fatalf("snapshot record seq %d: %v", seq, err)
	}
	return sr
}

// coldCaches empties every cache of s, so that reads go to the records.
func coldCaches(s *Store) {
	s.roots.Purge()
	s.seqs.Purge()
	s.entries.Purge()
	s.layers.purge()
	if s.nodes != nil {
		s.nodes.purge()
	}
}

// checkReopened checks every state of m in s, again with cold caches, closes s
// and returns the store reopened after checking it there too.
func checkReopened(t *testing.T, p place, s *Store, m *model) *Store {
	t.Helper()
	m.check(t, s)
	coldCaches(s)
	m.check(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = p.open()
	m.check(t, s)
	return s
}

// TestChainCheckpoints: with K = 40, a line of 3K+5 one-entry changes (each the
// previous snapshot plus a delta, as Dendrite's AddState makes them) and a branch
// off it are stored as chained records at positions 1..K-1 with a checkpoint at
// every K-th, each based on the snapshot at chainBase of its position (positions
// 16 and 32 skip to 0 and 16); a chained snapshot's nodes are not written; every
// state reads back right with cold caches, after a reopen, and through
// DiffStates and StateLookup.
func TestChainCheckpoints(t *testing.T) {
	eachPlace(t, func(t *testing.T, p place) {
		const limit, room = 40, types.RoomNID(3)
		s := p.open()
		s.chainLimit = limit
		want := map[types.StateSnapshotNID]state{}
		var line []types.StateSnapshotNID
		var prev types.StateBlockNIDs
		cur := state{}
		for i := range 3*limit + 5 {
			e := types.StateEntry{StateKeyTuple: types.StateKeyTuple{EventTypeNID: 2, EventStateKeyNID: types.EventStateKeyNID(1 + i%11)}, EventNID: types.EventNID(100 + i)}
			d, _ := s.BulkInsertStateData(ctx, nil, types.StateEntries{e})
			nid, err := s.InsertState(ctx, nil, room, append(slices.Clone(prev), d))
			if err != nil {
				t.Fatal(err)
			}
			cur = applyDelta(cur, []types.StateEntry{e})
			want[nid], line, prev = cur, append(line, nid), types.StateBlockNIDs{types.StateBlockNID(nid)}
		}
		// A branch: two children of the line's 10th snapshot.
		for j := range 2 {
			e := types.StateEntry{StateKeyTuple: types.StateKeyTuple{EventTypeNID: 3, EventStateKeyNID: 1}, EventNID: types.EventNID(900 + j)}
			d, _ := s.BulkInsertStateData(ctx, nil, types.StateEntries{e})
			nid, err := s.InsertState(ctx, nil, room, types.StateBlockNIDs{types.StateBlockNID(line[9]), d})
			if err != nil {
				t.Fatal(err)
			}
			want[nid] = applyDelta(want[line[9]], []types.StateEntry{e})
		}
		checkpoints, skips := 0, 0
		for i, nid := range line {
			_, seq := splitNID(int64(nid))
			sr := recordOf(t, s, room, seq)
			if sr.pos > 0 {
				if base := recordOf(t, s, room, sr.base); base.pos != chainBase(sr.pos) {
					t.Fatalf("snapshot %d at position %d: base seq %d at position %d, want %d", i, sr.pos, sr.base, base.pos, chainBase(sr.pos))
				}
				if sr.base != seq-1 {
					skips++
				}
			}
			// The first snapshot is made of a delta alone: a checkpoint at 0.
			if wantPos := uint32(i % limit); sr.pos != wantPos {
				t.Fatalf("snapshot %d of the line: chain position %d, want %d", i, sr.pos, wantPos)
			}
			_, err := s.at(ctx, nil).Get(RoomCollection(room), packstore.ID(sr.root))
			if sr.pos == 0 {
				checkpoints++
				if err != nil {
					t.Fatalf("checkpoint %d: root node not written: %v", i, err)
				}
			} else if !errors.Is(err, packstore.ErrNotFound) {
				t.Fatalf("chained snapshot %d: its root node is in the collection (err %v)", i, err)
			}
		}
		if checkpoints != 4 || skips != 6 {
			t.Fatalf("%d checkpoints and %d skipping bases in a line of %d, want 4 and 6", checkpoints, skips, len(line))
		}
		m := &model{byNID: want}
		s = checkReopened(t, p, s, m)
		defer s.Close()
		// Resolution reads of chained snapshots, cold.
		coldCaches(s)
		a, b := line[len(line)-1], line[35]
		keys, events, err := s.DiffStates(ctx, room, []types.StateAtEvent{{BeforeStateSnapshotNID: a}, {BeforeStateSnapshotNID: b}})
		if err != nil {
			t.Fatal(err)
		}
		diff := 0
		for k, v := range want[a] {
			if want[b][k] != v {
				diff++
			}
		}
		if len(keys) != diff {
			t.Fatalf("DiffStates: %d keys, want %d", len(keys), diff)
		}
		for i, k := range keys {
			if events[i][0] != want[a][k] || events[i][1] != want[b][k] {
				t.Fatalf("DiffStates key %v: %v, want %d, %d", k, events[i], want[a][k], want[b][k])
			}
		}
		coldCaches(s)
		look, err := s.StateLookup(ctx, room, types.StateAtEvent{BeforeStateSnapshotNID: a})
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range want[a] {
			if got, err := look(k); err != nil || got != v {
				t.Fatalf("StateLookup %v: %d, %v; want %d", k, got, err, v)
			}
		}
	})
}

// TestCorruptChained: a chained snapshot record damaged one way per row is
// refused with ErrCorrupt naming the snapshot, by every read and by an
// InsertState on top of it, never read as a wrong state.
func TestCorruptChained(t *testing.T) {
	const room = types.RoomNID(1)
	for _, c := range []struct {
		name string
		mess func(b []byte, sr snapRecord, seq uint32) []byte
		want string
	}{
		{"version", func(b []byte, _ snapRecord, _ uint32) []byte { b[1] = 3; return b }, "version 3"},
		{"short header", func(b []byte, _ snapRecord, _ uint32) []byte { return b[:chainedHeaderLen+2] }, "corrupt snapshot record"},
		{"base zero", func(_ []byte, sr snapRecord, seq uint32) []byte { return reencode(sr, seq, 0, sr.pos) }, "base seq 0 not in"},
		{"base not below", func(_ []byte, sr snapRecord, seq uint32) []byte { return reencode(sr, seq, seq, sr.pos) }, "not in [1,"},
		{"base missing", func(_ []byte, sr snapRecord, seq uint32) []byte { return reencode(sr, seq, 1, sr.pos) }, "missing"},
		{"base at the wrong position", func(_ []byte, sr snapRecord, seq uint32) []byte { return reencode(sr, seq, 2, sr.pos) }, "want 2"},
		{"position zero", func(_ []byte, sr snapRecord, seq uint32) []byte { return reencode(sr, seq, sr.base, 0) }, "chain position 0"},
		{"position too far", func(_ []byte, sr snapRecord, seq uint32) []byte { return reencode(sr, seq, sr.base, MaxChainLimit) }, "chain position 65536"},
		{"count too large", func(b []byte, _ snapRecord, _ uint32) []byte {
			return append(binary.AppendUvarint(b[:countAt:countAt], 1<<40), b[countAt+1:]...)
		}, "changes in"},
		{"truncated change", func(b []byte, _ snapRecord, _ uint32) []byte { return b[:len(b)-1] }, "truncated"},
		{"overlong uvarint", func(b []byte, _ snapRecord, _ uint32) []byte {
			return append(append(b[:countAt+1:countAt+1], b[countAt+1]|0x80, 0), b[countAt+2:]...)
		}, "overlong"},
		{"trailing bytes", func(b []byte, _ snapRecord, _ uint32) []byte { return append(b, 0) }, "bytes after"},
		{"root mismatch", func(_ []byte, sr snapRecord, seq uint32) []byte {
			sr.changes = slices.Clone(sr.changes)
			sr.changes[0].Value = eventValue(777777)
			return reencode(sr, seq, sr.base, sr.pos)
		}, "give root"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			s.chainLimit = 8
			// Seq 1 is handed out and never written; seq 2 is a checkpoint,
			// seqs 3, 4, 5 are at positions 1, 2, 3.
			r := s.room(room)
			r.mu.Lock()
			if _, _, _, err := s.nextSeq(ctx, r); err != nil {
				t.Fatal(err)
			}
			r.mu.Unlock()
			var prev types.StateBlockNIDs
			rng := rand.New(rand.NewPCG(1, 2))
			var nids []types.StateSnapshotNID
			for i := range 4 {
				d, _ := s.BulkInsertStateData(ctx, nil, randomDelta(rng, 1+i*3))
				nid, err := s.InsertState(ctx, nil, room, append(slices.Clone(prev), d))
				if err != nil {
					t.Fatal(err)
				}
				nids, prev = append(nids, nid), types.StateBlockNIDs{types.StateBlockNID(nid)}
			}
			const seq = 5 // position 3, base seq 4 (position 2)
			nid := nids[3]
			b, err := s.eng.Get(RoomCollection(room), snapshotRecordID(seq))
			if err != nil {
				t.Fatal(err)
			}
			sr, err := decodeSnapshotRecord(b, seq)
			if _, got := splitNID(int64(nid)); got != seq || err != nil || sr.pos != 3 || sr.base != 4 || len(sr.changes) == 0 || b[countAt] != byte(len(sr.changes)) {
				t.Fatalf("record seq %d of NID %d: %+v, %v; want position 3, base 4", seq, nid, sr, err)
			}
			if err := s.eng.Put(RoomCollection(room), snapshotRecordID(seq), c.mess(slices.Clone(b), sr, seq)); err != nil {
				t.Fatal(err)
			}
			coldCaches(s)
			d, _ := s.BulkInsertStateData(ctx, nil, randomDelta(rng, 2))
			_, err1 := s.State(nid)
			_, err2 := s.BulkSelectStateBlockEntries(ctx, nil, types.StateBlockNIDs{types.StateBlockNID(nid)})
			_, err3 := s.InsertState(ctx, nil, room, types.StateBlockNIDs{types.StateBlockNID(nid), d})
			_, _, err4 := s.DiffStates(ctx, room, []types.StateAtEvent{{BeforeStateSnapshotNID: nid}, {BeforeStateSnapshotNID: nids[0]}})
			for i, err := range []error{err1, err2, err3, err4} {
				if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "snapshot NID") {
					t.Errorf("call %d: err %v, want ErrCorrupt with %q naming the snapshot", i, err, c.want)
				}
			}
		})
	}
}

// countAt is the offset of the change count in TestCorruptChained's record:
// its base distance (1) and position (3) take a byte each.
const countAt = chainedHeaderLen + 2

// reencode encodes sr as the record of seq with another base and position.
func reencode(sr snapRecord, seq, base, pos uint32) []byte {
	b, err := encodeChained(sr.root, seq, base, pos, sr.changes)
	if err != nil {
		panic(err)
	}
	return b
}

// TestReadVersion1Store: a store written as before chained records existed
// (HAMT nodes, 'S' 1 snapshot, 'R' 1 root and 'L' 1 lease records, built here
// by hand from the documented format) reads unchanged, is not rewritten, and new
// snapshots chain onto its snapshots.
func TestReadVersion1Store(t *testing.T) {
	eachPlace(t, func(t *testing.T, p place) {
		const room = types.RoomNID(4)
		coll := RoomCollection(room)
		s := p.open()
		rec := s.at(ctx, nil)
		// Three states, each the one before plus entries, as version 1 wrote them.
		mem := collectNodes{}
		root := hamtstore.EmptyRoot
		want := map[types.StateSnapshotNID]state{}
		cur := state{}
		var recs []packstore.Record
		for seq := uint32(1); seq <= 3; seq++ {
			var ch []hamtstore.Change
			for j := range 40 {
				k := types.StateKeyTuple{EventTypeNID: types.EventTypeNID(seq), EventStateKeyNID: types.EventStateKeyNID(j + 1)}
				cur[k] = types.EventNID(int(seq)*1000 + j)
				ch = append(ch, hamtstore.Change{Key: stateKey(k), Value: eventValue(cur[k])})
			}
			var err error
			if root, err = hamtstore.Apply(mem, nil, root, ch); err != nil {
				t.Fatal(err)
			}
			nid := SnapshotNID(room, seq)
			want[nid] = maps.Clone(cur)
			recs = append(recs,
				packstore.Record{ID: snapshotRecordID(seq), Data: append([]byte{'S', 1}, root[:]...)},
				packstore.Record{ID: rootRecordID(root), Data: binary.LittleEndian.AppendUint64([]byte{'R', 1}, uint64(nid))})
		}
		for id, data := range mem {
			recs = append(recs, packstore.Record{ID: packstore.ID(id), Data: data})
		}
		recs = append(recs, packstore.Record{ID: leaseRecordID, Data: binary.LittleEndian.AppendUint32([]byte{'L', 1}, 1+LeaseStep)})
		if err := rec.PutMany(coll, recs); err != nil {
			t.Fatal(err)
		}
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
		_ = s.Close()
		s = p.open()
		defer s.Close()
		m := &model{byNID: want}
		m.check(t, s)
		// New snapshots chain onto the old ones.
		prev := types.StateBlockNIDs{types.StateBlockNID(SnapshotNID(room, 3))}
		for i := range 5 {
			e := types.StateEntry{StateKeyTuple: types.StateKeyTuple{EventTypeNID: 9, EventStateKeyNID: 1}, EventNID: types.EventNID(5000 + i)}
			d, _ := s.BulkInsertStateData(ctx, nil, types.StateEntries{e})
			nid, err := s.InsertState(ctx, nil, room, append(slices.Clone(prev), d))
			if err != nil {
				t.Fatal(err)
			}
			_, seq := splitNID(int64(nid))
			if sr := recordOf(t, s, room, seq); sr.pos != uint32(i+1) {
				t.Fatalf("new snapshot %d: chain position %d, want %d", i, sr.pos, i+1)
			}
			cur = applyDelta(cur, []types.StateEntry{e})
			want[nid], prev = maps.Clone(cur), types.StateBlockNIDs{types.StateBlockNID(nid)}
		}
		coldCaches(s)
		m.check(t, s)
		for _, r := range recs {
			got, err := s.at(ctx, nil).Get(coll, r.ID)
			if r.ID == leaseRecordID {
				continue
			}
			if err != nil || !slices.Equal(got, r.Data) {
				t.Fatalf("version 1 record %x changed: %x, %v", r.ID[:], got, err)
			}
		}
	})
}

// collectNodes is a NodeStore that keeps every node put.
type collectNodes map[hamtstore.NodeID][]byte

func (c collectNodes) GetNode(id hamtstore.NodeID) ([]byte, error) {
	if b, ok := c[id]; ok {
		return b, nil
	}
	return nil, hamtstore.ErrNotFound
}

func (c collectNodes) PutNodes(nodes []hamtstore.EncodedNode) error {
	for _, n := range nodes {
		c[n.ID] = n.Data
	}
	return nil
}

// TestChainedRecordExample pins doc.go's example of a version 2 snapshot record.
func TestChainedRecordExample(t *testing.T) {
	var root hamtstore.NodeID
	for i := range root {
		root[i] = byte(0xa0 + i)
	}
	key := stateKey(types.StateKeyTuple{EventTypeNID: 5, EventStateKeyNID: 100})
	b, err := encodeChained(root, 7, 6, 3, []hamtstore.Change{{Key: key, Value: eventValue(1000)}})
	if err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte{0x53, 0x02}, root[:]...), 0x01, 0x03, 0x01, 0x05, 0x64, 0xe9, 0x07)
	if !slices.Equal(b, want) || len(b) != 25 {
		t.Fatalf("record %x (%d bytes), want %x", b, len(b), want)
	}
	sr, err := decodeSnapshotRecord(b, 7)
	if err != nil || sr.root != root || sr.base != 6 || sr.pos != 3 || len(sr.changes) != 1 ||
		!slices.Equal(sr.changes[0].Key, key) || sr.changes[0].Value != eventValue(1000) {
		t.Fatalf("decoded %+v, %v", sr, err)
	}
	del, _ := encodeChained(root, 7, 6, 3, []hamtstore.Change{{Key: key, Delete: true}})
	if sr, err := decodeSnapshotRecord(del, 7); err != nil || !sr.changes[0].Delete {
		t.Fatalf("delete: %+v, %v", sr, err)
	}
}

// FuzzSnapshotRecord: any bytes decode to a record or an error, never a panic;
// a chained record that decodes (canonical uvarints only) encodes back to the
// same bytes.
func FuzzSnapshotRecord(f *testing.F) {
	var root hamtstore.NodeID
	key := stateKey(types.StateKeyTuple{EventTypeNID: 5, EventStateKeyNID: 100})
	b, _ := encodeChained(root, 7, 6, 3, []hamtstore.Change{{Key: key, Value: eventValue(1000)}, {Key: key, Delete: true}})
	f.Add(b, uint32(7))
	f.Add(encodeSnapshot(root), uint32(1))
	f.Fuzz(func(t *testing.T, b []byte, seq uint32) {
		sr, err := decodeSnapshotRecord(b, seq)
		if err != nil || sr.pos == 0 {
			return
		}
		again, err := encodeChained(sr.root, seq, sr.base, sr.pos, sr.changes)
		if err != nil {
			t.Fatalf("decoded record %x does not encode: %v", b, err)
		}
		if !slices.Equal(again, b) {
			t.Fatalf("decoded %x, encodes as %x", b, again)
		}
	})
}

// TestMergeChained: a state not made of one snapshot and deltas (two snapshots
// merged, as Dendrite stores the state after several prev events; a whole state
// as one delta) is chained to the room's last snapshot when within
// MergeChainLimit entries of it, and is a checkpoint when further; on
// PostgreSQL a last snapshot whose transaction rolled back is never a base. Every
// state reads back right with cold caches and after a reopen.
func TestMergeChained(t *testing.T) {
	eachPlace(t, func(t *testing.T, p place) {
		const room = types.RoomNID(5)
		s := p.open()
		m := &model{byNID: map[types.StateSnapshotNID]state{}}
		member := func(i int, ev types.EventNID) types.StateEntry {
			return types.StateEntry{StateKeyTuple: types.StateKeyTuple{EventTypeNID: types.MRoomMemberNID, EventStateKeyNID: types.EventStateKeyNID(100 + i)}, EventNID: ev}
		}
		// insert stores blocks (snapshot NIDs, or entries as one delta) in txn and
		// returns the NID and its record's chain position.
		insert := func(txn *sql.Tx, want state, blocks ...any) (types.StateSnapshotNID, uint32) {
			t.Helper()
			var list types.StateBlockNIDs
			for _, b := range blocks {
				switch b := b.(type) {
				case types.StateSnapshotNID:
					list = append(list, types.StateBlockNID(b))
				case []types.StateEntry:
					d, _ := s.BulkInsertStateData(ctx, txn, b)
					list = append(list, d)
				}
			}
			nid, err := s.InsertState(ctx, txn, room, list)
			if err != nil {
				t.Fatal(err)
			}
			if txn == nil {
				m.byNID[nid] = want
				_, seq := splitNID(int64(nid))
				return nid, recordOf(t, s, room, seq).pos
			}
			return nid, 0
		}
		base := state{}
		var entries []types.StateEntry
		for i := range 50 {
			e := member(i, types.EventNID(1+i))
			entries, base[e.StateKeyTuple] = append(entries, e), e.EventNID
		}
		first, pos := insert(nil, base, entries)
		if pos != 0 {
			t.Fatalf("the first state: chain position %d, want a checkpoint", pos)
		}
		ea, eb := member(1, 1001), member(2, 1002)
		a, _ := insert(nil, applyDelta(base, []types.StateEntry{ea}), first, []types.StateEntry{ea})
		b, _ := insert(nil, applyDelta(base, []types.StateEntry{eb}), first, []types.StateEntry{eb})
		merged := applyDelta(base, []types.StateEntry{ea, eb})
		// Blocks are merged in order, the last entry of a key winning: b's own
		// entry for member 1 replaces a's unless a delta sets it again.
		if _, pos := insert(nil, merged, a, b, []types.StateEntry{ea}); pos != 2 {
			t.Fatalf("two snapshots and a delta merged: chain position %d, want 2 (chained to the last snapshot, at 1)", pos)
		}
		whole := applyDelta(merged, []types.StateEntry{member(3, 1003)})
		var wholeEntries []types.StateEntry
		for k, v := range whole {
			wholeEntries = append(wholeEntries, types.StateEntry{StateKeyTuple: k, EventNID: v})
		}
		if _, pos := insert(nil, whole, wholeEntries); pos != 3 {
			t.Fatalf("a whole state one entry from the last: chain position %d, want 3", pos)
		}
		var far []types.StateEntry
		for i := range MergeChainLimit + 1 {
			far = append(far, member(1000+i, types.EventNID(5000+i)))
		}
		if _, pos := insert(nil, applyDelta(whole, far), wholeEntries, far); pos != 0 {
			t.Fatalf("a state %d entries from the last: chain position %d, want a checkpoint", len(far), pos)
		}
		if p.db != nil {
			// A last snapshot of a rolled-back transaction is not a base.
			txn, err := p.db.Begin()
			if err != nil {
				t.Fatal(err)
			}
			eRolled := member(4, 1004)
			insert(txn, nil, a, []types.StateEntry{eRolled})
			if err := txn.Rollback(); err != nil {
				t.Fatal(err)
			}
			next := applyDelta(merged, []types.StateEntry{eRolled, member(5, 1005)})
			if _, pos := insert(nil, next, a, b, []types.StateEntry{ea, eRolled, member(5, 1005)}); pos != 0 {
				t.Fatalf("after a rolled-back last snapshot: chain position %d, want a checkpoint", pos)
			}
		}
		s = checkReopened(t, p, s, m)
		defer s.Close()
	})
}

// TestReplaceSorted: the event NIDs of a state with entries replaced, and a NID
// to remove that the list lacks reported.
func TestReplaceSorted(t *testing.T) {
	for _, c := range []struct {
		ev, gone, added, want []types.EventNID
		ok                    bool
	}{
		{[]types.EventNID{1, 3, 5}, []types.EventNID{3}, []types.EventNID{9}, []types.EventNID{1, 5, 9}, true},
		{[]types.EventNID{1, 3, 5}, nil, []types.EventNID{0, 4}, []types.EventNID{0, 1, 3, 4, 5}, true},
		{[]types.EventNID{1, 3, 5}, []types.EventNID{5, 1}, nil, []types.EventNID{3}, true},
		{[]types.EventNID{1, 3, 5}, []types.EventNID{2}, nil, nil, false},
		{[]types.EventNID{1, 3, 5}, []types.EventNID{7}, nil, nil, false},
		{nil, nil, []types.EventNID{2, 1}, []types.EventNID{1, 2}, true},
	} {
		got, ok := replaceSorted(c.ev, slices.Clone(c.gone), slices.Clone(c.added))
		if ok != c.ok || (ok && !slices.Equal(got, c.want)) {
			t.Errorf("replaceSorted(%v, -%v, +%v) = %v, %v; want %v, %v", c.ev, c.gone, c.added, got, ok, c.want, c.ok)
		}
	}
}
