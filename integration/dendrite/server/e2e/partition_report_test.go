package e2e

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"
)

// partitionReport collects every scenario run of TestFederationPartition and writes
// them as Markdown (MTXDB_PARTITION_OUT), a table and then each run's details.
type partitionReport struct {
	started   time.Time
	loadStart string
	wall      []string
	rows      []string
	details   []string
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "**no**"
}

func (p *partitionReport) add(c *fedCluster, r *scenarioRun) {
	outcome := r.outcome
	if r.err != "" {
		outcome = "error: " + r.err
	}
	agree, vsReplay, replays := "-", "-", "-"
	if len(r.states) == 3 {
		agree = yesNo(equalStates(r.states))
	}
	if len(r.replayOK) == 3 {
		var s []string
		allSame := true
		for i, ok := range r.replayOK {
			s = append(s, c.nodes[i].label+" "+yesNo(ok))
			allSame = allSame && sameState(r.replays[i].state, r.replays[0].state)
		}
		vsReplay, replays = strings.Join(s, ", "), yesNo(allSame)
	}
	took := "-"
	if r.outcome == "converged" {
		took = fmt.Sprintf("%.0f s", r.agreeIn.Seconds())
	}
	p.rows = append(p.rows, fmt.Sprintf("| %s | %s | %s | %s | %.0f s | %s | %s | %s |", r.build, r.sc.name, outcome, took, r.took.Seconds(), agree, vsReplay, replays))
	p.details = append(p.details, fmt.Sprintf("### %s, %s\n\n%s\n\n- %s", r.build, r.sc.name, r.sc.what, strings.Join(p.detail(c, r), "\n- ")))
}

// detail is one run's findings, one line each: the contested keys on every server
// and in the replay, every difference between servers and to the replay, what
// replay rejected, the servers' forward extremities, the cut's traffic.
func (p *partitionReport) detail(c *fedCluster, r *scenarioRun) []string {
	var out []string
	out = append(out, fmt.Sprintf("room %s; cut %s; outcome %s after %d rounds", r.room, sidesLabel(c, r.sc), r.outcome, r.rounds))
	if r.err != "" {
		out = append(out, "error: "+r.err)
	}
	if len(r.states) != 3 {
		return append(out, r.notes...)
	}
	var replay map[string]string
	if len(r.replays) > 0 {
		replay = r.replays[0].state
	}
	for _, w := range r.sc.watch {
		key := w[0] + "\x00"
		if w[1] != "" {
			key += c.uid(w[1])
		}
		var vals []string
		for i, s := range r.states {
			vals = append(vals, c.nodes[i].label+": "+c.describe(r, s[key]))
		}
		if replay != nil {
			vals = append(vals, "replay: "+c.describe(r, replay[key]))
		}
		out = append(out, fmt.Sprintf("contested %s/%s: %s", w[0], w[1], strings.Join(vals, "; ")))
	}
	for i, a := range r.audits {
		var cur []string
		for k, kind := range a.current {
			typ, key, _ := strings.Cut(k, "\x00")
			cur = append(cur, fmt.Sprintf("%s/%s %s", typ, c.who(key), kind))
		}
		sort.Strings(cur)
		out = append(out, fmt.Sprintf("mtxdb audit of %s's database: %d findings at %d events, current state: %s", c.nodes[i].label, a.findings, a.events, orNone(cur)))
	}
	labels := []string{c.nodes[0].label, c.nodes[1].label, c.nodes[2].label}
	for _, d := range c.diffKeys(r, labels, r.states) {
		out = append(out, "servers differ on "+d)
	}
	if replay != nil {
		for i, s := range r.states {
			for _, d := range c.diffKeys(r, []string{labels[i], "replay"}, []map[string]string{s, replay}) {
				out = append(out, fmt.Sprintf("%s differs from the replay on %s", labels[i], d))
			}
		}
		for i, rp := range r.replays[1:] {
			for _, d := range c.diffKeys(r, []string{"replay of A", "replay of " + labels[i+1]}, []map[string]string{replay, rp.state}) {
				out = append(out, "replays differ on "+d)
			}
		}
		for _, rej := range r.replays[0].rejected {
			ev, reason, _ := strings.Cut(strings.TrimPrefix(rej, "room="+r.room.String()+" event="), ": ")
			out = append(out, fmt.Sprintf("replay of A's export rejects %s: %s", c.describe(r, ev), reason))
		}
	}
	for i, ex := range r.exports {
		var rej []string
		for _, ev := range ex.rejected {
			rej = append(rej, c.describe(r, ev))
		}
		out = append(out, fmt.Sprintf("%s stored %d events, %d forward extremities, rejected: %s", labels[i], len(ex.events), len(ex.extremities), orNone(rej)))
	}
	out = append(out, "federation requests through the proxy "+r.traffic, "the cut: "+r.cutSeen, "server logs: "+r.logged)
	return append(out, r.notes...)
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func sidesLabel(c *fedCluster, sc *partitionScenario) string {
	var sides []string
	for _, side := range sc.sides {
		var s []string
		for _, i := range side {
			s = append(s, c.nodes[i].label)
		}
		sides = append(sides, strings.Join(s, " "))
	}
	return strings.Join(sides, " | ")
}

func (p *partitionReport) write(t *testing.T, path string) {
	var b strings.Builder
	fmt.Fprintf(&b, "# Federation through a partition\n\n")
	fmt.Fprintf(&b, "Written by `make test-dendrite-partition` (TestFederationPartition in\n`integration/dendrite/server/e2e`): %s, wall time %s; load average %s at the start, %s at the end.\n",
		p.started.UTC().Format("2006-01-02 15:04 UTC"), strings.Join(p.wall, ", "), p.loadStart, loadavg())
	fmt.Fprintf(&b, "The patched build must converge to mtxdb's replay in every scenario; stock is reported, not asserted.\n")
	fmt.Fprintf(&b, "A cut: the test's TLS proxy in front of every server answers 502 at once to a federation request (X-Matrix origin) between the two sides; key requests pass.\n")
	fmt.Fprintf(&b, "\"= replay\": the server's /state equals `mtxdb state` after import and replay of A's export; \"replays agree\": the exports of A, B and C replay to one state.\n\n")
	fmt.Fprintf(&b, "| build | scenario | outcome | agreement after the heal | scenario | servers agree | = replay | replays agree |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range p.rows {
		b.WriteString(r + "\n")
	}
	b.WriteString("\n## Details\n\n")
	b.WriteString(strings.Join(p.details, "\n\n") + "\n")
	t.Logf("results:\n%s", b.String())
	if path == "" {
		return
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Errorf("write %s: %v", path, err)
	} else {
		t.Logf("results written to %s", path)
	}
}
