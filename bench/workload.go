package main

import (
	"encoding/binary"
	"math/rand/v2"
)

// The one workload description every engine runs. A record is derived from
// (seed, index) alone, so a child process can regenerate any record to check
// what an engine returns without keeping the data set in memory.
//
// Sizes (HAMT-node-like mix, mean about 520 B):
//
//	20%  64..255 B    (small leaf / pointer nodes)
//	60%  256..767 B   (typical nodes)
//	20%  768..1023 B  (full nodes)
//
// Content: CompressiblePct of the records are Matrix-like text built from a
// small vocabulary (state keys, user IDs, event types; zstd shrinks them
// several-fold), the rest are uniformly random bytes (content hashes, which
// no compressor shrinks). The run reports the zstd ratio it measured.
//
// Keys: record IDs are 16 random bytes (content-hash-like, so inserts land
// all over a B-tree's key space, as HAMT node IDs do). Collection IDs are 16
// bytes; a record's collection is drawn uniformly from the configured count
// (1 or 32), the record itself (ID, size, bytes) is the same in both shapes.
const CompressiblePct = 50

var vocab = []string{
	`{"type":"m.room.member","state_key":"`, `@alice:example.org`, `@bob:matrix.org`,
	`"membership":"join"`, `"membership":"leave"`, `"content":{`, `"sender":"`,
	`m.room.power_levels`, `m.room.join_rules`, `m.room.history_visibility`,
	`"origin_server_ts":`, `"depth":`, `"prev_events":["$`, `"auth_events":["$`,
	`"displayname":"`, `"avatar_url":"mxc://example.org/`, `},`, `"]`, `":`, `,`,
}

type rec struct {
	Coll int
	ID   [16]byte
	Data []byte
}

// recordAt returns record i of the workload with seed for colls collections.
func recordAt(seed uint64, i int, colls int) rec {
	r := rand.New(rand.NewPCG(seed, uint64(i)))
	var id [16]byte
	binary.LittleEndian.PutUint64(id[0:], r.Uint64())
	binary.LittleEndian.PutUint64(id[8:], r.Uint64())
	n := recordSize(r)
	compressible := r.IntN(100) < CompressiblePct
	coll32 := r.IntN(32)
	data := make([]byte, 0, n)
	if compressible {
		for len(data) < n {
			data = append(data, vocab[r.IntN(len(vocab))]...)
			if r.IntN(4) == 0 {
				data = binary.AppendUvarint(data, r.Uint64N(1<<20))
			}
		}
		data = data[:n]
	} else {
		data = data[:n]
		for j := 0; j < n; j += 8 {
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], r.Uint64())
			copy(data[j:], b[:])
		}
	}
	return rec{Coll: coll32 % colls, ID: id, Data: data}
}

func recordSize(r *rand.Rand) int {
	switch u := r.IntN(100); {
	case u < 20:
		return 64 + r.IntN(192)
	case u < 80:
		return 256 + r.IntN(512)
	default:
		return 768 + r.IntN(256)
	}
}

// sizeOf is recordAt(seed, i, 1).Data's length without building the data.
func sizeOf(seed uint64, i int) int {
	r := rand.New(rand.NewPCG(seed, uint64(i)))
	r.Uint64()
	r.Uint64()
	return recordSize(r)
}

// recordsFor returns how many records make at least payload bytes.
func recordsFor(seed uint64, payload int64) int {
	var sum int64
	i := 0
	for sum < payload {
		sum += int64(sizeOf(seed, i))
		i++
	}
	return i
}

// collID is the 16-byte ID (and key prefix) of collection c.
func collID(c int) [16]byte {
	var id [16]byte
	copy(id[:], "mtxbench-coll")
	binary.BigEndian.PutUint16(id[14:], uint16(c))
	return id
}

// prefixedKey is collection ID + record ID, for engines with one key space.
func prefixedKey(c int, id [16]byte) []byte {
	k := make([]byte, 32)
	cid := collID(c)
	copy(k, cid[:])
	copy(k[16:], id[:])
	return k
}
