package dendrite

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/matrix-org/dendrite/roomserver/state"
	"github.com/matrix-org/dendrite/roomserver/types"
	"github.com/matrix-org/gomatrixserverlib"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
	"github.com/mtxdb/mtxdb/roomstate"
)

// Errors of this package.
var (
	// ErrUnknownNID is returned when Dendrite passes a NID this store never handed out.
	ErrUnknownNID = errors.New("mtxdb/dendrite: unknown NID")
	// ErrWrongRoom is returned when a NID or event of one room is used with another.
	ErrWrongRoom = errors.New("mtxdb/dendrite: NID belongs to another room")
	// ErrCorruptRecord is returned when a NID record fails its checks.
	ErrCorruptRecord = errors.New("mtxdb/dendrite: corrupt NID record")
	// ErrBadStateEntry is returned when AddState is given an entry whose event is not
	// the state event of the entry's (type, state key).
	ErrBadStateEntry = errors.New("mtxdb/dendrite: state entry does not match its event")
)

// wellKnownTypes are the event type NIDs Dendrite hard-codes (roomserver/types).
var wellKnownTypes = map[string]int64{
	"m.room.create":             types.MRoomCreateNID,
	"m.room.power_levels":       types.MRoomPowerLevelsNID,
	"m.room.join_rules":         types.MRoomJoinRulesNID,
	"m.room.third_party_invite": types.MRoomThirdPartyInviteNID,
	"m.room.member":             types.MRoomMemberNID,
	"m.room.redaction":          types.MRoomRedactionNID,
	"m.room.history_visibility": types.MRoomHistoryVisibilityNID,
}

// Storage holds the NID spaces of every room of one roomstate.Store. It is safe for
// concurrent use.
type Storage struct {
	store *roomstate.Store
	eng   packstore.StorageEngine

	mu     sync.Mutex // guards tables
	tables map[nidKind]*nidTable
}

// New opens the NID spaces kept in store's engine (creating them on first use)
// and records Dendrite's fixed NIDs: event types 1 to 7 and the empty state key 1.
func New(store *roomstate.Store) (*Storage, error) {
	s := &Storage{store: store, eng: store.Engine(), tables: map[nidKind]*nidTable{
		kindRoom:      newTable(kindRoom, 1),
		kindEventType: newTable(kindEventType, types.MRoomHistoryVisibilityNID+1),
		kindStateKey:  newTable(kindStateKey, types.EmptyStateKeyNID+1),
		kindEvent:     newTable(kindEvent, 1),
		kindSnapshot:  newTable(kindSnapshot, 1),
	}}
	for name, nid := range wellKnownTypes {
		if err := s.tables[kindEventType].fix(s.eng, name, nid); err != nil {
			return nil, err
		}
	}
	if err := s.tables[kindStateKey].fix(s.eng, "", types.EmptyStateKeyNID); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Storage) nid(k nidKind, name string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tables[k].get(s.eng, name)
}

func (s *Storage) name(k nidKind, nid int64) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tables[k].name(s.eng, nid)
}

// Room opens the Dendrite view of one imported and replayed room: the storage
// Dendrite's StateResolution needs and the RoomInfo to pass beside it, whose
// snapshot is the room's current state.
func (s *Storage) Room(ctx context.Context, roomID string) (*RoomStorage, *types.RoomInfo, error) {
	room, err := s.store.Room(ctx, roomID)
	if err != nil {
		return nil, nil, err
	}
	nid, err := s.nid(kindRoom, roomID)
	if err != nil {
		return nil, nil, err
	}
	w := room.StateWriter(false)
	rs := &RoomStorage{s: s, room: room, nid: types.RoomNID(nid), rd: w.Reader(), w: w}
	info := &types.RoomInfo{RoomNID: rs.nid, RoomVersion: gomatrixserverlib.RoomVersion(room.Head().RoomVersion)}
	cur, err := rs.snapshotNID(room.Head().CurrentState)
	if err != nil {
		return nil, nil, err
	}
	info.SetStateSnapshotNID(cur)
	return rs, info, nil
}

// RoomStorage implements Dendrite's state.StateResolutionStorage for one room. Event
// type and state-key NIDs are shared by all rooms of the Storage; event and snapshot
// NIDs name their room, and using one of another room is an error (ErrWrongRoom).
// Safe for concurrent use.
//
// Lists keyed by NID (StateBlockNIDs, StateEntries, StateEntriesForTuples, Events)
// come back sorted by that NID, as Dendrite's SQL returns them: its callers find
// entries by binary search.
//
// State blocks: every snapshot is one state block, and the block NID equals the
// snapshot NID (doc.go).
type RoomStorage struct {
	s   *Storage
	nid types.RoomNID

	mu   sync.Mutex             // guards room and rd
	room *roomstate.Room        // not safe for concurrent use
	rd   *hamtstore.Reader      // caches decoded nodes
	w    *roomstate.StateWriter // writes snapshots (rd is its reader)
}

var _ state.StateResolutionStorage = (*RoomStorage)(nil)

// RoomNID returns the room's NID.
func (r *RoomStorage) RoomNID() types.RoomNID { return r.nid }

// EventNID returns the NID of an event of this room (assigning it on first use).
func (r *RoomStorage) EventNID(eventID string) (types.EventNID, error) {
	n, err := r.s.nid(kindEvent, u64(int64(r.nid))+eventID)
	return types.EventNID(n), err
}

// SnapshotRoot returns the HAMT root a snapshot NID of this room names.
func (r *RoomStorage) SnapshotRoot(nid types.StateSnapshotNID) (hamtstore.NodeID, error) {
	name, err := r.s.name(kindSnapshot, int64(nid))
	if err != nil {
		return hamtstore.NodeID{}, err
	}
	var root hamtstore.NodeID
	if len(name) != nidFieldLen+len(root) {
		return root, fmt.Errorf("%w: snapshot NID %d: name of %d bytes", ErrCorruptRecord, nid, len(name))
	}
	if room := types.RoomNID(binary.LittleEndian.Uint64([]byte(name))); room != r.nid {
		return root, fmt.Errorf("%w: snapshot NID %d is of room NID %d, not %d", ErrWrongRoom, nid, room, r.nid)
	}
	copy(root[:], name[nidFieldLen:])
	return root, nil
}

func (r *RoomStorage) snapshotNID(root hamtstore.NodeID) (types.StateSnapshotNID, error) {
	n, err := r.s.nid(kindSnapshot, u64(int64(r.nid))+string(root[:]))
	return types.StateSnapshotNID(n), err
}

func (r *RoomStorage) eventID(nid types.EventNID) (string, error) {
	name, err := r.s.name(kindEvent, int64(nid))
	if err != nil {
		return "", err
	}
	if len(name) < nidFieldLen {
		return "", fmt.Errorf("%w: event NID %d: name of %d bytes", ErrCorruptRecord, nid, len(name))
	}
	if room := types.RoomNID(binary.LittleEndian.Uint64([]byte(name))); room != r.nid {
		return "", fmt.Errorf("%w: event NID %d is of room NID %d, not %d", ErrWrongRoom, nid, room, r.nid)
	}
	return name[nidFieldLen:], nil
}

// EventTypeNIDs implements StateResolutionStorage. Unlike Dendrite's SQL tables it
// assigns a NID to a type it has not seen: types enter our store with events,
// which never pass through here, so "not yet assigned" does not mean "absent".
func (r *RoomStorage) EventTypeNIDs(ctx context.Context, eventTypes []string) (map[string]types.EventTypeNID, error) {
	out := make(map[string]types.EventTypeNID, len(eventTypes))
	for _, t := range eventTypes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n, err := r.s.nid(kindEventType, t)
		if err != nil {
			return nil, err
		}
		out[t] = types.EventTypeNID(n)
	}
	return out, nil
}

// EventStateKeyNIDs implements StateResolutionStorage; like EventTypeNIDs it assigns.
func (r *RoomStorage) EventStateKeyNIDs(ctx context.Context, keys []string) (map[string]types.EventStateKeyNID, error) {
	out := make(map[string]types.EventStateKeyNID, len(keys))
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n, err := r.s.nid(kindStateKey, k)
		if err != nil {
			return nil, err
		}
		out[k] = types.EventStateKeyNID(n)
	}
	return out, nil
}

// StateBlockNIDs implements StateResolutionStorage: one block per snapshot, with
// the snapshot's own NID. It checks that each snapshot NID is of this room.
func (r *RoomStorage) StateBlockNIDs(ctx context.Context, snaps []types.StateSnapshotNID) ([]types.StateBlockNIDList, error) {
	out := make([]types.StateBlockNIDList, len(snaps))
	for i, sn := range snaps {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if _, err := r.SnapshotRoot(sn); err != nil {
			return nil, err
		}
		out[i] = types.StateBlockNIDList{StateSnapshotNID: sn, StateBlockNIDs: []types.StateBlockNID{types.StateBlockNID(sn)}}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StateSnapshotNID < out[j].StateSnapshotNID })
	return out, nil
}

// StateEntries implements StateResolutionStorage: each block's whole snapshot,
// sorted by (type NID, state key NID). It reads every node and every entry's
// metadata record of the snapshot.
func (r *RoomStorage) StateEntries(ctx context.Context, blocks []types.StateBlockNID) ([]types.StateEntryList, error) {
	out := make([]types.StateEntryList, len(blocks))
	for i, b := range blocks {
		root, err := r.SnapshotRoot(types.StateSnapshotNID(b))
		if err != nil {
			return nil, err
		}
		entries, err := r.entries(ctx, root)
		if err != nil {
			return nil, err
		}
		out[i] = types.StateEntryList{StateBlockNID: b, StateEntries: entries}
	}
	sortLists(out)
	return out, nil
}

// entries returns a snapshot as sorted Dendrite state entries.
func (r *RoomStorage) entries(ctx context.Context, root hamtstore.NodeID) ([]types.StateEntry, error) {
	r.mu.Lock()
	m, err := r.room.State(ctx, r.rd, root)
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	out := make([]types.StateEntry, 0, len(m))
	for k, id := range m {
		e, err := r.entry(k.Type, k.StateKey, id)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LessThan(out[j]) })
	return out, nil
}

func cut(k string) (string, string, bool) {
	for i := 0; i < len(k); i++ {
		if k[i] == 0 {
			return k[:i], k[i+1:], true
		}
	}
	return k, "", false
}

func (r *RoomStorage) entry(eventType, stateKey, eventID string) (types.StateEntry, error) {
	tn, err := r.s.nid(kindEventType, eventType)
	if err != nil {
		return types.StateEntry{}, err
	}
	kn, err := r.s.nid(kindStateKey, stateKey)
	if err != nil {
		return types.StateEntry{}, err
	}
	en, err := r.EventNID(eventID)
	if err != nil {
		return types.StateEntry{}, err
	}
	return types.StateEntry{
		StateKeyTuple: types.StateKeyTuple{EventTypeNID: types.EventTypeNID(tn), EventStateKeyNID: types.EventStateKeyNID(kn)},
		EventNID:      en,
	}, nil
}

// SnapshotNIDFromEventID implements StateResolutionStorage: the snapshot of the
// state before the event.
func (r *RoomStorage) SnapshotNIDFromEventID(ctx context.Context, eventID string) (types.StateSnapshotNID, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	st, err := r.eventState(eventID)
	if err != nil {
		return 0, err
	}
	return r.snapshotNID(st.Before)
}

// eventState is the state record of an event of this room, with Dendrite's error
// types: MissingEventError for an unknown event, MissingStateError before replay.
func (r *RoomStorage) eventState(eventID string) (roomrecord.EventState, error) {
	r.mu.Lock()
	st, ok, err := r.room.EventState(eventID)
	var metaErr error
	if err == nil && !ok {
		_, metaErr = r.room.Meta(eventID)
	}
	r.mu.Unlock()
	switch {
	case err != nil:
		return st, err
	case errors.Is(metaErr, packstore.ErrNotFound):
		return st, types.MissingEventError(fmt.Sprintf("mtxdb/dendrite: room %s has no event %s", r.room.ID(), eventID))
	case metaErr != nil:
		return st, metaErr
	case !ok:
		return st, types.MissingStateError(fmt.Sprintf("mtxdb/dendrite: room %s: event %s has no state (not replayed)", r.room.ID(), eventID))
	}
	return st, nil
}

// BulkSelectSnapshotsFromEventIDs implements StateResolutionStorage.
func (r *RoomStorage) BulkSelectSnapshotsFromEventIDs(ctx context.Context, eventIDs []string) (map[types.StateSnapshotNID][]string, error) {
	out := map[types.StateSnapshotNID][]string{}
	for _, id := range eventIDs {
		sn, err := r.SnapshotNIDFromEventID(ctx, id)
		if err != nil {
			return nil, err
		}
		out[sn] = append(out[sn], id)
	}
	return out, nil
}

// StateEntriesForTuples implements StateResolutionStorage: per block, the entries
// of the snapshot at the given tuples (about depth node reads per tuple), sorted.
// Every block gets a list, empty when no tuple is set.
func (r *RoomStorage) StateEntriesForTuples(ctx context.Context, blocks []types.StateBlockNID, tuples []types.StateKeyTuple) ([]types.StateEntryList, error) {
	type key struct{ t, sk string }
	keys := make([]key, len(tuples))
	for i, tu := range tuples {
		t, err := r.s.name(kindEventType, int64(tu.EventTypeNID))
		if err != nil {
			return nil, err
		}
		sk, err := r.s.name(kindStateKey, int64(tu.EventStateKeyNID))
		if err != nil {
			return nil, err
		}
		keys[i] = key{t, sk}
	}
	out := make([]types.StateEntryList, len(blocks))
	for i, b := range blocks {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		root, err := r.SnapshotRoot(types.StateSnapshotNID(b))
		if err != nil {
			return nil, err
		}
		list := types.StateEntryList{StateBlockNID: b, StateEntries: []types.StateEntry{}}
		for j, k := range keys {
			r.mu.Lock()
			id, ok, err := r.room.Lookup(r.rd, root, k.t, k.sk)
			r.mu.Unlock()
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
			en, err := r.EventNID(id)
			if err != nil {
				return nil, err
			}
			list.StateEntries = append(list.StateEntries, types.StateEntry{StateKeyTuple: tuples[j], EventNID: en})
		}
		sort.Slice(list.StateEntries, func(x, y int) bool { return list.StateEntries[x].LessThan(list.StateEntries[y]) })
		out[i] = list
	}
	sortLists(out)
	return out, nil
}

// StateAtEventIDs implements StateResolutionStorage: for each event the snapshot
// before it, whether it was rejected, and its own entry (state key NID 0 for a
// message event, as Dendrite stores it).
func (r *RoomStorage) StateAtEventIDs(ctx context.Context, eventIDs []string) ([]types.StateAtEvent, error) {
	out := make([]types.StateAtEvent, len(eventIDs))
	for i, id := range eventIDs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		st, err := r.eventState(id)
		if err != nil {
			return nil, err
		}
		r.mu.Lock()
		m, err := r.room.Meta(id)
		r.mu.Unlock()
		if err != nil {
			return nil, err
		}
		sn, err := r.snapshotNID(st.Before)
		if err != nil {
			return nil, err
		}
		tn, err := r.s.nid(kindEventType, m.Type)
		if err != nil {
			return nil, err
		}
		en, err := r.EventNID(id)
		if err != nil {
			return nil, err
		}
		var kn int64
		if m.IsState {
			if kn, err = r.s.nid(kindStateKey, m.StateKey); err != nil {
				return nil, err
			}
		}
		out[i] = types.StateAtEvent{
			BeforeStateSnapshotNID: sn,
			IsRejected:             st.Rejected,
			StateEntry: types.StateEntry{
				StateKeyTuple: types.StateKeyTuple{EventTypeNID: types.EventTypeNID(tn), EventStateKeyNID: types.EventStateKeyNID(kn)},
				EventNID:      en,
			},
		}
	}
	return out, nil
}

// AddState implements StateResolutionStorage: the snapshot made of the given blocks
// in order, then the given entries, later ones overriding earlier ones at the same
// (type, state key), written as HAMT nodes (about depth new nodes per changed
// entry). Each entry's event must be a state event of this room at that (type,
// state key). Equal states get equal snapshot NIDs, since the root is the content.
func (r *RoomStorage) AddState(ctx context.Context, roomNID types.RoomNID, blocks []types.StateBlockNID, entries []types.StateEntry) (types.StateSnapshotNID, error) {
	if roomNID != r.nid {
		return 0, fmt.Errorf("%w: AddState for room NID %d on room %s (NID %d)", ErrWrongRoom, roomNID, r.room.ID(), r.nid)
	}
	root := hamtstore.EmptyRoot
	set := map[roomrecord.StatePair]string{}
	for i, b := range blocks {
		br, err := r.SnapshotRoot(types.StateSnapshotNID(b))
		if err != nil {
			return 0, err
		}
		if i == 0 {
			root = br
			continue
		}
		more, err := r.entries(ctx, br)
		if err != nil {
			return 0, err
		}
		entries = append(more, entries...)
	}
	for _, e := range entries {
		k, id, err := r.change(e)
		if err != nil {
			return 0, err
		}
		set[k] = id // a later entry overrides an earlier one
	}
	if len(set) > 0 {
		r.mu.Lock()
		nr, err := r.w.Apply(ctx, root, set, nil)
		r.mu.Unlock()
		if err != nil {
			return 0, fmt.Errorf("mtxdb/dendrite: room %s: write state: %w", r.room.ID(), err)
		}
		root = nr
	}
	return r.snapshotNID(root)
}

// change is the snapshot entry of e: its key and event ID, checked against the
// event's metadata.
func (r *RoomStorage) change(e types.StateEntry) (roomrecord.StatePair, string, error) {
	t, err := r.s.name(kindEventType, int64(e.EventTypeNID))
	if err != nil {
		return roomrecord.StatePair{}, "", err
	}
	sk, err := r.s.name(kindStateKey, int64(e.EventStateKeyNID))
	if err != nil {
		return roomrecord.StatePair{}, "", err
	}
	id, err := r.eventID(e.EventNID)
	if err != nil {
		return roomrecord.StatePair{}, "", err
	}
	r.mu.Lock()
	m, err := r.room.Meta(id)
	r.mu.Unlock()
	if err != nil {
		return roomrecord.StatePair{}, "", err
	}
	if !m.IsState || m.Type != t || m.StateKey != sk {
		return roomrecord.StatePair{}, "", fmt.Errorf("%w: room %s: entry (%q, %q) names event %s of (%q, %q, state %v)",
			ErrBadStateEntry, r.room.ID(), t, sk, id, m.Type, m.StateKey, m.IsState)
	}
	return roomrecord.StatePair{Type: t, StateKey: sk}, id, nil
}

// Events implements StateResolutionStorage. The room version argument is ignored:
// the room's own version parses its events.
func (r *RoomStorage) Events(ctx context.Context, _ gomatrixserverlib.RoomVersion, nids []types.EventNID) ([]types.Event, error) {
	out := make([]types.Event, 0, len(nids))
	for _, n := range nids {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		id, err := r.eventID(n)
		if err != nil {
			return nil, err
		}
		r.mu.Lock()
		pdu, err := r.room.Event(id)
		r.mu.Unlock()
		if err != nil {
			return nil, err
		}
		out = append(out, types.Event{EventNID: n, PDU: pdu})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].EventNID < out[j].EventNID })
	return out, nil
}

// sortLists orders lists by block NID: Dendrite binary-searches them.
func sortLists(l []types.StateEntryList) {
	sort.Slice(l, func(i, j int) bool { return l[i].StateBlockNID < l[j].StateBlockNID })
}

// EventsFromIDs implements StateResolutionStorage. Events the room does not hold
// are left out, as Dendrite's SQL query leaves them out.
func (r *RoomStorage) EventsFromIDs(ctx context.Context, info *types.RoomInfo, eventIDs []string) ([]types.Event, error) {
	if info != nil && info.RoomNID != r.nid {
		return nil, fmt.Errorf("%w: EventsFromIDs for room NID %d on room %s (NID %d)", ErrWrongRoom, info.RoomNID, r.room.ID(), r.nid)
	}
	out := make([]types.Event, 0, len(eventIDs))
	for _, id := range eventIDs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r.mu.Lock()
		pdu, err := r.room.Event(id)
		r.mu.Unlock()
		if errors.Is(err, packstore.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		n, err := r.EventNID(id)
		if err != nil {
			return nil, err
		}
		out = append(out, types.Event{EventNID: n, PDU: pdu})
	}
	return out, nil
}

// IsEventRejected implements StateResolutionStorage: the rejection replay recorded.
func (r *RoomStorage) IsEventRejected(ctx context.Context, roomNID types.RoomNID, eventID string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if roomNID != r.nid {
		return false, fmt.Errorf("%w: IsEventRejected for room NID %d on room %s (NID %d)", ErrWrongRoom, roomNID, r.room.ID(), r.nid)
	}
	st, err := r.eventState(eventID)
	return st.Rejected, err
}
