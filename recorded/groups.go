package recorded

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	lru "github.com/hashicorp/golang-lru/v2"
)

// Group is one line of state_groups.jsonl: a recorded state as its differences
// from an earlier group (Prev, 0: none, the state is Set alone): Set's entries
// added or replaced ("type\x00state_key" -> event ID), Removed's keys taken out.
// Servers store their states this way (Synapse's state groups and their edges);
// a recording written so (mtxdb import --from) names a group on each line of
// expected_state.jsonl instead of the whole state, and a group's line comes
// before the first line that names it or a group built on it.
type Group struct {
	ID      int64             `json:"state_group"`
	Prev    int64             `json:"prev_state_group,omitempty"`
	Set     map[string]string `json:"set,omitempty"`
	Removed []string          `json:"removed,omitempty"`
}

// groupsFile is the file of a recording's groups, when it has them.
const groupsFile = "state_groups.jsonl"

// groupCacheSize bounds the expanded groups a recording keeps.
const groupCacheSize = 64

// groups holds a recording's state groups as differences, and the last
// expanded ones.
type groups struct {
	byID     map[int64]Group
	expanded *lru.Cache[int64, map[string]string]
}

// loadGroups reads dir's state_groups.jsonl (nil, nil when there is none). A
// line that does not decode, a group given twice, a group whose Prev comes
// later or not at all, or a bad key is ErrMalformed, naming the line.
func loadGroups(dir string) (*groups, error) {
	f, err := os.Open(filepath.Join(dir, groupsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	g := &groups{byID: map[int64]Group{}}
	g.expanded, _ = lru.New[int64, map[string]string](groupCacheSize)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	for line := 1; sc.Scan(); line++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var gr Group
		if err := json.Unmarshal(sc.Bytes(), &gr); err != nil {
			return nil, malformed("recorded: %s/%s line %d: %w", dir, groupsFile, line, err)
		}
		switch _, dup := g.byID[gr.ID]; {
		case gr.ID == 0:
			return nil, malformed("recorded: %s/%s line %d: no state_group", dir, groupsFile, line)
		case dup:
			return nil, malformed("recorded: %s/%s line %d: state group %d given twice", dir, groupsFile, line, gr.ID)
		}
		if _, ok := g.byID[gr.Prev]; gr.Prev != 0 && !ok {
			return nil, malformed("recorded: %s/%s line %d: state group %d builds on group %d, not given before it", dir, groupsFile, line, gr.ID, gr.Prev)
		}
		if err := checkStateKeys(gr.Set); err != nil {
			return nil, malformed("recorded: %s/%s line %d: %w", dir, groupsFile, line, err)
		}
		g.byID[gr.ID] = gr
	}
	if err := sc.Err(); err != nil {
		return nil, malformed("recorded: %s/%s: %w", dir, groupsFile, err)
	}
	return g, nil
}

// state expands a group: the chain of Prev down to a group without one or one
// expanded already, then each group's differences applied back up. The map is
// shared: not to be changed.
func (g *groups) state(id int64) (map[string]string, error) {
	var chain []Group
	var base map[string]string
	for cur := id; cur != 0; {
		if st, ok := g.expanded.Get(cur); ok {
			base = st
			break
		}
		gr, ok := g.byID[cur]
		if !ok {
			return nil, fmt.Errorf("state group %d is not in %s", cur, groupsFile)
		}
		chain = append(chain, gr)
		cur = gr.Prev
	}
	for i := len(chain) - 1; i >= 0; i-- {
		st := make(map[string]string, len(base)+len(chain[i].Set))
		for k, v := range base {
			st[k] = v
		}
		for _, k := range chain[i].Removed {
			delete(st, k)
		}
		for k, v := range chain[i].Set {
			st[k] = v
		}
		g.expanded.Add(chain[i].ID, st)
		base = st
	}
	if base == nil {
		base = map[string]string{}
	}
	return base, nil
}
