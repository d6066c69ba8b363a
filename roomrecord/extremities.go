package roomrecord

import (
	"fmt"
	"slices"
	"strings"

	"github.com/mtxdb/mtxdb/packstore"
)

// ExtremityChunk is one forward-extremity chunk record that a version 3 head
// names (see doc.go, "Forward extremities"): a sorted, non-empty part of the
// room's forward extremities, stored under a content-addressed ID.
type ExtremityChunk struct {
	ID    packstore.ID // ExtremityChunkID of the chunk's payload
	Count uint32       // number of event IDs in the chunk
	// EventIDs are the chunk's event IDs, sorted. DecodeHead leaves them nil
	// (the head holds only ID and Count); Head.ReadExtremityChunks fills them.
	EventIDs []string
}

// Layout constants of the forward-extremity chunks (a write policy, not part of
// the format: a reader accepts any partition of the set into inline entries and
// chunks).
const (
	// MaxInlineExtremities is the most forward extremities a head keeps inline
	// before ExtremitySet.Store seals them into a chunk record.
	MaxInlineExtremities = 64
	// ExtremityChunkTarget is the size of the chunks ExtremitySet.Store merges
	// small chunks into; a chunk below half of it counts as small.
	ExtremityChunkTarget = 512
	// smallChunksMax is how many small chunks Store lets accumulate before it
	// merges them.
	smallChunksMax = 8
)

// ExtremityChunkID is the record ID of a forward-extremity chunk with payload b
// (EncodeExtremityChunk): H("mtxdb/fwd\x00" || payload).
func ExtremityChunkID(payload []byte) packstore.ID {
	return hashID([]byte("mtxdb/fwd\x00"), payload)
}

// EncodeExtremityChunk encodes a forward-extremity chunk: 'F' 1 | event_ids strs
// (sorted, distinct, at least one).
func EncodeExtremityChunk(ids []string) []byte { return encodeIDList(kindExtremities, ids) }

// DecodeExtremityChunk decodes the forward-extremity chunk record b that was read
// under ID id, checking that id is the hash of b (ExtremityChunkID), and that its
// event IDs are sorted, distinct and not none. ErrCorruptRecord names the record.
func DecodeExtremityChunk(id packstore.ID, b []byte) ([]string, error) {
	what := "forward-extremity chunk " + id.String()
	ids, err := decodeIDList(b, kindExtremities, what)
	if err != nil {
		return nil, err
	}
	if got := ExtremityChunkID(b); got != id {
		return nil, fmt.Errorf("%w: %s: payload hashes to %s", ErrCorruptRecord, what, got)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: %s: no event IDs", ErrCorruptRecord, what)
	}
	if err := checkSortedDistinct(ids); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorruptRecord, what, err)
	}
	return ids, nil
}

// checkSortedDistinct reports the first pair of ids out of strictly increasing order.
func checkSortedDistinct(ids []string) error {
	for i := 1; i < len(ids); i++ {
		if ids[i-1] >= ids[i] {
			return fmt.Errorf("event IDs %q and %q out of order or repeated", ids[i-1], ids[i])
		}
	}
	return nil
}

// ReadExtremityChunks completes a head DecodeHead returned: it reads each chunk
// the head names with get (get returns the record's bytes or an error, such as
// packstore.ErrNotFound), checks it (DecodeExtremityChunk, the count the head
// gives, no event ID in two places) and sets ForwardExtremities to the sorted
// union of the inline entries and the chunks. A head without chunks is left as it
// is. Errors name the chunk record; corruption wraps ErrCorruptRecord.
func (h *Head) ReadExtremityChunks(get func(packstore.ID) ([]byte, error)) error {
	if len(h.ExtremityChunks) == 0 {
		return nil
	}
	chunks := slices.Clone(h.ExtremityChunks)
	lists := [][]string{h.InlineExtremities}
	for i := range chunks {
		c := &chunks[i]
		b, err := get(c.ID)
		if err != nil {
			return fmt.Errorf("forward-extremity chunk %s (%d of %d the head names): %w", c.ID, i+1, len(chunks), err)
		}
		ids, err := DecodeExtremityChunk(c.ID, b)
		if err != nil {
			return err
		}
		if uint32(len(ids)) != c.Count {
			return fmt.Errorf("%w: forward-extremity chunk %s: %d event IDs, the head says %d", ErrCorruptRecord, c.ID, len(ids), c.Count)
		}
		c.EventIDs = ids
		lists = append(lists, ids)
	}
	all := mergeSorted(lists)
	if err := checkSortedDistinct(all); err != nil {
		return fmt.Errorf("%w: forward extremities of the head and its chunks: %v", ErrCorruptRecord, err)
	}
	h.ExtremityChunks, h.ForwardExtremities = chunks, all
	return nil
}

// mergeSorted merges sorted lists into one sorted list (duplicates kept).
func mergeSorted(lists [][]string) []string {
	n := 0
	for _, l := range lists {
		n += len(l)
	}
	if len(lists) == 2 {
		return merge2(lists[0], lists[1], make([]string, 0, n))
	}
	out := make([]string, 0, n)
	for _, l := range lists {
		out = append(out, l...)
	}
	slices.Sort(out)
	return out
}

// merge2 appends the merge of the sorted lists a and b to dst.
func merge2(a, b, dst []string) []string {
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		if strings.Compare(a[i], b[j]) <= 0 {
			dst = append(dst, a[i])
			i++
		} else {
			dst = append(dst, b[j])
			j++
		}
	}
	dst = append(dst, a[i:]...)
	return append(dst, b[j:]...)
}

// ExtremitySet is a room's forward extremities as one writer keeps them between
// head writes: the inline ones, and the chunk that holds each of the others, so
// that Store rewrites only the chunks that changed. A writer makes one from the
// head it read (NewExtremitySet), changes it (Add, Remove, Set) and lays it out
// into the next head it writes (Store). Not safe for concurrent use; the heads
// Store fills share its chunks' slices, which it never changes.
type ExtremitySet struct {
	inline  map[string]struct{}
	chunks  []*ExtremityChunk          // in head order
	chunkOf map[string]*ExtremityChunk // chunked event ID -> its chunk
	dirty   map[*ExtremityChunk]bool   // chunks that lost a member since Store
	// chunked is the sorted union of the chunks' members as of the last Store
	// (or the head): Store merges it with the inline ones into
	// Head.ForwardExtremities without sorting the whole set again.
	chunked []string
}

// NewExtremitySet returns the forward extremities of h as h stores them: a
// version 1 or 2 head holds them all inline; a version 3 head must be complete
// (Head.ReadExtremityChunks, or a head Store filled).
func NewExtremitySet(h Head) *ExtremitySet {
	s := &ExtremitySet{
		inline:  map[string]struct{}{},
		chunkOf: map[string]*ExtremityChunk{},
		dirty:   map[*ExtremityChunk]bool{},
	}
	inline := h.InlineExtremities
	if len(h.ExtremityChunks) == 0 {
		inline = h.ForwardExtremities
	}
	for _, id := range inline {
		s.inline[id] = struct{}{}
	}
	lists := make([][]string, 0, len(h.ExtremityChunks))
	for i := range h.ExtremityChunks {
		c := h.ExtremityChunks[i]
		s.chunks = append(s.chunks, &c)
		s.own(&c)
		lists = append(lists, c.EventIDs)
	}
	s.chunked = mergeSorted(lists)
	return s
}

// own records c as the chunk of each of its members.
func (s *ExtremitySet) own(c *ExtremityChunk) {
	for _, id := range c.EventIDs {
		s.chunkOf[id] = c
	}
}

// Len is the number of forward extremities.
func (s *ExtremitySet) Len() int { return len(s.inline) + len(s.chunkOf) }

// Add makes id a forward extremity (a no-op if it is one).
func (s *ExtremitySet) Add(id string) {
	if _, ok := s.chunkOf[id]; !ok {
		s.inline[id] = struct{}{}
	}
}

// Remove makes id not a forward extremity (a no-op if it is not one).
func (s *ExtremitySet) Remove(id string) {
	if _, ok := s.inline[id]; ok {
		delete(s.inline, id)
		return
	}
	if c, ok := s.chunkOf[id]; ok {
		delete(s.chunkOf, id)
		s.dirty[c] = true
	}
}

// Set makes the set exactly ids (which need not be sorted).
func (s *ExtremitySet) Set(ids []string) {
	want := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		want[id] = struct{}{}
	}
	for id := range s.inline {
		if _, ok := want[id]; !ok {
			delete(s.inline, id)
		}
	}
	for id := range s.chunkOf {
		if _, ok := want[id]; !ok {
			s.Remove(id)
		}
	}
	for _, id := range ids {
		s.Add(id)
	}
}

// Store lays the set out into h (ForwardExtremities sorted, InlineExtremities,
// ExtremityChunks; the last two nil when no chunk is needed, so that h is written
// as a version 1 or 2 head) and returns the chunk records h names that are new
// and must be written with it. The policy (doc.go, "Forward extremities"):
// a chunk that lost members is rewritten without them (dropped when empty);
// more than MaxInlineExtremities inline entries are sealed into chunks of at most
// ExtremityChunkTarget; once smallChunksMax chunks are below half the
// target, they are merged into chunks of the target size; and when no more than
// MaxInlineExtremities/2 extremities are left, they all go inline again.
func (s *ExtremitySet) Store(h *Head) []packstore.Record {
	var fresh []*ExtremityChunk
	changed := len(s.dirty) > 0
	kept := s.chunks[:0:0]
	for _, c := range s.chunks {
		if !s.dirty[c] {
			kept = append(kept, c)
			continue
		}
		var ids []string
		for _, id := range c.EventIDs {
			if s.chunkOf[id] == c {
				ids = append(ids, id)
			}
		}
		if len(ids) > 0 {
			kept = append(kept, s.newChunk(ids, &fresh))
		}
	}
	clear(s.dirty)
	if len(kept) > 0 && s.Len() <= MaxInlineExtremities/2 {
		// Few extremities left: all inline again, and the head goes back to
		// version 1 or 2.
		for id := range s.chunkOf {
			s.inline[id] = struct{}{}
		}
		clear(s.chunkOf)
		kept, s.chunked, fresh, changed = nil, nil, nil, false
	}
	if changed {
		s.chunked = slices.DeleteFunc(slices.Clone(s.chunked), func(id string) bool { return s.chunkOf[id] == nil })
	}
	inline := s.sortedInline()
	if len(inline) > MaxInlineExtremities {
		for part := range slices.Chunk(inline, ExtremityChunkTarget) {
			kept = append(kept, s.newChunk(part, &fresh))
		}
		s.chunked = merge2(s.chunked, inline, make([]string, 0, len(s.chunked)+len(inline)))
		clear(s.inline)
		inline = nil
	}
	s.chunks = s.mergeSmall(kept, &fresh)
	return s.fill(h, inline, fresh)
}

// sortedInline returns the inline event IDs, sorted.
func (s *ExtremitySet) sortedInline() []string {
	ids := make([]string, 0, len(s.inline))
	for id := range s.inline {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// newChunk makes a chunk of the sorted ids, owns it and adds it to fresh.
func (s *ExtremitySet) newChunk(ids []string, fresh *[]*ExtremityChunk) *ExtremityChunk {
	ids = slices.Clip(ids)
	c := &ExtremityChunk{ID: ExtremityChunkID(EncodeExtremityChunk(ids)), Count: uint32(len(ids)), EventIDs: ids}
	s.own(c)
	*fresh = append(*fresh, c)
	return c
}

// mergeSmall merges the chunks below half of ExtremityChunkTarget into chunks of
// the target size once there are smallChunksMax of them.
func (s *ExtremitySet) mergeSmall(chunks []*ExtremityChunk, fresh *[]*ExtremityChunk) []*ExtremityChunk {
	var small [][]string
	for _, c := range chunks {
		if c.Count < ExtremityChunkTarget/2 {
			small = append(small, c.EventIDs)
		}
	}
	if len(small) < smallChunksMax {
		return chunks
	}
	out := slices.DeleteFunc(chunks, func(c *ExtremityChunk) bool { return c.Count < ExtremityChunkTarget/2 })
	for part := range slices.Chunk(mergeSorted(small), ExtremityChunkTarget) {
		out = append(out, s.newChunk(part, fresh))
	}
	return out
}

// fill sets h's extremity fields from the chunks and the sorted inline IDs, and
// returns the records of the fresh chunks h names.
func (s *ExtremitySet) fill(h *Head, inline []string, fresh []*ExtremityChunk) []packstore.Record {
	h.ForwardExtremities = merge2(inline, s.chunked, make([]string, 0, len(inline)+len(s.chunked)))
	h.InlineExtremities, h.ExtremityChunks = nil, nil
	if len(s.chunks) == 0 {
		return nil
	}
	if len(inline) > 0 {
		h.InlineExtremities = inline
	}
	h.ExtremityChunks = make([]ExtremityChunk, len(s.chunks))
	named := make(map[*ExtremityChunk]bool, len(s.chunks))
	for i, c := range s.chunks {
		h.ExtremityChunks[i] = *c
		named[c] = true
	}
	var recs []packstore.Record
	for _, c := range fresh {
		if named[c] {
			recs = append(recs, packstore.Record{ID: c.ID, Data: EncodeExtremityChunk(c.EventIDs)})
		}
	}
	return recs
}
