package roomstate

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"runtime"
	"slices"
	"sort"
	"sync"

	"github.com/mtxdb/mtxdb/pdu"

	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/mtxdb/mtxdb/packstore"
)

// ImportError names where an import failed: the input, the line (JSON lines) or
// array element (1-based), and the event ID when it could be read. Err wraps one of
// the package's sentinel errors.
type ImportError struct {
	Source  string
	Line    int
	Element bool // Line counts JSON array elements, not lines
	// Unit is what Line counts when neither lines nor elements: "PDU" for
	// ImportPDUs ("" otherwise).
	Unit    string
	EventID string
	// Missing is the prev or auth event that is not stored, for ErrMissingPrevEvent
	// and ErrMissingAuthEvent: when it was refused itself, this refusal follows
	// from that one.
	Missing string
	Err     error
}

// Error names the source, the line (or array element), the event ID when known, and
// the refusal: "import rooms.jsonl line 12 (event $x): <Err>".
func (e *ImportError) Error() string {
	where := "line"
	switch {
	case e.Unit != "":
		where = e.Unit
	case e.Element:
		where = "element"
	}
	ev := ""
	if e.EventID != "" {
		ev = " (event " + e.EventID + ")"
	}
	return fmt.Sprintf("import %s %s %d%s: %v", e.Source, where, e.Line, ev, e.Err)
}

// Unwrap returns Err, so that errors.Is finds the sentinel (ErrTooLarge,
// ErrMissingPrevEvent, ...) an ImportError wraps.
func (e *ImportError) Unwrap() error { return e.Err }

// ImportOptions tune Import.
type ImportOptions struct {
	// BatchSize is the number of events written and synced together (default 1000).
	BatchSize int
	// Progress, if set, is called after each PDU with the count read so far.
	Progress func(read int)
	// AnyOrder accepts PDUs whose prev_events or auth_events are not stored yet, as
	// a server stores events it backfills (newest first) or receives out of order.
	// Replay orders events topologically and leaves out, as outliers, events whose
	// prev or auth events never arrived. The head's forward extremities are the
	// events no event of the room names in prev_events: an event that arrives after
	// one naming it is not one (Import reads the stored graph records of a room it
	// adds to, for the prev_events its events name and it does not hold).
	AnyOrder bool
	// RoomVersion is the version of rooms whose m.room.create has not been seen yet
	// (with AnyOrder, a backfill reaches the create event last). Empty: such PDUs are
	// refused with ErrNoCreateEvent.
	RoomVersion string
	// KeepGoing: a PDU that is not a valid event, or cannot be stored where it
	// stands (unknown prev/auth events without AnyOrder, no m.room.create, another
	// room's auth event, a conflicting copy), is refused, recorded in
	// ImportResult.Refused with its line and reason, and the import goes on with
	// the next, as a homeserver drops an invalid PDU (Matrix spec v1.19,
	// Server-Server API, "Checks performed on receipt of a PDU", step 1). Without
	// it Import stops at the first.
	KeepGoing bool
	// Keys, if set, are the servers' signing keys: every new PDU must carry valid
	// signatures from the servers that must sign it (KeyRing.checkSignatures), or
	// it is refused with ErrBadSignature. Without keys signatures are not checked.
	Keys pdu.KeyRing
}

// ImportResult counts what Import did.
type ImportResult struct {
	Read     int // PDUs read from the input
	Imported int // PDUs stored and synced (not those of a batch whose write or sync failed)
	Skipped  int // PDUs already in the store
	// Variants counts skipped v3+ PDUs whose bytes differ from the stored copy (same
	// reference hash, so the same event: typically one copy is redacted).
	Variants int
	// Redacted counts, of Imported, the PDUs whose content hash did not match: they
	// are stored and used in redacted form (Matrix spec v1.19, Server-Server API,
	// "Checks performed on receipt of a PDU", step 3).
	Redacted int
	Rooms    []string // rooms touched, sorted
	// Refused lists the PDUs not stored (KeepGoing), in input order, each with its
	// line (or array element), event ID where it could be read, and reason.
	Refused []*ImportError
}

// pendingRoom is a room being written by an import: its head as it will be after the
// batch, the events already known, and the records of the unsynced batch.
type pendingRoom struct {
	room  *Room
	head  roomrecord.Head
	known map[string]uint32 // every event ID in the store or in this batch -> arrival index
	// graph: the batch's entries of its graph record (written beside its
	// arrival-log chunk); noGraph: a room imported before graph records existed
	// (its graph comes from the metadata records, so none is written).
	graph   []roomrecord.GraphEntry
	noGraph bool
	// fwd is the forward extremities while the import runs, with how the head
	// stores them (nil until the room's first event of this import); each
	// flush lays them out into the head and writes the chunks that changed.
	fwd *roomrecord.ExtremitySet
	// named holds the events an event of the room names in prev_events that
	// the room does not hold yet (AnyOrder): one that arrives is not a forward
	// extremity. Filled from the stored graph when an AnyOrder import opens a
	// stored room, and by stage.
	named   map[string]struct{}
	batch   []packstore.Record
	batchID []string
	raw     map[string][]byte // PDU JSON of the unsynced batch, by event ID
	isNew   bool
	// sawCreate: the room's m.room.create is stored (always true for rooms created by
	// their create event; with AnyOrder it may arrive later).
	sawCreate bool
}

// Import reads PDUs (JSON lines, or one JSON array) and stores each new one with its
// metadata, in batches that are synced before the next begins. Every PDU's
// prev_events and auth_events must already be stored or appear earlier in the input.
// Re-importing an event already stored is a no-op, so an import that failed can be
// re-run after fixing the input.
//
// A PDU that is not a valid event or cannot be placed is an *ImportError naming the
// source, the line (or array element), the event where it could be read, and the
// reason (one of the package's sentinel errors; validate.go has the size, field,
// other-room and signature checks). With opts.KeepGoing it is recorded in
// ImportResult.Refused and the import goes on with the next PDU; without, Import
// stops there: everything before that line is stored and synced, nothing after it
// is. Store and I/O errors always stop it, and so does ctx, checked before each
// group of PDUs parsed together (parseAhead): what was stored before is synced.
func (s *Store) Import(ctx context.Context, in io.Reader, source string, opts ImportOptions) (ImportResult, error) {
	imp := s.newImporter(ctx, source, opts)
	return imp.result(imp.run(in))
}

func (s *Store) newImporter(ctx context.Context, source string, opts ImportOptions) *importer {
	if opts.BatchSize <= 0 {
		opts.BatchSize = 1000
	}
	return &importer{ctx: ctx, s: s, source: source, rooms: map[string]*pendingRoom{}, opts: opts}
}

// result flushes what is pending after the input ended with err and returns
// the counts and the first error.
func (imp *importer) result(err error) (ImportResult, error) {
	if ferr := imp.flush(); ferr != nil && err == nil {
		err = ferr
	}
	if serr := imp.waitSync(); serr != nil && err == nil {
		err = serr
	}
	for id := range imp.rooms {
		imp.res.Rooms = append(imp.res.Rooms, id)
	}
	sort.Strings(imp.res.Rooms)
	return imp.res, err
}

// SourcePDU is one PDU for ImportPDUs: its JSON and the event ID its source
// knows it by ("" when the source names none).
type SourcePDU struct {
	EventID string
	JSON    []byte
}

// ImportPDUs is Import for PDUs the caller reads itself (a server's database,
// room by room): next returns them one at a time, and io.EOF after the last;
// any other error of next stops the import there (what came before is stored
// and synced) and is returned wrapped in an *ImportError. A PDU whose
// SourcePDU.EventID is not its own event ID (the reference hash from room
// version 3, its event_id field before) is refused with
// pdu.ErrEventIDMismatch. ImportError.Line counts the PDUs from 1, with Unit
// "PDU".
func (s *Store) ImportPDUs(ctx context.Context, next func() (SourcePDU, error), source string, opts ImportOptions) (ImportResult, error) {
	imp := s.newImporter(ctx, source, opts)
	imp.unit = "PDU"
	return imp.result(imp.runPDUs(next))
}

// runPDUs queues next's PDUs until io.EOF.
func (imp *importer) runPDUs(next func() (SourcePDU, error)) error {
	for n := 1; ; n++ {
		p, err := next()
		if err == io.EOF {
			return imp.drain()
		}
		if err != nil {
			if derr := imp.drain(); derr != nil {
				return derr
			}
			return &ImportError{Source: imp.source, Line: n, Unit: imp.unit, Err: err}
		}
		if err := imp.queuePDU(queuedPDU{raw: p.JSON, line: n, declared: p.EventID}); err != nil {
			return err
		}
	}
}

type importer struct {
	ctx     context.Context // Import's; checked in advance
	s       *Store
	source  string
	opts    ImportOptions
	rooms   map[string]*pendingRoom
	res     ImportResult
	pending int
	// pendingRedacted counts the redacted PDUs among the pending ones.
	pendingRedacted int
	// queued PDUs, parsed on several goroutines (prepare) while the batch
	// before them (parsed, once parseDone is closed) is stored in order.
	queued      []queuedPDU
	queuedBytes int // of the queued PDUs' raw bytes
	parsed      []queuedPDU
	parseDone   chan struct{}
	// versions: roomID -> the room version of each room in rooms, for prepare
	// (which runs beside the goroutine that adds rooms).
	versions sync.Map
	// unit: what ImportError.Line counts for ImportPDUs ("" for Import)
	unit string
	// syncing: the written batch being synced (flush), its result to come;
	// syncN and syncRedacted are its counts.
	syncing      chan error
	syncN        int
	syncRedacted int
	// stored: the store's rooms, listed when roomOf first needs them
	stored []*Room
}

// queuedPDU is one PDU of the input with what prepare learnt of it.
type queuedPDU struct {
	raw     []byte
	line    int
	element bool
	// declared: the event ID the source names the PDU by (ImportPDUs), "" if none
	declared string
	// header as prepare read it (headerRead), so that one does not decode it again
	header     pdu.Header
	headerErr  error
	headerRead bool
	// sizeErr: the PDU breaks the size or field limits (checked before anything
	// parses or hashes it)
	sizeErr error
	version gomatrixserverlib.RoomVersion // the version pdu was parsed for ("" when not parsed)
	pd      gomatrixserverlib.PDU
	err     error
}

// parseAhead is how many PDUs are parsed together, spread over the cores.
const parseAhead = 256

// queue adds a PDU; every parseAhead PDUs the queue is parsed, and the batch
// before it stored (advance).
func (imp *importer) queue(raw []byte, line int, element bool) error {
	return imp.queuePDU(queuedPDU{raw: raw, line: line, element: element})
}

func (imp *importer) queuePDU(q queuedPDU) error {
	imp.queued = append(imp.queued, q)
	imp.queuedBytes += len(q.raw)
	if len(imp.queued) >= parseAhead || imp.queuedBytes >= maxQueuedBytes {
		return imp.advance()
	}
	return nil
}

// advance starts parsing the queued PDUs (JSON decoding and the content and
// reference hashes: most of an import's CPU, spread over the cores) and, while
// they are parsed, stores the batch parsed before them.
func (imp *importer) advance() error {
	if err := imp.ctx.Err(); err != nil {
		imp.waitParsed()
		return err
	}
	q := imp.queued
	imp.queued, imp.queuedBytes = nil, 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		imp.prepare(q)
	}()
	err := imp.storeParsed()
	imp.parsed, imp.parseDone = q, done
	if err != nil {
		imp.waitParsed()
	}
	return err
}

// waitParsed waits until the batch being parsed is parsed.
func (imp *importer) waitParsed() {
	if imp.parseDone != nil {
		<-imp.parseDone
	}
}

// storeParsed stores the parsed batch in input order exactly as one PDU at a
// time would: a PDU's errors are reported when its turn comes, after
// everything before it was stored.
func (imp *importer) storeParsed() error {
	imp.waitParsed()
	q := imp.parsed
	imp.parsed, imp.parseDone = nil, nil
	for i := range q {
		if err := imp.refuse(imp.one(&q[i])); err != nil {
			return err
		}
	}
	return nil
}

// drain parses and stores every queued PDU.
func (imp *importer) drain() error {
	if err := imp.advance(); err != nil {
		return err
	}
	return imp.storeParsed()
}

// refuse records a PDU's refusal and returns nil when the import keeps going
// past it (ImportOptions.KeepGoing, and err is about that PDU, not the store);
// otherwise it returns err.
func (imp *importer) refuse(err error) error {
	var ie *ImportError
	if err == nil || !imp.opts.KeepGoing || !errors.As(err, &ie) || !isRefusal(ie.Err) {
		return err
	}
	imp.res.Refused = append(imp.res.Refused, ie)
	return nil
}

// isRefusal reports whether err is about the PDU itself (so a homeserver would
// drop it and go on) rather than the store or the input stream.
func isRefusal(err error) bool {
	for _, s := range []error{pdu.ErrMalformedPDU, pdu.ErrUnknownRoomVersion, pdu.ErrEventIDMismatch, ErrMissingPrevEvent,
		ErrMissingAuthEvent, ErrNoCreateEvent, ErrConflictingEvent, pdu.ErrTooLarge, pdu.ErrFieldTooLong, ErrOtherRoom, pdu.ErrBadSignature} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// prepare parses each queued PDU whose room version is known before any of them
// is stored: a room already in this import, a create event (its content names the
// version) or the AnyOrder version. The others are parsed by one, in turn.
func (imp *importer) prepare(q []queuedPDU) {
	workers := min(runtime.GOMAXPROCS(0), len(q))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(q); i += workers {
				if q[i].sizeErr = pdu.CheckSize(q[i].raw); q[i].sizeErr != nil {
					continue
				}
				h, err := pdu.ReadHeader(q[i].raw)
				q[i].header, q[i].headerErr, q[i].headerRead = h, err, true
				if err != nil {
					continue
				}
				if q[i].sizeErr = pdu.CheckFieldLimits(h); q[i].sizeErr != nil {
					continue
				}
				var v gomatrixserverlib.RoomVersion
				if rv, ok := imp.versions.Load(h.RoomID); ok {
					v = rv.(gomatrixserverlib.RoomVersion)
				} else if h.Type == "m.room.create" && h.StateKey != nil && *h.StateKey == "" {
					if v, err = pdu.CreateRoomVersion(h); err != nil {
						continue
					}
				} else if imp.opts.RoomVersion != "" {
					v = gomatrixserverlib.RoomVersion(imp.opts.RoomVersion)
				} else {
					continue
				}
				q[i].pd, q[i].err = pdu.Parse(v, q[i].raw)
				q[i].version = v
			}
		}()
	}
	wg.Wait()
}

// readFailed reports whether a JSON decoder's error is the input's read error
// (passed through as it is) rather than bad JSON.
func readFailed(err error) bool {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	return !errors.As(err, &se) && !errors.As(err, &te) && err != io.ErrUnexpectedEOF && err != io.EOF
}

func (imp *importer) run(in io.Reader) error {
	br := bufio.NewReaderSize(in, 1<<20)
	if bom, _ := br.Peek(3); bytes.Equal(bom, []byte{0xEF, 0xBB, 0xBF}) {
		_, _ = br.Discard(3) // a UTF-8 byte order mark is not part of the JSON
	}
	first, err := peekNonSpace(br)
	if err == io.EOF {
		return nil
	}
	if err != nil {
		return &ImportError{Source: imp.source, Line: 1, Err: err}
	}
	if first == '[' {
		lr := &limitedReader{r: br, limit: maxLineBytes}
		dec := json.NewDecoder(lr)
		if _, err := dec.Token(); err != nil {
			return &ImportError{Source: imp.source, Line: 1, Element: true, Err: fmt.Errorf("%w: %v", pdu.ErrMalformedPDU, err)}
		}
		n := 1
		for ; dec.More(); n++ {
			var raw json.RawMessage
			lr.limit = dec.InputOffset() + maxLineBytes + 1 // the element and the comma before it
			if err := dec.Decode(&raw); err != nil {
				// The elements before it are stored; the decoder cannot find
				// the next element's start, so the rest of the array is lost.
				if derr := imp.drain(); derr != nil {
					return derr
				}
				if errors.Is(err, errElementTooLarge) {
					imp.res.Read++
					return imp.refuse(&ImportError{Source: imp.source, Line: n, Element: true,
						Err: fmt.Errorf("%w: an element over the %d bytes an element may hold (not read whole; the rest of the array cannot be read)", pdu.ErrTooLarge, maxLineBytes)})
				}
				if readFailed(err) {
					return &ImportError{Source: imp.source, Line: n, Element: true, Err: err}
				}
				imp.res.Read++ // an element, refused: read, imported, skipped and refused add up
				return imp.refuse(&ImportError{Source: imp.source, Line: n, Element: true,
					Err: fmt.Errorf("%w: %v (the rest of the array cannot be read)", pdu.ErrMalformedPDU, err)})
			}
			if err := imp.queue(raw, n, true); err != nil {
				return err
			}
		}
		if err := imp.drain(); err != nil {
			return err
		}
		// The array must end with "]" and nothing but white space may follow:
		// a second array or trailing bytes would otherwise be dropped unread.
		if tok, err := dec.Token(); err != nil || tok != json.Delim(']') {
			return imp.refuse(&ImportError{Source: imp.source, Line: n, Element: true, Err: fmt.Errorf("%w: the array does not end with ] after element %d (%v)", pdu.ErrMalformedPDU, n-1, err)})
		}
		if _, err := dec.Token(); err != io.EOF {
			return imp.refuse(&ImportError{Source: imp.source, Line: n, Element: true, Err: fmt.Errorf("%w: data after the closing ] of the array", pdu.ErrMalformedPDU)})
		}
		return nil
	}
	line := 0
	for {
		b, long, err := readLine(br)
		if long != nil {
			line++
			if derr := imp.drain(); derr != nil { // the lines before it come first
				return derr
			}
			imp.res.Read++
			if perr := imp.refuse(&ImportError{Source: imp.source, Line: line, EventID: long.eventID, Err: long.err()}); perr != nil {
				return perr
			}
			if err == io.EOF {
				return imp.drain()
			}
			if err == nil {
				continue
			}
		}
		if err != nil && err != io.EOF {
			// A read error: the partial line is not a PDU. Store what came before.
			if derr := imp.drain(); derr != nil {
				return derr
			}
			return &ImportError{Source: imp.source, Line: line + 1, Err: err}
		}
		if len(b) > 0 {
			line++
			if t := bytes.TrimSpace(b); len(t) > 0 {
				if perr := imp.queue(t, line, false); perr != nil {
					return perr
				}
			}
		}
		if err == io.EOF {
			return imp.drain()
		}
	}
}

// maxLineBytes bounds what import holds of one line: 4 times MaxPDUBytes, room for
// a PDU padded with white space. A longer line is refused as ErrTooLarge without
// being held in memory: the rest of it is read and dropped up to the next newline.
const maxLineBytes = 4 * pdu.MaxPDUBytes

// wrappedArray returns the key of a JSON object without "type" whose value is an
// array of objects (a client or federation API response, {"chunk": [...]}), or ""
// when raw is not one.
func wrappedArray(raw []byte) string {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return ""
	}
	if _, ok := obj["type"]; ok {
		return ""
	}
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		var arr []json.RawMessage
		if json.Unmarshal(obj[k], &arr) == nil && len(arr) > 0 && bytes.HasPrefix(bytes.TrimSpace(arr[0]), []byte("{")) {
			return k
		}
	}
	return ""
}

// errElementTooLarge is limitedReader's error: the JSON array element being
// decoded is over maxLineBytes.
var errElementTooLarge = errors.New("roomstate: array element over the size limit")

// limitedReader hands the JSON decoder of an array at most limit bytes in all
// (limit is moved forward before each element), so that no element is held whole
// past maxLineBytes.
type limitedReader struct {
	r     io.Reader
	n     int64 // bytes handed out
	limit int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n >= l.limit {
		return 0, errElementTooLarge
	}
	if rest := l.limit - l.n; int64(len(p)) > rest {
		p = p[:rest]
	}
	n, err := l.r.Read(p)
	l.n += int64(n)
	return n, err
}

// maxQueuedBytes bounds the bytes of the PDUs queued for parsing: the queue is
// parsed and stored when it reaches parseAhead PDUs or this many bytes.
const maxQueuedBytes = 16 << 20

func peekNonSpace(br *bufio.Reader) (byte, error) {
	for {
		b, err := br.ReadByte()
		if err != nil {
			return 0, err
		}
		switch b {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return b, br.UnreadByte()
	}
}

// one imports a single PDU in phases: check (size, field limits, header), version
// (its room and the room version it is parsed for), parse, joinRoom (the pending
// room it joins), place (a duplicate, signatures, m.room.create, prev and auth
// events present) and stage (its records queued for the next batch).
func (imp *importer) one(q *queuedPDU) error {
	imp.res.Read++
	if imp.opts.Progress != nil {
		imp.opts.Progress(imp.res.Read)
	}
	h, err := imp.check(q)
	if err != nil {
		return err
	}
	isCreate := h.Type == "m.room.create" && h.StateKey != nil && *h.StateKey == ""
	pr, version, err := imp.version(q, h, isCreate)
	if err != nil {
		return err
	}
	pd, err := q.pd, q.err
	if q.version == "" || q.version != version {
		pd, err = pdu.Parse(version, q.raw)
	}
	if err != nil {
		return imp.fail(q, imp.refusedEventID(h, q.raw), err)
	}
	eventID, roomID := pd.EventID(), pd.RoomID().String()
	if q.declared != "" && q.declared != eventID {
		return imp.fail(q, q.declared, fmt.Errorf("%w: the source names it %s, its own event ID is %s", pdu.ErrEventIDMismatch, q.declared, eventID))
	}
	if pr, err = imp.joinRoom(q, h, pr, version, eventID, roomID, isCreate); err != nil {
		return err
	}
	if dup, err := imp.place(q, h, pr, version, pd, roomID, isCreate); err != nil || dup {
		return err
	}
	return imp.stage(pr, pd, q.raw)
}

// fail is the ImportError refusing the PDU q.
func (imp *importer) fail(q *queuedPDU, eventID string, err error) error {
	return &ImportError{Source: imp.source, Line: q.line, Element: q.element, Unit: imp.unit, EventID: eventID, Err: err}
}

// check reads the PDU's header (unless prepare did) and refuses a PDU over the
// size or field limits (checkSize, checkFieldLimits) or without a readable
// header; a JSON object wrapping an array of events is named as such.
func (imp *importer) check(q *queuedPDU) (pdu.Header, error) {
	raw := q.raw
	h, err := q.header, q.headerErr
	if !q.headerRead {
		if q.sizeErr = pdu.CheckSize(raw); q.sizeErr == nil {
			if h, err = pdu.ReadHeader(raw); err == nil {
				q.sizeErr = pdu.CheckFieldLimits(h)
			}
		} else {
			h, _ = pdu.ReadHeader(raw)
		}
	}
	if q.sizeErr != nil || err != nil {
		if key := wrappedArray(raw); key != "" {
			return h, imp.fail(q, "", fmt.Errorf("%w: a JSON object holding an array of events under %q, not a PDU: import the array itself (jq -c '.%s[]' gives its PDUs as lines)", pdu.ErrMalformedPDU, key, key))
		}
	}
	if q.sizeErr != nil {
		return h, imp.fail(q, imp.refusedEventID(h, raw), q.sizeErr)
	}
	if err != nil {
		return h, imp.fail(q, imp.refusedEventID(h, raw), err)
	}
	return h, nil
}

// version returns the pending room of the PDU's room_id (nil when the import has
// not met the room yet) and the room version to parse the PDU for: the room's,
// else ImportOptions.RoomVersion, else that of the m.room.create the PDU is. Any
// other PDU of a room not met yet is refused (ErrNoCreateEvent).
func (imp *importer) version(q *queuedPDU, h pdu.Header, isCreate bool) (*pendingRoom, gomatrixserverlib.RoomVersion, error) {
	var pr *pendingRoom
	var err error
	if h.RoomID != "" {
		if pr, err = imp.room(h.RoomID); err != nil {
			return nil, "", imp.fail(q, h.EventID, err)
		}
	}
	switch {
	case pr != nil:
		return pr, gomatrixserverlib.RoomVersion(pr.head.RoomVersion), nil
	case !isCreate && imp.opts.RoomVersion != "" && h.RoomID != "":
		version := gomatrixserverlib.RoomVersion(imp.opts.RoomVersion)
		if !gomatrixserverlib.KnownRoomVersion(version) {
			return nil, "", imp.fail(q, h.EventID, fmt.Errorf("%w: %q", pdu.ErrUnknownRoomVersion, version))
		}
		return nil, version, nil
	case !isCreate:
		if h.RoomID == "" {
			return nil, "", imp.fail(q, h.EventID, fmt.Errorf("%w: no room_id", pdu.ErrMalformedPDU))
		}
		if imp.opts.AnyOrder {
			return nil, "", imp.fail(q, h.EventID, fmt.Errorf("%w: %s: its room version is not known before its m.room.create (ImportOptions.RoomVersion gives it)", ErrNoCreateEvent, h.RoomID))
		}
		return nil, "", imp.fail(q, h.EventID, fmt.Errorf("%w: %s", ErrNoCreateEvent, h.RoomID))
	}
	version, err := pdu.CreateRoomVersion(h)
	if err != nil {
		return nil, "", imp.fail(q, h.EventID, err)
	}
	return nil, version, nil
}

// joinRoom returns the pending room of the parsed PDU: pr when version found
// it, else the room of the PDU's parsed room ID (a v12 m.room.create carries no
// room_id: the room ID derives from the event), else a new room for an
// m.room.create (or, with AnyOrder, any PDU). A room_id that parses as another
// room is refused.
func (imp *importer) joinRoom(q *queuedPDU, h pdu.Header, pr *pendingRoom, version gomatrixserverlib.RoomVersion, eventID, roomID string, isCreate bool) (*pendingRoom, error) {
	var err error
	if pr == nil {
		if pr, err = imp.room(roomID); err != nil {
			return nil, imp.fail(q, eventID, err)
		}
		if pr == nil {
			if !isCreate && !imp.opts.AnyOrder {
				return nil, imp.fail(q, eventID, fmt.Errorf("%w: %s", ErrNoCreateEvent, roomID))
			}
			pr = &pendingRoom{
				head:  roomrecord.Head{RoomID: roomID, RoomVersion: string(version)},
				known: map[string]uint32{},
				named: map[string]struct{}{},
				isNew: true,
			}
			pr.room = imp.s.newRoom(roomrecord.CollectionID(roomID), pr.head, nil) // no head stored yet
			imp.addRoom(roomID, pr)
		}
	}
	if h.RoomID != "" && roomID != h.RoomID {
		return nil, imp.fail(q, eventID, fmt.Errorf("%w: room_id %s parsed as %s", pdu.ErrMalformedPDU, h.RoomID, roomID))
	}
	return pr, nil
}

// place decides whether the PDU joins its room: an event already stored is
// skipped (dup, counted; a different PDU under its ID is refused), and with
// ImportOptions.Keys its signatures must verify. Without AnyOrder its room's
// m.room.create must come first and once, and its prev and auth events must be
// stored or earlier in the input (ImportError.Missing names the first that is
// not).
func (imp *importer) place(q *queuedPDU, h pdu.Header, pr *pendingRoom, version gomatrixserverlib.RoomVersion, pd gomatrixserverlib.PDU, roomID string, isCreate bool) (dup bool, err error) {
	eventID := pd.EventID()
	if _, dup := pr.known[eventID]; dup {
		if err := imp.checkDuplicate(pr, version, pd, q.raw); err != nil {
			return false, imp.fail(q, eventID, err)
		}
		imp.res.Skipped++
		return true, nil
	}
	if imp.opts.Keys != nil {
		verImpl, err := gomatrixserverlib.GetRoomVersion(version)
		if err != nil {
			return false, imp.fail(q, eventID, err)
		}
		if err := imp.opts.Keys.CheckSignatures(verImpl, pd, q.raw); err != nil {
			return false, imp.fail(q, eventID, err)
		}
	}
	if isCreate {
		if pr.sawCreate || (pr.head.Events > 0 && !imp.opts.AnyOrder) {
			return false, imp.fail(q, eventID, fmt.Errorf("%w: second m.room.create in room %s", pdu.ErrMalformedPDU, roomID))
		}
		if v, _ := pdu.CreateRoomVersion(h); string(v) != pr.head.RoomVersion {
			return false, imp.fail(q, eventID, fmt.Errorf("%w: m.room.create says room version %q, the room was imported as %q "+
				"(a stored room keeps its version: import it into a new store with the right --room-version)",
				pdu.ErrMalformedPDU, v, pr.head.RoomVersion))
		}
		pr.sawCreate = true
	}
	if !isCreate && pr.head.Events == 0 && !imp.opts.AnyOrder {
		return false, imp.fail(q, eventID, fmt.Errorf("%w: %s", ErrNoCreateEvent, roomID))
	}
	if imp.opts.AnyOrder {
		return false, nil
	}
	for _, p := range pd.PrevEventIDs() {
		if _, ok := pr.known[p]; !ok {
			err := fmt.Errorf("%w: %s", ErrMissingPrevEvent, p)
			if other := imp.roomOf(p, roomID); other != "" {
				err = fmt.Errorf("%w: %s is an event of another room, %s", ErrMissingPrevEvent, p, other)
			}
			e := imp.fail(q, eventID, err).(*ImportError)
			e.Missing = p
			return false, e
		}
	}
	for _, a := range pd.AuthEventIDs() {
		if _, ok := pr.known[a]; !ok {
			if other := imp.roomOf(a, roomID); other != "" {
				return false, imp.fail(q, eventID, otherRoomError(version, a, other))
			}
			e := imp.fail(q, eventID, fmt.Errorf("%w: %s", ErrMissingAuthEvent, a)).(*ImportError)
			e.Missing = a
			return false, e
		}
	}
	return false, nil
}

// stage queues the PDU's event and metadata records in its room's batch, adds it
// to the room's graph, events and forward extremities, and writes the batch
// when ImportOptions.BatchSize PDUs are pending.
func (imp *importer) stage(pr *pendingRoom, pd gomatrixserverlib.PDU, raw []byte) error {
	eventID := pd.EventID()
	m := roomrecord.EventMeta{
		Seq:        pr.head.Events,
		Depth:      pd.Depth(),
		IsState:    pd.StateKey() != nil,
		Redacted:   pd.Redacted(),
		EventID:    eventID,
		Type:       pd.Type(),
		PrevEvents: pd.PrevEventIDs(),
		AuthEvents: pd.AuthEventIDs(),
	}
	if m.IsState {
		m.StateKey = *pd.StateKey()
	}
	ev := roomrecord.EventRecordID(eventID)
	pr.batch = append(pr.batch,
		packstore.Record{ID: ev, Data: roomrecord.EncodeEvent(eventID, raw)},
		packstore.Record{ID: roomrecord.MetaRecordID(ev), Data: roomrecord.EncodeMeta(&m)})
	pr.batchID = append(pr.batchID, eventID)
	if pr.raw == nil {
		pr.raw = map[string][]byte{}
	}
	pr.raw[eventID] = raw
	pr.known[eventID] = pr.head.Events
	pr.graph = append(pr.graph, roomrecord.NewGraphEntry(&m, func(id string) (uint32, bool) { x, ok := pr.known[id]; return x, ok }))
	pr.head.Events++
	pr.head.Replayed = false
	// Forward extremities as a homeserver keeps them on receipt: the new event
	// replaces the extremities it points at, and (AnyOrder) an event that an
	// event before it names in prev_events is not one.
	// A set: events nothing points at (rejected ones, in a generated room) stay
	// extremities for good, and a list rewritten per event cost O(extremities)
	// each (10k of them at 1M events: import time grew with the square).
	if pr.fwd == nil {
		pr.fwd = roomrecord.NewExtremitySet(pr.head)
	}
	_, named := pr.named[eventID]
	delete(pr.named, eventID)
	for _, p := range m.PrevEvents {
		pr.fwd.Remove(p)
		if _, ok := pr.known[p]; !ok {
			pr.named[p] = struct{}{}
		}
	}
	if !named {
		pr.fwd.Add(eventID)
	}
	imp.res.Imported++
	imp.pending++
	if m.Redacted {
		imp.res.Redacted++
		imp.pendingRedacted++
	}
	if imp.pending >= imp.opts.BatchSize {
		return imp.flush()
	}
	return nil
}

// checkDuplicate compares a PDU with the stored event of the same ID. For v1/v2
// formats (event IDs chosen by the sender) a different content hash is an error; for
// v3+ (the ID is the reference hash) the copies are the same event, and a byte
// difference is only counted.
func (imp *importer) checkDuplicate(pr *pendingRoom, version gomatrixserverlib.RoomVersion, pd gomatrixserverlib.PDU, raw []byte) error {
	stored, ok := pr.raw[pd.EventID()]
	if !ok {
		var err error
		if stored, err = pr.room.EventJSON(pd.EventID()); err != nil {
			return err
		}
	}
	if bytes.Equal(stored, raw) {
		return nil
	}
	verImpl, err := gomatrixserverlib.GetRoomVersion(version)
	if err != nil {
		return err
	}
	if verImpl.EventFormat() != gomatrixserverlib.EventFormatV1 {
		imp.res.Variants++
		return nil
	}
	var a, b struct {
		Hashes struct {
			SHA256 string `json:"sha256"`
		} `json:"hashes"`
	}
	_ = json.Unmarshal(stored, &a)
	_ = json.Unmarshal(raw, &b)
	if a.Hashes.SHA256 != b.Hashes.SHA256 {
		return fmt.Errorf("%w: content hash %s stored, %s given", ErrConflictingEvent, a.Hashes.SHA256, b.Hashes.SHA256)
	}
	imp.res.Variants++
	return nil
}

// room returns the pending state of a room already in the store or in this import,
// or nil if the room is unknown.
func (imp *importer) room(roomID string) (*pendingRoom, error) {
	if pr, ok := imp.rooms[roomID]; ok {
		return pr, nil
	}
	r, err := imp.s.Room(imp.ctx, roomID)
	if errors.Is(err, ErrUnknownRoom) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ids, err := r.EventIDs()
	if err != nil {
		return nil, err
	}
	pr := &pendingRoom{room: r, head: r.Head(), known: make(map[string]uint32, len(ids)), named: map[string]struct{}{}}
	for i, id := range ids {
		pr.known[id] = uint32(i)
	}
	if imp.opts.AnyOrder && len(ids) > 0 {
		if err := pr.nameMissingPrevs(); err != nil {
			return nil, err
		}
	}
	has, err := r.hasGraphRecords()
	if err != nil {
		return nil, fmt.Errorf("roomstate: room %s: graph record 0: %w", roomID, err)
	}
	pr.noGraph = len(ids) > 0 && !has
	// Without AnyOrder a stored room began with its m.room.create; with it, look.
	pr.sawCreate = len(ids) > 0 && !imp.opts.AnyOrder
	for _, id := range ids {
		if pr.sawCreate {
			break
		}
		m, err := r.Meta(id)
		if err != nil {
			return nil, err
		}
		pr.sawCreate = m.Type == "m.room.create" && m.StateKey == ""
	}
	imp.addRoom(roomID, pr)
	return pr, nil
}

// nameMissingPrevs enters in named the prev_events the stored events of the
// room name and the room does not hold (an earlier AnyOrder import stored
// events before their prev_events), from its graph records: an import that
// brings one does not make it a forward extremity.
func (pr *pendingRoom) nameMissingPrevs() error {
	g, err := pr.room.Graph()
	if err != nil {
		return err
	}
	for i := range g.IDs {
		for j, x := range g.Prev(i) {
			if x < 0 {
				pr.named[g.MissingPrev(i, j)] = struct{}{}
			}
		}
	}
	return nil
}

// addRoom enters a room in rooms and its version in versions.
func (imp *importer) addRoom(roomID string, pr *pendingRoom) {
	imp.rooms[roomID] = pr
	imp.versions.Store(roomID, gomatrixserverlib.RoomVersion(pr.head.RoomVersion))
}

// flush writes each room's batch (events, metadata, one arrival-log chunk, the
// forward-extremity chunks that changed, then the head) and starts syncing it; the next batch is written after that sync ends
// (waitSync), and its PDUs are parsed and staged meanwhile. The head goes last:
// if the batch is torn, the old head still describes a consistent prefix, and
// the orphaned records are re-imported later.
func (imp *importer) flush() error {
	if imp.pending == 0 {
		return nil
	}
	if err := imp.waitSync(); err != nil {
		imp.dropBatch()
		return err
	}
	ids := make([]string, 0, len(imp.rooms))
	for id, pr := range imp.rooms {
		if len(pr.batchID) > 0 {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		pr := imp.rooms[id]
		h := pr.head
		recs := append(pr.batch, packstore.Record{ID: roomrecord.LogChunkID(h.LogChunks), Data: roomrecord.EncodeLogChunk(pr.batchID)})
		if !pr.noGraph {
			base := h.Events - uint32(len(pr.batchID))
			recs = append(recs, packstore.Record{ID: roomrecord.GraphChunkID(h.LogChunks), Data: roomrecord.EncodeGraphChunk(base, pr.graph)})
		}
		h.LogChunks++
		if pr.fwd != nil {
			// Only the extremity chunks that changed are written (ExtremitySet.Store).
			recs = append(recs, pr.fwd.Store(&h)...)
		}
		if err := pr.room.putWithHead(recs, h); err != nil {
			imp.dropBatch()
			return fmt.Errorf("roomstate: import %s: write room %s: %w", imp.source, id, err)
		}
		pr.head = h
		pr.batch, pr.batchID, pr.raw, pr.graph = nil, nil, nil, nil
	}
	imp.syncN, imp.syncRedacted = imp.pending, imp.pendingRedacted
	imp.pending, imp.pendingRedacted = 0, 0
	done := make(chan error, 1)
	imp.syncing = done
	go func() { done <- imp.s.eng.Sync() }()
	return nil
}

// waitSync waits for the sync of the batch written last; when it failed, that
// batch's PDUs are not counted as imported (written, but not known to be
// durable).
func (imp *importer) waitSync() error {
	if imp.syncing == nil {
		return nil
	}
	err := <-imp.syncing
	imp.syncing = nil
	if err != nil {
		imp.res.Imported -= imp.syncN
		imp.res.Redacted -= imp.syncRedacted
		return fmt.Errorf("roomstate: import %s: sync: %w", imp.source, err)
	}
	return nil
}

// dropBatch forgets a batch whose write failed: its events are not counted as
// imported (ImportResult.Imported counts what was stored and synced), and nothing of
// it is written again by a later flush (Import returns the error; a re-run imports
// what did not arrive).
func (imp *importer) dropBatch() {
	imp.res.Imported -= imp.pending
	imp.res.Redacted -= imp.pendingRedacted
	imp.pending, imp.pendingRedacted = 0, 0
	for _, pr := range imp.rooms {
		pr.batch, pr.batchID, pr.raw, pr.graph = nil, nil, nil, nil
	}
}
