package packstore

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime/debug"
	"sync"

	"github.com/edsrzf/mmap-go"
)

// shardFileName returns the file name of pack ID id.
func shardFileName(id uint16) string { return fmt.Sprintf("shard-%05d.mtdb", id) }

// parseShardFileName returns the pack ID of a shard file name.
func parseShardFileName(name string) (uint16, bool) {
	var id int
	if len(name) != len("shard-00000.mtdb") {
		return 0, false
	}
	if _, err := fmt.Sscanf(name, "shard-%05d.mtdb", &id); err != nil || id < 0 || id >= MaxShards {
		return 0, false
	}
	if shardFileName(uint16(id)) != name {
		return 0, false
	}
	return uint16(id), true
}

// errShardGone is returned by shard reads after the shard was retired; the
// reader retries with a fresh index generation.
var errShardGone = errors.New("packstore: shard retired")

// shard is one shard file.
//
// Reads: bytes below len(mm) are read from the read-only mapping; bytes
// above it (the tail of the active shard, appended since it was mapped) are
// read with ReadAt. A shard is mapped at open and re-mapped in full when it
// is sealed. Readers hold mu.RLock for the duration of a read, so unmapping
// (seal, retire, close) waits for them.
type shard struct {
	id   uint16
	seq  uint32 // stream sequence number (header; fixed)
	path string

	mu     sync.RWMutex // guards f, mm and gone against unmap/close
	f      vfile
	mm     mmap.MMap
	gone   bool
	synced bool // writer-only: no unsynced appends

	// crc is false in a shard with FeatureNoCRC (its frames carry no CRC);
	// verify says whether reads check frame CRCs (crc and checksum mode
	// "full"). Both are fixed when the shard is opened.
	crc, verify bool

	// raMode is Options.ReadAhead, applied to every mapping (remap); raMax
	// and ra drive the read-ahead of forward runs (readAheadLocked). Fixed
	// when the shard is opened.
	raMode ReadAheadMode
	raMax  int64
	ra     raWindowState

	// Writer-only fields, guarded by PackfileStorage.mu.
	size   int64         // bytes of complete frames
	alloc  int64         // file size: size plus the zeros written ahead (preallocStep)
	live   int           // index slots (all collections) pointing here
	colls  map[ID]uint32 // collection -> offset of its first data frame here
	resets map[ID]pos    // collection -> largest position P of its reset markers here
}

func newShardState(id uint16, seq uint32, path string, f vfile, size int64, crc bool, opts *Options) *shard {
	return &shard{id: id, seq: seq, path: path, f: f, size: size, alloc: size, synced: true, crc: crc,
		verify: opts.Checksum == ChecksumFull && crc, raMode: opts.ReadAhead, raMax: opts.readAheadMax(),
		colls: make(map[ID]uint32), resets: make(map[ID]pos)}
}

// noteData records a data frame of coll at off (retirement metadata).
func (s *shard) noteData(coll ID, off uint32) {
	if o, ok := s.colls[coll]; !ok || off < o {
		s.colls[coll] = off
	}
}

// noteReset records a reset marker for coll with position p.
func (s *shard) noteReset(coll ID, p pos) {
	if o, ok := s.resets[coll]; !ok || o.less(p) {
		s.resets[coll] = p
	}
}

// corruptf returns an ErrCorrupt error naming this shard and an offset.
func (s *shard) corruptf(off int64, format string, args ...any) error {
	return fmt.Errorf("%w: shard %d (%s) offset %d: %s", ErrCorrupt, s.id, filepath.Base(s.path), off, fmt.Sprintf(format, args...))
}

// remap replaces the mapping with one covering the first size bytes.
// The writer calls it; it takes mu itself.
func (s *shard) remap(size int64) error {
	var m mmap.MMap
	if size > 0 {
		var err error
		m, err = s.f.Map(int(size))
		if err != nil {
			return fmt.Errorf("packstore: map %s: %w", s.path, err)
		}
		if err := adviseMapping(m, s.raMode, s.path); err != nil {
			m.Unmap()
			return err
		}
	}
	s.mu.Lock()
	old := s.mm
	s.mm = m
	s.mu.Unlock()
	if old != nil {
		return old.Unmap()
	}
	return nil
}

// close unmaps and closes the shard; later reads return errShardGone.
func (s *shard) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return nil
	}
	s.gone = true
	var err error
	if s.mm != nil {
		err = s.mm.Unmap()
		s.mm = nil
	}
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// withFrame validates the frame at off and calls fn with it. The view's
// payload is valid only during fn. The frame is read through the mapping
// when the mapping covers off and pread is false, else with pread. It
// returns errShardGone if the shard was retired, and an ErrCorrupt error
// naming the shard and offset if the frame is bad.
func (s *shard) withFrame(off int64, pread bool, fn func(fv frameView) error) (err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	defer s.faultToError(off, debug.SetPanicOnFault(true), &err)
	if s.gone {
		return errShardGone
	}
	var b []byte
	if !pread && off >= HeaderSize && off < int64(len(s.mm)) {
		if err := s.readAheadLocked(off); err != nil {
			return err
		}
		b = s.mm[off:]
	} else {
		bp, _ := preadBufs.Get().(*[]byte)
		if bp == nil {
			b := make([]byte, preadGuess)
			bp = &b
		}
		defer preadBufs.Put(bp)
		if b, err = s.preadFrame(bp, off); err != nil {
			return err
		}
	}
	fv, err := decodeFrameCRC(b, s.verify)
	if err != nil {
		return s.corruptf(off, "%v", err)
	}
	return fn(fv)
}

// faultToError is deferred by every function that reads a shard's mapping,
// with the goroutine's previous debug.SetPanicOnFault setting (the caller
// turned it on). If the file was truncated below its mapped size from
// outside (or the device failed to read a page), touching a page past the
// new end raises SIGBUS, which without SetPanicOnFault kills the process
// (golang/go#36109). With it the runtime panics with an error that has an
// Addr method; faultToError restores the setting, recovers that panic and
// sets *err to an ErrCorrupt error naming the shard and offset. Any other
// panic (from a View callback, say) is re-raised.
func (s *shard) faultToError(off int64, old bool, err *error) {
	debug.SetPanicOnFault(old)
	r := recover()
	if r == nil {
		return
	}
	if f, ok := r.(interface{ Addr() uintptr }); ok {
		*err = s.corruptf(off, "reading the mapped file faulted at address %#x: the file is shorter than its mapping (truncated by another process?) or the device failed", f.Addr())
		return
	}
	panic(r)
}

// preadGuess is the size of withFrame's first pread of a frame: the whole
// frame of most HAMT nodes and event records, in one system call.
const preadGuess = 4 << 10

// preadBufs holds withFrame's pread buffers (*[]byte of preadGuess bytes or
// more).
var preadBufs sync.Pool

// preadFrame reads the frame at off with pread: preadGuess bytes first (fewer
// at the end of the file) into *bp, then the rest of a longer frame into a
// buffer of its own. The caller holds s.mu.
func (s *shard) preadFrame(bp *[]byte, off int64) ([]byte, error) {
	b := (*bp)[:preadGuess]
	n, err := s.f.ReadAt(b, off)
	if n < frameLenLen {
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return nil, s.readErr(off, err)
	}
	size, err := frameSizeAt(b[:n])
	if err != nil {
		return nil, s.corruptf(off, "%v", err)
	}
	if size <= n {
		return b[:size], nil
	}
	if size > cap(b) {
		nb := make([]byte, size)
		copy(nb, b[:n])
		b = nb
	}
	b = b[:size]
	if _, err := s.f.ReadAt(b[n:], off+int64(n)); err != nil {
		return nil, s.readErr(off, err)
	}
	return b, nil
}

func (s *shard) readErr(off int64, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return s.corruptf(off, "frame past end of file")
	}
	return fmt.Errorf("packstore: read %s offset %d: %w", s.path, off, err)
}

// frameHead reads the record ID and frame size at off without checking the
// CRC; the writer uses it to verify index tag matches and to rehash. With
// pread it reads through the file instead of the mapping: scans of a whole
// index (growth, rebuilds, listings) touch one frame head per record, and
// through the mapping each touch maps its page and up to 15 neighbours into
// the process (the kernel's fault-around): growing the index of a 1M-event
// room's collection mapped most of its store.
func (s *shard) frameHead(off int64, pread bool) (_ ID, _ int, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	defer s.faultToError(off, debug.SetPanicOnFault(true), &err)
	if s.gone {
		return ID{}, 0, errShardGone
	}
	var hdr [framePayloadOff]byte
	if !pread && off >= HeaderSize && off+framePayloadOff <= int64(len(s.mm)) {
		copy(hdr[:], s.mm[off:])
	} else if _, err := s.f.ReadAt(hdr[:], off); err != nil {
		return ID{}, 0, s.readErr(off, err)
	}
	size, err := frameSizeAt(hdr[:])
	if err != nil {
		return ID{}, 0, s.corruptf(off, "%v", err)
	}
	return ID(hdr[frameIDOff : frameIDOff+idLen]), size, nil
}

// frameHeads reads the record IDs of the frames at offs (ascending, within
// headRunMax bytes) with one pread through the file, as frameHead with
// pread does for one frame; a read that comes back short is retried frame
// by frame so that the error names the frame. buf is a scratch buffer of
// the run's length: from offs[0] to the end of the last frame's head.
func (s *shard) frameHeads(offs []int64, ids []ID, buf []byte) error {
	start := offs[0]
	if err := s.preadRange(buf, start); err != nil {
		for i, off := range offs {
			if ids[i], _, err = s.frameHead(off, true); err != nil {
				return err
			}
		}
		return nil
	}
	for i, off := range offs {
		hdr := buf[off-start : off-start+framePayloadOff]
		if _, err := frameSizeAt(hdr); err != nil {
			return s.corruptf(off, "%v", err)
		}
		ids[i] = ID(hdr[frameIDOff : frameIDOff+idLen])
	}
	return nil
}

// preadRange reads len(buf) bytes at off through the file.
func (s *shard) preadRange(buf []byte, off int64) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.gone {
		return errShardGone
	}
	_, err := s.f.ReadAt(buf, off)
	return err
}

// rawFrame appends a copy of the validated frame at off to dst (for
// repack), with a CRC when withCRC. Re-encoding a validated frame with a CRC
// reproduces its bytes exactly.
func (s *shard) rawFrame(off int64, dst []byte, withCRC bool) ([]byte, error) {
	err := s.withFrame(off, false, func(fv frameView) error {
		dst = appendFrameCRC(dst, fv.Flags, fv.RawLen, fv.Coll, fv.ID, fv.Payload, withCRC)
		return nil
	})
	return dst, err
}
