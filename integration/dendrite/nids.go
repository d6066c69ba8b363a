package dendrite

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/mtxdb/mtxdb/packstore"
)

// nidKind names one NID space. The byte is part of the record IDs and payloads
// (doc.go, "NID records").
type nidKind byte

const (
	kindRoom      nidKind = 'r' // name: room ID
	kindEventType nidKind = 't' // name: event type
	kindStateKey  nidKind = 'k' // name: state key
	kindEvent     nidKind = 'e' // name: u64le(room NID) || event ID
	kindSnapshot  nidKind = 's' // name: u64le(room NID) || HAMT root (16 bytes)
)

// Record kinds and version of the NID collection's payloads.
const (
	recForward  = 'F' // name -> NID
	recReverse  = 'R' // NID -> name
	recCounter  = 'C' // next NID to hand out
	nidVersion  = 1
	headerLen   = 2 // kind byte, version byte
	nidFieldLen = 8 // u64le
)

// nidCollection is the packstore collection holding every NID record.
var nidCollection = hashID("mtxdb/dendrite/nids")

func hashID(parts ...string) packstore.ID {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
	}
	var id packstore.ID
	copy(id[:], h.Sum(nil))
	return id
}

func u64(v int64) string {
	var b [nidFieldLen]byte
	binary.LittleEndian.PutUint64(b[:], uint64(v))
	return string(b[:])
}

func forwardID(k nidKind, name string) packstore.ID {
	return hashID("mtxdb/dendrite/fwd\x00", string(k), name)
}
func reverseID(k nidKind, nid int64) packstore.ID {
	return hashID("mtxdb/dendrite/rev\x00", string(k), u64(nid))
}
func counterID(k nidKind) packstore.ID { return hashID("mtxdb/dendrite/next\x00", string(k)) }

func encodeNID(rec byte, nid int64) []byte {
	return append([]byte{rec, nidVersion}, u64(nid)...)
}

func decodeNID(rec byte, b []byte, what string) (int64, error) {
	if len(b) != headerLen+nidFieldLen || b[0] != rec || b[1] != nidVersion {
		return 0, fmt.Errorf("%w: %s: %d bytes, header %x", ErrCorruptRecord, what, len(b), b[:min(len(b), headerLen)])
	}
	v := int64(binary.LittleEndian.Uint64(b[headerLen:]))
	if v <= 0 {
		return 0, fmt.Errorf("%w: %s: NID %d", ErrCorruptRecord, what, v)
	}
	return v, nil
}

// nidTable is one NID space: a cache over the forward and reverse records of the
// NID collection, and the next NID to assign. Not safe for concurrent use: Storage
// holds its lock around every call.
type nidTable struct {
	kind nidKind
	// floor is the first NID handed out by assignment (NIDs below it are fixed:
	// Dendrite's well-known event types and the empty state key).
	floor int64
	next  int64 // 0 until loaded from the counter record
	fwd   map[string]int64
	rev   map[int64]string
}

func newTable(k nidKind, floor int64) *nidTable {
	return &nidTable{kind: k, floor: floor, fwd: map[string]int64{}, rev: map[int64]string{}}
}

// lookup returns the NID of name, or 0 when none was assigned.
func (t *nidTable) lookup(eng packstore.StorageEngine, name string) (int64, error) {
	if nid, ok := t.fwd[name]; ok {
		return nid, nil
	}
	b, err := eng.Get(nidCollection, forwardID(t.kind, name))
	if errors.Is(err, packstore.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("mtxdb/dendrite: %c NID of %q: %w", t.kind, name, err)
	}
	nid, err := decodeNID(recForward, b, fmt.Sprintf("forward record %c %q", t.kind, name))
	if err != nil {
		return 0, err
	}
	t.fwd[name], t.rev[nid] = nid, name
	return nid, nil
}

// get returns the NID of name, assigning the next free one if it has none. An
// assignment writes the forward record, the reverse record and the counter in one
// append batch. On an engine several processes write (packstore.ConditionalPutter:
// PostgreSQL) the batch is a compare-and-set of the counter as stored now, so two
// processes never hand out one NID nor give one name two: the loser of a race reads
// the name (the winner may have assigned it) and the counter again.
//
// On a shared engine the counter is read before the name is looked up: every
// assignment moves the counter, so a compare-and-set that finds the counter as
// read proves that no process assigned anything, this name included, after the
// lookup saw it unassigned. (Looking the name up first let a process that read
// the counter just after another's assignment of the same name give it a second
// NID: TestNIDsTwoProcessesPostgres caught it once under load.)
func (t *nidTable) get(eng packstore.StorageEngine, name string) (int64, error) {
	cp, shared := eng.(packstore.ConditionalPutter)
	for attempt := 0; ; attempt++ {
		if nid, ok := t.fwd[name]; ok { // known here: no counter read (a round trip on PostgreSQL)
			return nid, nil
		}
		var old []byte
		var counterErr error
		if shared {
			old, counterErr = eng.Get(nidCollection, counterID(t.kind))
		}
		nid, err := t.lookup(eng, name)
		if err != nil || nid != 0 {
			return nid, err
		}
		if !shared {
			if err := t.loadCounter(eng); err != nil {
				return 0, err
			}
			nid = t.next
			if err := t.put(eng, name, nid, nid+1, nil); err != nil {
				return 0, err
			}
			t.next = nid + 1
			return nid, nil
		}
		nid = t.floor
		switch err := counterErr; {
		case errors.Is(err, packstore.ErrNotFound):
			old = nil
		case err != nil:
			return 0, fmt.Errorf("mtxdb/dendrite: %c NID counter: %w", t.kind, err)
		default:
			if nid, err = decodeNID(recCounter, old, fmt.Sprintf("counter %c", t.kind)); err != nil {
				return 0, err
			}
			nid = max(nid, t.floor)
		}
		err = t.put(eng, name, nid, nid+1, func(recs []packstore.Record) error {
			return cp.PutManyIf(nidCollection, recs, counterID(t.kind), old)
		})
		if errors.Is(err, packstore.ErrConflict) && attempt < maxNIDAttempts {
			// Another process assigned a NID since the counter was read. Back
			// off a random while, longer after each conflict, so that two
			// processes that keep meeting do not keep colliding.
			time.Sleep(time.Duration(rand.Int64N(int64(min(attempt+1, 20)) * int64(100*time.Microsecond))))
			continue
		}
		if err != nil {
			return 0, err
		}
		return nid, nil
	}
}

// maxNIDAttempts bounds the compare-and-set attempts of one NID assignment.
const maxNIDAttempts = 1000

// fix records name at a fixed NID (below floor) unless it is already there.
func (t *nidTable) fix(eng packstore.StorageEngine, name string, nid int64) error {
	got, err := t.lookup(eng, name)
	if err != nil {
		return err
	}
	if got == nid {
		return nil
	}
	if got != 0 {
		return fmt.Errorf("%w: %c %q has NID %d, Dendrite fixes it at %d", ErrCorruptRecord, t.kind, name, got, nid)
	}
	return t.put(eng, name, nid, 0, nil)
}

// put writes name's forward and reverse records and, unless next is 0, the counter,
// in one batch: through write when it is not nil (a compare-and-set), else PutMany.
func (t *nidTable) put(eng packstore.StorageEngine, name string, nid, next int64, write func([]packstore.Record) error) error {
	recs := []packstore.Record{
		{ID: forwardID(t.kind, name), Data: encodeNID(recForward, nid)},
		{ID: reverseID(t.kind, nid), Data: append([]byte{recReverse, nidVersion}, name...)},
	}
	if next != 0 {
		recs = append(recs, packstore.Record{ID: counterID(t.kind), Data: encodeNID(recCounter, next)})
	}
	if write == nil {
		write = func(recs []packstore.Record) error { return eng.PutMany(nidCollection, recs) }
	}
	if err := write(recs); err != nil {
		return fmt.Errorf("mtxdb/dendrite: assign %c NID %d to %q: %w", t.kind, nid, name, err)
	}
	t.fwd[name], t.rev[nid] = nid, name
	return nil
}

// loadCounter reads the counter record once. A batch that was only partly
// written (forward and reverse records but not the counter) cannot make a NID be
// handed out twice: the counter is moved past every NID that has a reverse record.
func (t *nidTable) loadCounter(eng packstore.StorageEngine) error {
	if t.next != 0 {
		return nil
	}
	next := t.floor
	b, err := eng.Get(nidCollection, counterID(t.kind))
	switch {
	case errors.Is(err, packstore.ErrNotFound):
	case err != nil:
		return fmt.Errorf("mtxdb/dendrite: %c NID counter: %w", t.kind, err)
	default:
		if next, err = decodeNID(recCounter, b, fmt.Sprintf("counter %c", t.kind)); err != nil {
			return err
		}
		next = max(next, t.floor)
	}
	for {
		_, err := eng.Get(nidCollection, reverseID(t.kind, next))
		if errors.Is(err, packstore.ErrNotFound) {
			break
		}
		if err != nil {
			return fmt.Errorf("mtxdb/dendrite: %c NID counter probe %d: %w", t.kind, next, err)
		}
		next++
	}
	t.next = next
	return nil
}

// name returns the name a NID was assigned to; ErrUnknownNID if none.
func (t *nidTable) name(eng packstore.StorageEngine, nid int64) (string, error) {
	if name, ok := t.rev[nid]; ok {
		return name, nil
	}
	b, err := eng.Get(nidCollection, reverseID(t.kind, nid))
	if errors.Is(err, packstore.ErrNotFound) {
		return "", fmt.Errorf("%w: %c NID %d", ErrUnknownNID, t.kind, nid)
	}
	if err != nil {
		return "", fmt.Errorf("mtxdb/dendrite: %c NID %d: %w", t.kind, nid, err)
	}
	if len(b) < headerLen || b[0] != recReverse || b[1] != nidVersion {
		return "", fmt.Errorf("%w: reverse record %c %d: header %x", ErrCorruptRecord, t.kind, nid, b[:min(len(b), headerLen)])
	}
	name := string(b[headerLen:])
	t.fwd[name], t.rev[nid] = nid, name
	return name, nil
}
