// Command plotdendrite draws the results of `make bench-dendrite` (dendrite.json,
// written by integration/dendrite/server/e2e) as one PNG of three panels, each a
// bar per database (SQLite, PostgreSQL) and build (stock Dendrite, Dendrite on
// mtxdb): the room state's bytes after the scripted workload, with the events'
// JSON bytes of the same history beside them; the state-write latency p50; and the
// inbound merge's received-to-visible latency p50.
//
// Usage (from bench/, the module that has gonum/plot; `make plots`):
//
//	go run ./cmd/plotdendrite [-out FILE] ../docs/bench/dendrite.json
//
// It writes dendrite.png beside the JSON file, or FILE.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/mtxdb/mtxdb/bench/internal/barplot"
)

// results is the part of dendrite.json drawn here.
type results struct {
	Runs []struct {
		Database   string  `json:"database"`
		Build      string  `json:"build"`
		Users      int     `json:"users"`
		StateBytes float64 `json:"state_bytes"`
		EventBytes float64 `json:"event_json_bytes"`
		WriteP50   float64 `json:"state_write_p50_ms"`
	} `json:"runs"`
	ForkRuns []struct {
		Database string  `json:"database"`
		Build    string  `json:"build"`
		Members  int     `json:"members"`
		RecvP50  float64 `json:"recv_to_visible_p50_ms"`
	} `json:"fork_runs"`
}

var (
	databases = []string{"sqlite", "postgres"}
	builds    = []string{"stock", "mtxdb"}
)

func main() {
	out := flag.String("out", "", "the PNG to write (default: dendrite.png beside the JSON file)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: plotdendrite [-out FILE] dendrite.json")
		os.Exit(1)
	}
	in := flag.Arg(0)
	if *out == "" {
		*out = filepath.Join(filepath.Dir(in), "dendrite.png")
	}
	if err := plotFile(in, *out); err != nil {
		fmt.Fprintf(os.Stderr, "plotdendrite: %s: %v\n", in, err)
		os.Exit(1)
	}
}

// plotFile reads a dendrite.json and writes its PNG.
func plotFile(in, out string) error {
	b, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	var r results
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	if len(r.Runs) == 0 && len(r.ForkRuns) == 0 {
		return fmt.Errorf("no runs (is this a bench-dendrite JSON?)")
	}
	// value[build][database], 0 where the run is missing.
	grid := func(get func(db, build string) float64) [][]float64 {
		v := make([][]float64, len(builds))
		for i, bd := range builds {
			for _, db := range databases {
				v[i] = append(v[i], get(db, bd))
			}
		}
		return v
	}
	users, members := 0, 0
	state := grid(func(db, bd string) float64 {
		for _, x := range r.Runs {
			if x.Database == db && x.Build == bd {
				users = x.Users
				return x.StateBytes / 1024
			}
		}
		return 0
	})
	events := make([]float64, len(databases))
	for i, db := range databases {
		for _, x := range r.Runs {
			if x.Database == db {
				events[i] = x.EventBytes / 1024
			}
		}
	}
	write := grid(func(db, bd string) float64 {
		for _, x := range r.Runs {
			if x.Database == db && x.Build == bd {
				return x.WriteP50
			}
		}
		return 0
	})
	merge := grid(func(db, bd string) float64 {
		for _, x := range r.ForkRuns {
			if x.Database == db && x.Build == bd {
				members = x.Members
				return x.RecvP50
			}
		}
		return 0
	})
	panels := []*plot.Plot{
		panel(fmt.Sprintf("Room state after %d users joined", users), "state bytes (KiB)", state, events),
		panel("State write latency, p50", "ms", write, nil),
		panel(fmt.Sprintf("Inbound merge, %d members: received to visible, p50", members), "ms", merge, nil),
	}
	return save(out, panels)
}

// panel is one quantity: a group per database, a bar per build, and, when ref is
// given, a hollow bar per database for the events' own bytes.
func panel(title, ylabel string, vals [][]float64, ref []float64) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	barplot.Grid(p, false)
	n := len(vals)
	if ref != nil {
		n++
	}
	w := vg.Points(90 / float64(n))
	var all []float64
	for i, v := range vals {
		b := &barplot.Bars{Values: v, Width: w, Color: plotutil.Color(i), Offset: w * vg.Length(float64(i)-float64(n-1)/2)}
		p.Add(b)
		all = append(all, v...)
	}
	if ref != nil {
		b := &barplot.Bars{Values: ref, Width: w, Color: plotutil.Color(len(vals)), Offset: w * vg.Length(float64(len(vals))-float64(n-1)/2)}
		p.Add(b)
		all = append(all, ref...)
	}
	barplot.ScaleY(p, all...)
	p.NominalX("SQLite", "PostgreSQL")
	p.X.Min, p.X.Max = -0.5, float64(len(databases))-0.5
	p.X.Label.Text = "Dendrite's database"
	return p
}

// save writes the panels side by side as one PNG, over one legend for all of
// them: the colour of each build, and of the events' bytes.
func save(out string, panels []*plot.Plot) error {
	const w, h = 15 * vg.Inch, 5.5 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	l := plot.NewLegend()
	for i, name := range append(builds, "event JSON of the same history (first panel)") {
		l.Add(name, &barplot.Bars{Color: plotutil.Color(i)})
	}
	l.Top, l.Left = true, true
	strip := 3*l.TextStyle.Height(" ") + vg.Millimeter*4
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Millimeter * 8, PadTop: vg.Millimeter * 3,
		PadBottom: strip, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	for i, p := range panels {
		p.Draw(tiles.At(dc, i, 0))
	}
	l.Draw(draw.Canvas{Canvas: dc, Rectangle: vg.Rectangle{
		Min: vg.Point{X: dc.Min.X + vg.Millimeter*20, Y: dc.Min.Y + vg.Millimeter*2},
		Max: vg.Point{X: dc.Max.X, Y: dc.Min.Y + strip}}})
	return barplot.WritePNG(img, out)
}
