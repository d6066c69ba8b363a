package resolver

import "github.com/matrix-org/gomatrixserverlib"

// ForceWalk makes the lockstep walks (v2.1's conflicted subgraph, step 1's power
// subset) use only the ancestors walk ("up") or, where the source allows it, only
// the descendants walk ("down"), until the returned function restores the default.
func ForceWalk(dir string) (restore func()) {
	old := walkDirection
	switch dir {
	case "up":
		walkDirection = walkUp
	case "down":
		walkDirection = walkDown
	default:
		panic("ForceWalk: " + dir)
	}
	return func() { walkDirection = old }
}

// ConflictedSubgraph is conflictedSubgraph for src.
func ConflictedSubgraph(src EventSource, conflicted map[string]bool) (map[string]bool, error) {
	return conflictedSubgraph(&stateRes{src: src, pdus: map[string]gomatrixserverlib.PDU{}}, conflicted)
}

// PowerSubset is step 1's set of the full conflicted set ids, for src.
func PowerSubset(src EventSource, ids []string) ([]string, error) {
	st := &stateRes{src: src, pdus: map[string]gomatrixserverlib.PDU{}}
	full := map[string]bool{}
	for _, id := range ids {
		p, err := st.event(id)
		if err != nil {
			return nil, err
		}
		st.pdus[id] = p
		full[id] = true
	}
	return st.powerSubset(ids, full)
}

// AllowedOnce is Cache.allowedOnce.
func (c *Cache) AllowedOnce(p gomatrixserverlib.PDU, auth []gomatrixserverlib.PDU) error {
	return c.allowedOnce(p, auth)
}

// AllowedList runs the authorization rules without any cache.
func AllowedList(p gomatrixserverlib.PDU, auth []gomatrixserverlib.PDU) error { return allowedList(p, auth) }
