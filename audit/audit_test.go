package audit

import (
	"errors"
	"strings"
	"testing"

	"github.com/mtxdb/mtxdb/recorded"
	"github.com/mtxdb/mtxdb/roomrecord"
)

// fakeEvent is an event of fakeRoom.
type fakeEvent struct {
	seq        uint32
	rejected   bool
	membership string
}

type fakeRoom map[string]fakeEvent

func (f fakeRoom) Meta(id string) (roomrecord.EventMeta, error) {
	e, ok := f[id]
	if !ok {
		return roomrecord.EventMeta{}, errors.New("no such event")
	}
	return roomrecord.EventMeta{Seq: e.seq, EventID: id}, nil
}

func (f fakeRoom) EventState(id string) (roomrecord.EventState, bool, error) {
	e, ok := f[id]
	return roomrecord.EventState{Rejected: e.rejected}, ok, nil
}

func (f fakeRoom) Membership(id string) (string, error) {
	e, ok := f[id]
	if !ok || e.membership == "" {
		return "", errors.New("not a member event")
	}
	return e.membership, nil
}

// TestClassify: one difference per kind, and the order in which the kinds are
// tried where several hold; a rejected_accepted event carries on to the later
// differences it causes; an event the store lacks is an error naming it.
func TestClassify(t *testing.T) {
	room := fakeRoom{
		"$join": {seq: 1, membership: "join"}, "$ban": {seq: 5, membership: "ban"},
		"$leave": {seq: 6, membership: "leave"}, "$badban": {seq: 7, membership: "ban", rejected: true},
		"$pl1": {seq: 2}, "$pl2": {seq: 8}, "$pl3": {seq: 9},
		"$jr1": {seq: 3}, "$jr2": {seq: 10}, "$topic1": {seq: 4}, "$topic2": {seq: 11},
		"$name": {seq: 12}, "$badpl": {seq: 13, rejected: true},
		"$msg": {seq: 14},
	}
	const member = "m.room.member|@u:s"
	for _, c := range []struct {
		event, key, ours, rec string
		want                  Kind
	}{
		{"$msg", "m.room.power_levels|", "$pl2", "$badpl", AcceptedRejected},
		{"$msg", member, "$join", "$badban", AcceptedRejected}, // before ban or member rules
		{"$pl3", "m.room.power_levels|", "$pl3", "$pl2", RejectedAccepted},
		{"$msg", "m.room.power_levels|", "$pl3", "$pl2", RejectedAccepted}, // carried on
		{"$msg", member, "$ban", "$join", BanUndone},
		{"$msg", member, "$ban", "", BanUndone},
		{"$msg", member, "$ban", "$leave", BanUndone},
		{"$msg", member, "$join", "", MemberRemoved},
		{"$msg", member, "$leave", "$join", Reverted},
		{"$msg", member, "$join", "$leave", Differs},
		{"$msg", member, "", "$join", Extra},
		{"$msg", "m.room.power_levels|", "$pl2", "$pl1", PowerLevelsReverted},
		{"$msg", "m.room.join_rules|", "$jr2", "$jr1", JoinRulesReverted},
		{"$msg", "m.room.topic|", "$topic2", "$topic1", Reverted},
		{"$msg", "m.room.topic|", "$topic1", "$topic2", Differs},
		{"$msg", "m.room.name|", "$name", "", Lost},
		{"current state", "m.room.name|", "", "$name", Extra},
		{"current state", "m.room.join_rules|", "$jr2", "$jr1", JoinRulesReverted},
	} {
		m := recorded.Mismatch{Room: "!r:s", Event: c.event, Key: c.key, Ours: c.ours, Recorded: c.rec}
		cl := NewClassifier(room)
		if c.event == "$msg" && c.want == RejectedAccepted {
			if _, err := cl.Classify(recorded.Mismatch{Room: "!r:s", Event: "$pl3", Key: c.key, Ours: "$pl3", Recorded: "$pl2"}); err != nil {
				t.Fatal(err)
			}
		}
		f, err := cl.Classify(m)
		if err != nil || f.Kind != c.want {
			t.Errorf("%v: %q, %v; want %q", m, f.Kind, err, c.want)
		}
	}
	_, err := NewClassifier(room).Classify(recorded.Mismatch{Room: "!r:s", Event: "$msg", Key: "m.room.topic|", Ours: "$topic1", Recorded: "$unknown"})
	if err == nil || !strings.Contains(err.Error(), "$unknown") {
		t.Errorf("a recorded event the store lacks: %v, want an error naming it", err)
	}
	if got := (Finding{Mismatch: recorded.Mismatch{Room: "!r:s", Event: "$e", Key: "m.room.topic|", Ours: "$t"}, Kind: Lost}).String(); got != "finding room=!r:s event=$e key=m.room.topic| kind=lost ours=$t recorded=(none)" {
		t.Errorf("String: %q", got)
	}
}
