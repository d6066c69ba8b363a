package authrules_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/stretchr/testify/require"

	"github.com/mtxdb/mtxdb/authrules"
)

// outcomeText is an Allowed outcome as text: "allowed" or the error.
func outcomeText(err error) string {
	if err == nil {
		return "allowed"
	}
	return err.Error()
}

// TestSlimLevelsAllowedAgrees: gomatrixserverlib's Allowed decides every
// conformance case (each rule's breaking event and twin, every version) the
// same, with the same error text, against the auth events forAllowed hands it
// (power levels users map slimmed to the users the check reads) as against the
// full list.
func TestSlimLevelsAllowedAgrees(t *testing.T) {
	n := 0
	for v := 1; v <= authrules.MaxVersion; v++ {
		for _, r := range authrules.Rules(fmt.Sprint(v)) {
			c, ok := ruleCases[r.ID]
			if !r.Leaf || !ok || c.needsKeys {
				continue
			}
			for _, bad := range []bool{true, false} {
				b, p, evs := c.make(t, v, r, bad)
				list := gmslList(b, p, evs)
				want := outcomeText(allowedOn(p, list))
				got := outcomeText(allowedOn(p, authrules.ForAllowed(p, list)))
				require.Equal(t, want, got, "v%d rule %s (%s) bad=%v", v, r.Num, r.ID, bad)
				n++
			}
		}
	}
	require.Greater(t, n, 500, "conformance cases compared")
}

// TestSlimLevelsAllowedAgreesRandom: random rooms with a power levels event of
// many users (levels of all kinds, a non-ASCII user ID) and
// random membership changes, state events and messages among them; Allowed's
// outcome and error text are the same against the slimmed list as against the
// full one. The seed is printed.
func TestSlimLevelsAllowedAgreesRandom(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	memberships := []string{spec.Join, spec.Invite, spec.Leave, spec.Ban, spec.Knock}
	allowedN, rejectedN := 0, 0
	for round := 0; round < 40; round++ {
		v := 1 + rng.IntN(authrules.MaxVersion)
		b := newBld(t, v, nil)
		// gomatrixserverlib does not build events whose content has keys with quotes
		// or backslashes; jsonstr's FuzzAppend covers their escaping.
		users := []string{alice, bob, carol, dave, "@\u00e9t\u00e9:e.test"}
		for i := 0; i < 40; i++ {
			users = append(users, fmt.Sprintf("@u%d:s%d.test", i, rng.IntN(3)))
		}
		levels := map[string]any{}
		for _, u := range users {
			if rng.IntN(4) > 0 {
				levels[u] = []int{0, 10, 50, 75, 100}[rng.IntN(5)]
			}
		}
		levels[carol] = nil
		pl := b.pl(alice, map[string]any{"users": levels, "kick": 60, "ban": 40, "invite": rng.IntN(60),
			"events": map[string]any{"m.room.name": 70, "x.custom": 5}, "state_default": 20})
		st := b.base(pl)
		if v >= 8 && rng.IntN(2) == 0 {
			st = b.base(pl, b.ev(alice, spec.MRoomJoinRules, ptr(""), map[string]any{"join_rule": "restricted",
				"allow": []any{map[string]any{"type": "m.room_membership", "room_id": "!other:a.test"}}}, []string{b.create.EventID()}, nil, nil))
		}
		for i := 0; i < 40; i++ {
			sender, target := users[rng.IntN(len(users))], users[rng.IntN(len(users))]
			var p gomatrixserverlib.PDU
			via := ""
			switch rng.IntN(4) {
			case 0:
				extra := map[string]any{}
				if rng.IntN(2) == 0 {
					via = users[rng.IntN(len(users))]
					extra["join_authorised_via_users_server"] = via
				}
				m := memberships[rng.IntN(len(memberships))]
				if via != "" {
					m, target = spec.Join, sender
				}
				p = b.member(sender, target, m, extra)
			case 1:
				p = b.ev(sender, "x.custom", ptr(target), map[string]any{}, []string{b.create.EventID()}, nil, nil)
			case 2:
				p = b.ev(sender, spec.MRoomName, ptr(""), map[string]any{"name": "n"}, []string{b.create.EventID()}, nil, nil)
			default:
				p = b.msg(sender)
			}
			evs := slices.Clone(st)
			if via != "" {
				// A restricted join: the joiner not yet in the room, the via user joined.
				evs = append(evs, b.member(via, via, spec.Join, nil))
			} else {
				evs = append(evs, b.member(target, target, spec.Join, nil))
				if target != sender || rng.IntN(2) == 0 {
					evs = append(evs, b.member(sender, sender, spec.Join, nil))
				}
			}
			list := gmslList(b, p, evs)
			want := allowedOn(p, list)
			got := allowedOn(p, authrules.ForAllowed(p, list))
			require.Equal(t, outcomeText(want), outcomeText(got), "seed %d round %d: %s", seed, round, p.JSON())
			if want == nil {
				allowedN++
			} else {
				rejectedN++
			}
		}
	}
	require.Greater(t, allowedN, 100, "allowed events compared")
	require.Greater(t, rejectedN, 100, "rejected events compared")
}
