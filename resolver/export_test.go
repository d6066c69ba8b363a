package resolver

import "github.com/matrix-org/gomatrixserverlib"

// ForceSubgraphDirection makes conflictedSubgraph use only its ancestors walk
// ("up") or, where the source allows it, only its descendants walk ("down"), until
// the returned function restores the default.
func ForceSubgraphDirection(dir string) (restore func()) {
	old := subgraphDirection
	switch dir {
	case "up":
		subgraphDirection = subgraphUp
	case "down":
		subgraphDirection = subgraphDown
	default:
		panic("ForceSubgraphDirection: " + dir)
	}
	return func() { subgraphDirection = old }
}

// ConflictedSubgraph is conflictedSubgraph for src.
func ConflictedSubgraph(src EventSource, conflicted map[string]bool) (map[string]bool, error) {
	return conflictedSubgraph(&stateRes{src: src, pdus: map[string]gomatrixserverlib.PDU{}}, conflicted)
}
