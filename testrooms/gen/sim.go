package gen

import (
	"container/heap"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/mtxdb/mtxdb/resolver"
)

// keyID is the signing key ID of every simulated server.
const keyID gomatrixserverlib.KeyID = "ed25519:gen"

// startTS is the simulated clock's origin_server_ts at tick 0 (2023-11-14).
const startTS = int64(1_700_000_000_000)

// event is one generated PDU and what the generator knows about it.
type event struct {
	// pdu is nil for a non-state event once it has reached the origin (its
	// events.jsonl line is then written; room.pduOf reads it back).
	pdu     gomatrixserverlib.PDU
	id      string
	typ     string // the event type
	sender  int32  // user index of the sender
	server  int
	depth   int64
	prev    []int32
	auth    []int32  // as AuthEventIDs() reports them (v12: the create event first)
	authIDs []string // the same, as IDs (state events only: nil for others)
	// prevSame is the auth event with this event's state key (previous power
	// levels, previous membership of the target), or -1; sdepth counts those links.
	prevSame int32
	sdepth   int32
	jump     int32 // a same-key ancestor further up (itself at the lineage's root)
	// kids are the accepted state events created so far that cite this one in
	// auth_events (see AuthChildren).
	kids     []string
	kidIdx   []int32 // the same, as indices
	key      string  // state key "type\x00state_key", "" for non-state events
	member   string  // membership of an m.room.member event
	rejected bool
	// beforeRec is the stateLog record of the state before the event; after is
	// the state after it while the simulation may resolve it (room.dropDead),
	// then only its record (a nil root): room.afterOf reads it back.
	beforeRec int32
	after     pmap
	sign      *signing // the signature being made (nil: pdu is signed)
	tick      int64
}

type server struct {
	idx    int
	name   string
	key    ed25519.PrivateKey
	joined bool
	users  []int   // indices into room.users
	known  []bool  // by event index
	refd   []bool  // by event index: an accepted known event lists it in prev_events
	extrem []int32 // forward extremities
}

type user struct {
	id     string
	server int
	name   string
	mem    string // membership after the latest accepted member event (a hint only)
}

// delivery is one event in flight to one server.
type delivery struct {
	at     int64
	seq    int64
	server int
	event  int32
}

type deliveries []delivery

func (d deliveries) Len() int { return len(d) }
func (d deliveries) Less(i, j int) bool {
	if d[i].at != d[j].at {
		return d[i].at < d[j].at
	}
	return d[i].seq < d[j].seq
}
func (d deliveries) Swap(i, j int) { d[i], d[j] = d[j], d[i] }
func (d *deliveries) Push(x any)   { *d = append(*d, x.(delivery)) }
func (d *deliveries) Pop() any {
	old := *d
	x := old[len(old)-1]
	*d = old[:len(old)-1]
	return x
}

// room is one simulated room. Not safe for concurrent use.
type room struct {
	opts    Options
	rng     *rand.Rand
	ver     gomatrixserverlib.IRoomVersion
	roomID  string
	servers []*server
	users   []user
	events  []*event
	byID    map[string]int32
	tick    int64
	ts      int64
	queue   deliveries
	seq     int64
	arrival []int32 // the origin server's arrival order
	arrTS   []int64 // the simulated time of each arrival
	creator int     // user index of the room creator
	joined  int     // joined members (by the user hints)

	plCache map[int32]*gomatrixserverlib.PowerLevelContent
	jrCache map[int32]string
	// plainAllowed: authorization outcomes of plain events (see room.allowed).
	plainAllowed map[string]error
	keepsOrigin  int8            // see redactionKeepsOrigin: 0 not asked yet, 1 yes, -1 no
	memo         map[string]pmap // resolve results by sorted prev set
	// resCache carries what the resolver learns about events (power levels
	// parents, mainlines, authorization outcomes) from one resolution to the next.
	resCache *resolver.Cache
	stats    stats
	res      resolveStats
	err      error // the first resolution failure
	// sampled are the events expected_state.jsonl records (sample), every
	// sampleEvery-th.
	sampled     []int32
	sampleEvery int
	// What the reference found (reference.go): its states of sampled events
	// that differ from the generator's, its current state, its counts; refDone
	// once it has run.
	refStates  map[int32]pmap
	refCurrent pmap
	refCounts  ReferenceCounts
	refDone    bool
	// refProgress, if set, is called as the reference checks events.
	refProgress func(done, total int)
	// log records every state (statelog.go); held are the events whose after
	// state is still kept (dropDead); states are the states materialized for
	// the files and the reference after the run (check), by record.
	log      *stateLog
	held     []int32
	dropNext int // dropDead runs when held reaches this (and dropEvery)
	states   map[int32]pmap
	signer   *signer // while run runs
	// lines writes events.jsonl during run; after it, linesFile reads it back
	// and arrivalPos gives each event's line number (0-based) by event index.
	lines      *lineWriter
	linesFile  *os.File
	arrivalPos []int32
}

type stats struct {
	softFailed     int
	softFailChecks int // soft-fail checks that needed the current state resolved
	badAttempts    int
	conflicts      int // power-level conflict pairs created
}

// serverName is the name of server i (server1.test is the origin).
func serverName(i int) string { return fmt.Sprintf("server%d.test", i+1) }

// deriveKey derives server i's signing key from the seed.
func deriveKey(seed uint64, i int) ed25519.PrivateKey {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], seed)
	binary.BigEndian.PutUint64(b[8:], uint64(i))
	s := sha256.Sum256(append([]byte("mtxdb gen signing key\x00"), b[:]...))
	return ed25519.NewKeyFromSeed(s[:])
}

func newRoom(opts Options) (*room, error) {
	ver, err := gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersion(opts.RoomVersion))
	if err != nil {
		return nil, fmt.Errorf("gen: %w", err)
	}
	r := &room{
		opts:         opts,
		rng:          rand.New(rand.NewPCG(opts.Seed, 0x6d747864622d6765)),
		ver:          ver,
		byID:         map[string]int32{},
		ts:           startTS + int64(opts.Seed%1_000_000)*1000, // distinct v12 room IDs per seed
		plCache:      map[int32]*gomatrixserverlib.PowerLevelContent{},
		jrCache:      map[int32]string{},
		plainAllowed: map[string]error{},
		memo:         map[string]pmap{},
		resCache:     resolver.NewCache(),
		log:          newStateLog(),
	}
	perServer := (opts.Members*5/4 + opts.Servers - 1) / opts.Servers
	perServer = max(perServer, 4)
	for i := range opts.Servers {
		keySeed := opts.Seed
		if opts.KeySeed != 0 {
			keySeed = opts.KeySeed
		}
		s := &server{idx: i, name: serverName(i), key: deriveKey(keySeed, i)}
		for j := range perServer {
			s.users = append(s.users, len(r.users))
			r.users = append(r.users, user{
				id:     fmt.Sprintf("@user%d:%s", j+1, s.name),
				server: i,
				name:   fmt.Sprintf("User %d of %s", j+1, s.name),
			})
		}
		r.servers = append(r.servers, s)
	}
	return r, nil
}

// run generates the room: the creation events, then one event per tick, then
// delivers everything still in flight. It writes events.jsonl to dir (created
// if missing) as the events reach the origin; closeLines closes it for reading.
func (r *room) run(dir string, progress func(done int)) (err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if r.lines, err = startLineWriter(filepath.Join(dir, "events.jsonl")); err != nil {
		return err
	}
	r.signer = startSigner()
	defer func() {
		r.signer.finish()
		r.signer = nil
		if lerr := r.openLines(); err == nil {
			err = lerr
		}
	}()
	if err := r.createRoom(); err != nil {
		return err
	}
	for len(r.events) < r.opts.Events {
		r.tick++
		r.ts += 1000 + r.rng.Int64N(4000)
		r.deliverDue()
		if err := r.step(); err != nil {
			return err
		}
		if r.err != nil {
			return r.err
		}
		if progress != nil {
			progress(len(r.events))
		}
		if len(r.held) >= max(dropEvery, r.dropNext) {
			r.dropDead()
			r.dropNext = 2 * len(r.held) // events that stay alive long do not make every step sweep
		}
	}
	// Drain the network, then let the origin fetch whatever was lost for good.
	for r.queue.Len() > 0 {
		d := heap.Pop(&r.queue).(delivery)
		r.receive(r.servers[d.server], d.event)
	}
	for i := range r.events {
		r.receive(r.servers[0], int32(i))
	}
	return r.err
}

func (r *room) deliverDue() {
	for r.queue.Len() > 0 && r.queue[0].at <= r.tick {
		d := heap.Pop(&r.queue).(delivery)
		r.receive(r.servers[d.server], d.event)
	}
}

// broadcast sends an event from its server to every other resident server.
func (r *room) broadcast(idx int32) {
	from := r.events[idx].server
	for _, s := range r.servers {
		if s.idx == from || !s.joined {
			continue
		}
		if r.rng.Float64() < r.opts.Loss {
			continue
		}
		r.seq++
		heap.Push(&r.queue, delivery{at: r.tick + 1 + r.rng.Int64N(int64(r.opts.MaxDelay)), seq: r.seq, server: s.idx, event: idx})
	}
}

// receive makes an event known to a server, fetching its missing prev and auth
// events first, and updates the server's forward extremities.
func (r *room) receive(s *server, idx int32) {
	if s.known[idx] {
		return
	}
	e := r.events[idx]
	for _, p := range e.prev {
		r.receive(s, p)
	}
	for _, a := range e.auth {
		r.receive(s, a)
	}
	r.accept(s, idx)
}

// accept records a known event at a server (its ancestors are known).
func (r *room) accept(s *server, idx int32) {
	s.known[idx] = true
	e := r.events[idx]
	if s.idx == 0 {
		r.arrival = append(r.arrival, idx)
		r.arrTS = append(r.arrTS, r.ts)
		defer r.emitLine(e) // after the soft-failure check, which reads the PDU
	}
	if e.rejected {
		return
	}
	if s.idx == 0 && e.server != 0 && r.softFails(e) {
		// Soft-failed at the origin: stored with its state, but the origin does not
		// build on it (Matrix spec v1.19, Server-Server API, "Soft failure").
		r.stats.softFailed++
		return
	}
	for _, p := range e.prev {
		s.refd[p] = true
		if i := slices.Index(s.extrem, p); i >= 0 {
			s.extrem = slices.Delete(s.extrem, i, i+1)
		}
	}
	if !s.refd[idx] {
		s.extrem = append(s.extrem, idx)
	}
}

// grow extends every server's per-event slices for a new event.
func (r *room) grow() {
	for _, s := range r.servers {
		s.known = append(s.known, false)
		s.refd = append(s.refd, false)
	}
}

// join makes a server resident: it takes a resident server's view of the room (the
// events and extremities a send_join response gives it).
func (r *room) join(s *server) {
	if s.joined {
		return
	}
	res := r.servers[0]
	copy(s.known, res.known)
	copy(s.refd, res.refd)
	s.extrem = slices.Clone(res.extrem)
	s.joined = true
}

// prevEvents picks a server's prev_events: its extremities, highest depth first,
// at most MaxPrevEvents.
func (r *room) prevEvents(s *server) []int32 {
	ext := slices.Clone(s.extrem)
	slices.SortFunc(ext, func(a, b int32) int {
		if da, db := r.events[a].depth, r.events[b].depth; da != db {
			if da > db {
				return -1
			}
			return 1
		}
		return int(b - a)
	})
	if len(ext) > r.opts.MaxPrevEvents {
		ext = ext[:r.opts.MaxPrevEvents]
	}
	return ext
}
