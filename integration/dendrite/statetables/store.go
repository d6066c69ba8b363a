package statetables

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/matrix-org/dendrite/roomserver/types"
	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/pgstore"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	// LeaseStep is how many snapshot seqs one lease record covers (doc.go "Records").
	LeaseStep = 1024
	// MaxRoomNID is the largest room NID a snapshot NID can carry (room NID << 32).
	MaxRoomNID = 1<<31 - 2
	// deltaRoom is the room field of delta block NIDs.
	deltaRoom = 1<<31 - 1
	maxSeq    = 1<<32 - 1

	// Cache bounds: NID -> root, (room, root) -> seq, and snapshot -> event NIDs.
	rootCacheSize    = 1 << 16
	seqCacheSize     = 1 << 16
	entriesCacheSize = 256
	// DeltaCapacity bounds the in-memory delta blocks (oldest dropped first).
	DeltaCapacity = 1 << 16

	recordVersion = 1
)

// ErrBroken is returned by every write after a sync of the engine failed: what was
// appended since the last good sync may not be durable, so the store hands out no
// NID until it is reopened (as PostgreSQL stops after an fsync failure).
var ErrBroken = errors.New("statetables: an earlier sync failed; reopen the store")

// Store is the mtxdb state store of one Dendrite roomserver database: it implements
// tables.StateSnapshot and tables.StateBlock. Its records are in a packstore
// directory (Open: a SQLite Dendrite) or in the roomserver's own PostgreSQL
// database (OpenPostgres), doc.go "Where the records are". Safe for concurrent use.
type Store struct {
	eng    *packstore.PackfileStorage // Open's engine; nil on PostgreSQL
	db     *sql.DB                    // OpenPostgres's database; nil with eng
	dir    string                     // eng's directory (absolute)
	where  string                     // for messages: the directory or the database
	commit groupCommit

	mu    sync.Mutex
	rooms map[types.RoomNID]*room

	roots   *lru.Cache[types.StateSnapshotNID, snapRef]
	seqs    *lru.Cache[roomRoot, types.StateSnapshotNID]
	entries *lru.Cache[types.StateSnapshotNID, []types.EventNID]
	layers  sizedCache[types.StateSnapshotNID, *layer]
	// nodes: HAMT nodes read from the collections (PostgreSQL only, else nil).
	nodes  *sizedCache[hamtstore.NodeID, []byte]
	deltas deltaTable

	// chainLimit is ChainLimit; tests lower it to reach checkpoints sooner.
	chainLimit uint32

	// eventsDB is the roomserver database EventRows reads (SetEventsDB), of
	// SQLite when eventsSQLite.
	eventsDB     *sql.DB
	eventsSQLite bool

	// metricsReg and metricsColl: where RegisterMetrics registered the
	// engine's collector (guarded by registryMu).
	metricsReg  prometheus.Registerer
	metricsColl prometheus.Collector
}

// records is what the store reads and writes its records through: the packstore
// engine, or pgstore's view over Dendrite's database or transaction.
type records interface {
	Get(coll, id packstore.ID) ([]byte, error)
	GetMany(coll packstore.ID, ids []packstore.ID) ([][]byte, error)
	PutMany(coll packstore.ID, recs []packstore.Record) error
}

// at returns where a call that Dendrite handed txn reads and writes: the packstore
// engine (txn ignored), the transaction txn (PostgreSQL), or the database itself
// (PostgreSQL, txn nil: each PutMany a transaction of its own).
func (s *Store) at(ctx context.Context, txn *sql.Tx) records {
	switch {
	case s.db == nil:
		return s.eng
	case txn != nil:
		return pgstore.OverSQL(ctx, txn)
	default:
		return pgstore.OverSQL(ctx, s.db)
	}
}

// cacheable reports whether what a call handed txn reads or writes may enter the
// caches: not when it may be a row of a Dendrite transaction that is still open
// (it could roll back, and a cached NID would outlive it).
func (s *Store) cacheable(txn *sql.Tx) bool { return s.db == nil || txn == nil }

// durable returns once what was written is durable: a group commit of the packstore
// engine; on PostgreSQL every write is committed (or in Dendrite's transaction) when
// it returns.
func (s *Store) durable() error {
	if s.eng == nil {
		return nil
	}
	return s.commit.wait()
}

type roomRoot struct {
	room types.RoomNID
	root hamtstore.NodeID
}

// room is one room's write state: its collection, seq counter and lease.
type room struct {
	nid  types.RoomNID
	coll packstore.ID
	mu   sync.Mutex
	// loaded: next and leaseEnd hold the room's counter (read from the lease record).
	loaded   bool
	next     uint32
	leaseEnd uint32
	// last is the snapshot this Store wrote last for the room (seq 0: none yet),
	// which a state not made from one snapshot is chained to when close to it
	// (mergeBase). On PostgreSQL its transaction may have rolled back: it is
	// used only when the caller's view finds its record.
	last snapRef
}

var (
	registryMu sync.Mutex
	registry   = map[string]*sharedStore{}
)

type sharedStore struct {
	s    *Store
	refs int
}

// Open opens (creating it if needed) the store in dir. A directory already open in
// this process is shared (packstore locks a directory per open file, and Dendrite
// may open one database more than once); Close releases one reference.
// Errors: those of packstore.Open (ErrLocked when another process holds dir).
func Open(dir string) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("statetables: store directory %q: %w", dir, err)
	}
	registryMu.Lock()
	defer registryMu.Unlock()
	if sh, ok := registry[abs]; ok {
		sh.refs++
		return sh.s, nil
	}
	eng, err := packstore.Open(packstore.DefaultOptions(abs))
	if err != nil {
		return nil, fmt.Errorf("statetables: open store %s: %w", abs, err)
	}
	s := newStore()
	s.eng, s.dir, s.where = eng, abs, abs
	s.commit.sync = eng.Sync
	registry[abs] = &sharedStore{s: s, refs: 1}
	return s, nil
}

func newStore() *Store {
	s := &Store{rooms: map[types.RoomNID]*room{}}
	s.commit.cond = sync.NewCond(&s.commit.mu)
	s.roots, _ = lru.New[types.StateSnapshotNID, snapRef](rootCacheSize)
	s.seqs, _ = lru.New[roomRoot, types.StateSnapshotNID](seqCacheSize)
	s.entries, _ = lru.New[types.StateSnapshotNID, []types.EventNID](entriesCacheSize)
	s.deltas.init(DeltaCapacity)
	s.layers.init(layerCacheBytes, func(l *layer) int { return l.bytes })
	s.chainLimit = ChainLimit
	return s
}

// OpenPostgres opens the store whose records are in the PostgreSQL database db
// (pgstore's tables, created if missing: pgstore.PrepareSQL), the roomserver
// database of a PostgreSQL Dendrite. Any number of Stores, in this process or
// others, may open one database (snapshot NIDs come from leases taken by
// compare-and-set: doc.go "Where the records are"). db stays the caller's: Close
// does not close it. Errors: those of the schema step (pgstore.ErrSchemaVersion).
func OpenPostgres(ctx context.Context, db *sql.DB) (*Store, error) {
	if err := pgstore.PrepareSQL(ctx, db, false); err != nil {
		return nil, fmt.Errorf("statetables: %w", err)
	}
	var name string
	if err := db.QueryRowContext(ctx, "SELECT current_database()").Scan(&name); err != nil {
		return nil, fmt.Errorf("statetables: PostgreSQL database name: %w", err)
	}
	s := newStore()
	s.db, s.where = db, "PostgreSQL database "+name+" (table mtxdb_records)"
	s.nodes = &sizedCache[hamtstore.NodeID, []byte]{}
	s.nodes.init(nodeCacheBytes, func(b []byte) int { return len(b) + len(hamtstore.NodeID{}) })
	return s, nil
}

// Close releases this reference; the last one closes the engine.
func (s *Store) Close() error {
	if s.eng == nil {
		return nil
	}
	registryMu.Lock()
	defer registryMu.Unlock()
	sh, ok := registry[s.dir]
	if !ok || sh.s != s {
		return nil
	}
	sh.refs--
	if sh.refs > 0 {
		return nil
	}
	delete(registry, s.dir)
	if s.metricsReg != nil {
		s.metricsReg.Unregister(s.metricsColl)
		s.metricsReg, s.metricsColl = nil, nil
	}
	return s.eng.Close()
}

// Dir is the store's directory (absolute); "" for a store in PostgreSQL.
func (s *Store) Dir() string { return s.dir }

// Where names the store's place for messages: its directory or its database.
func (s *Store) Where() string { return s.where }

// Empty reports whether the store holds no room at all.
func (s *Store) Empty() (bool, error) {
	if s.eng != nil {
		return len(s.eng.Collections()) == 0, nil
	}
	return pgstore.OverSQL(context.Background(), s.db).Empty()
}

// Syncs is the number of engine syncs so far (group commits).
func (s *Store) Syncs() uint64 {
	s.commit.mu.Lock()
	defer s.commit.mu.Unlock()
	return s.commit.syncs
}

// --- identifiers ------------------------------------------------------------------

func hashID(parts ...[]byte) packstore.ID { return packstore.HashID(parts...) }

// RoomCollection is the packstore collection of a room's state.
func RoomCollection(roomNID types.RoomNID) packstore.ID {
	return hashID([]byte("mtxdb/dendrite/state/room\x00"), binary.LittleEndian.AppendUint64(nil, uint64(roomNID)))
}

func snapshotRecordID(seq uint32) packstore.ID {
	return hashID([]byte("mtxdb/dendrite/state/nid\x00"), binary.LittleEndian.AppendUint32(nil, seq))
}

func rootRecordID(root hamtstore.NodeID) packstore.ID {
	return hashID([]byte("mtxdb/dendrite/state/root\x00"), root[:])
}

var leaseRecordID = hashID([]byte("mtxdb/dendrite/state/lease"))

// SnapshotNID is the NID of a room's seq-th snapshot (doc.go "NIDs").
func SnapshotNID(roomNID types.RoomNID, seq uint32) types.StateSnapshotNID {
	return types.StateSnapshotNID(int64(roomNID)<<32 | int64(seq))
}

// splitNID returns the room and seq of a snapshot (or block) NID; room 0 is a
// migrated (legacy) snapshot NID, room deltaRoom a delta.
func splitNID(nid int64) (types.RoomNID, uint32) {
	return types.RoomNID(nid >> 32), uint32(nid)
}

func isDelta(nid int64) bool { return nid > 0 && nid>>32 == deltaRoom }

// LegacyCollection maps the snapshot NIDs kept by the migration from Dendrite's SQL
// (NIDs below 2^32) to their rooms; the snapshot records and nodes themselves are in
// the rooms' collections, so a purge removes them too.
var LegacyCollection = hashID([]byte("mtxdb/dendrite/state/legacy"))

// legacyRecordID names a migrated NID: in LegacyCollection ('M' 1 | room NID u64)
// and in its room's collection ('S' 1 | root).
func legacyRecordID(nid types.StateSnapshotNID) packstore.ID {
	return hashID([]byte("mtxdb/dendrite/state/legacy-nid\x00"), binary.LittleEndian.AppendUint64(nil, uint64(nid)))
}

func encodeU64(kind byte, v uint64) []byte {
	return binary.LittleEndian.AppendUint64([]byte{kind, recordVersion}, v)
}

func decodeU64(kind byte, b []byte) (uint64, error) {
	if len(b) != 10 || b[0] != kind || b[1] != recordVersion {
		return 0, fmt.Errorf("statetables: corrupt %q record (%d bytes, kind %q)", kind, len(b), firstByte(b))
	}
	return binary.LittleEndian.Uint64(b[2:]), nil
}

func checkRoom(roomNID types.RoomNID) error {
	if roomNID <= 0 || roomNID > MaxRoomNID {
		return fmt.Errorf("statetables: room NID %d out of range [1, %d]", roomNID, MaxRoomNID)
	}
	return nil
}

// stateKey is the HAMT key of a state key tuple: uvarint(type NID) || uvarint(key NID).
func stateKey(t types.StateKeyTuple) []byte {
	b := binary.AppendUvarint(make([]byte, 0, 8), uint64(t.EventTypeNID))
	return binary.AppendUvarint(b, uint64(t.EventStateKeyNID))
}

func parseStateKey(k []byte) (types.StateKeyTuple, error) {
	t, n := binary.Uvarint(k)
	if n <= 0 {
		return types.StateKeyTuple{}, fmt.Errorf("statetables: corrupt state key %x", k)
	}
	sk, m := binary.Uvarint(k[n:])
	if m <= 0 || n+m != len(k) {
		return types.StateKeyTuple{}, fmt.Errorf("statetables: corrupt state key %x", k)
	}
	return types.StateKeyTuple{EventTypeNID: types.EventTypeNID(t), EventStateKeyNID: types.EventStateKeyNID(sk)}, nil
}

func eventValue(nid types.EventNID) hamtstore.Value {
	var v hamtstore.Value
	binary.LittleEndian.PutUint64(v[:8], uint64(nid))
	return v
}

func valueEvent(v hamtstore.Value) (types.EventNID, error) {
	for _, b := range v[8:] {
		if b != 0 {
			return 0, fmt.Errorf("statetables: corrupt state value %x", v[:])
		}
	}
	return types.EventNID(binary.LittleEndian.Uint64(v[:8])), nil
}

func encodeSnapshot(root hamtstore.NodeID) []byte {
	return append([]byte{'S', recordVersion}, root[:]...)
}

func decodeSnapshot(b []byte) (hamtstore.NodeID, error) {
	var root hamtstore.NodeID
	if len(b) != 2+len(root) || b[0] != 'S' || b[1] != recordVersion {
		return root, fmt.Errorf("%w (%d bytes, kind %q)", ErrCorrupt, len(b), firstByte(b))
	}
	copy(root[:], b[2:])
	return root, nil
}

func encodeU32(kind byte, v uint32) []byte {
	return binary.LittleEndian.AppendUint32([]byte{kind, recordVersion}, v)
}

func decodeU32(kind byte, b []byte) (uint32, error) {
	if len(b) != 6 || b[0] != kind || b[1] != recordVersion {
		return 0, fmt.Errorf("statetables: corrupt %q record (%d bytes, kind %q)", kind, len(b), firstByte(b))
	}
	return binary.LittleEndian.Uint32(b[2:]), nil
}

func firstByte(b []byte) byte {
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

// --- group commit -----------------------------------------------------------------

// groupCommit makes appends durable with as few syncs as possible: a writer that
// appended calls wait; one sync covers every writer registered before it started.
type groupCommit struct {
	mu       sync.Mutex
	cond     *sync.Cond
	appended uint64
	synced   uint64
	syncing  bool
	syncs    uint64
	err      error
	sync     func() error
}

func (g *groupCommit) wait() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.appended++
	mine := g.appended
	for g.synced < mine && g.err == nil {
		if g.syncing {
			g.cond.Wait()
			continue
		}
		g.syncing = true
		target := g.appended
		g.mu.Unlock()
		err := g.sync()
		g.mu.Lock()
		g.syncing = false
		g.syncs++
		if err != nil {
			g.err = fmt.Errorf("%w: %v", ErrBroken, err)
		} else {
			g.synced = target
		}
		g.cond.Broadcast()
	}
	return g.err
}

func (g *groupCommit) broken() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// --- delta blocks -------------------------------------------------------------------

// deltaTable holds the blocks of BulkInsertStateData until InsertState folds them,
// at most capacity of them (the oldest is dropped first).
type deltaTable struct {
	mu    sync.Mutex
	next  uint32
	ring  []uint32
	pos   int
	items map[uint32][]types.StateEntry
}

func (d *deltaTable) init(capacity int) {
	d.ring = make([]uint32, capacity)
	d.items = make(map[uint32][]types.StateEntry, capacity)
}

func (d *deltaTable) put(entries []types.StateEntry) types.StateBlockNID {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.next++
	if d.next == 0 {
		d.next = 1
	}
	if old := d.ring[d.pos]; old != 0 {
		delete(d.items, old)
	}
	d.ring[d.pos] = d.next
	d.pos = (d.pos + 1) % len(d.ring)
	d.items[d.next] = entries
	return types.StateBlockNID(int64(deltaRoom)<<32 | int64(d.next))
}

func (d *deltaTable) get(nid types.StateBlockNID) ([]types.StateEntry, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.items[uint32(nid)]
	return e, ok
}

// --- nodes ------------------------------------------------------------------------

// nodeStore reads a room's HAMT nodes from its collection, through cache when
// not nil. A node ID names its bytes, so a node read in any transaction (even
// one that rolls back) may serve every later read; whether the collection holds
// a node is never answered from the cache (newNodes asks the engine).
type nodeStore struct {
	eng   records
	coll  packstore.ID
	cache *sizedCache[hamtstore.NodeID, []byte]
}

func (n nodeStore) GetNode(id hamtstore.NodeID) ([]byte, error) {
	if n.cache != nil {
		if b, ok := n.cache.get(id); ok {
			return b, nil
		}
	}
	b, err := n.eng.Get(n.coll, packstore.ID(id))
	if errors.Is(err, packstore.ErrNotFound) {
		return nil, fmt.Errorf("statetables: HAMT node %x: %w", id[:], hamtstore.ErrNotFound)
	}
	if err == nil && n.cache != nil {
		n.cache.add(id, b)
	}
	return b, err
}

func (n nodeStore) PutNodes(nodes []hamtstore.EncodedNode) error {
	recs := make([]packstore.Record, len(nodes))
	for i, nd := range nodes {
		recs[i] = packstore.Record{ID: packstore.ID(nd.ID), Data: nd.Data}
	}
	return n.eng.PutMany(n.coll, recs)
}

// overlay collects the nodes a fold builds, so that nothing is written when the
// folded state already has a NID; reads fall through to the room's collection.
type overlay struct {
	base  hamtstore.NodeStore
	nodes map[hamtstore.NodeID][]byte
	order []hamtstore.NodeID
}

func (o *overlay) GetNode(id hamtstore.NodeID) ([]byte, error) {
	if b, ok := o.nodes[id]; ok {
		return b, nil
	}
	return o.base.GetNode(id)
}

func (o *overlay) PutNodes(nodes []hamtstore.EncodedNode) error {
	for _, nd := range nodes {
		if _, ok := o.nodes[nd.ID]; !ok {
			o.nodes[nd.ID] = nd.Data
			o.order = append(o.order, nd.ID)
		}
	}
	return nil
}
