// Command plotrepack draws the results of `mtxdb bench-repack` (docs/benchmarks.md,
// "Repack locality") as PNGs: for each measured room, one image of three panels,
// the distinct 4 KiB pages read, the seeks and the median cold wall time (ms) of each
// walk (current state, auth chain, backfill, resolve at the extremities), with one
// bar per layout: before the repack and after each plan. A panel whose values span
// 20x or more uses a log scale.
//
// Usage (from bench/, the module that has gonum/plot):
//
//	go run ./cmd/plotrepack [-out DIR] ../docs/bench/repack-2k.json ...
//
// It reads repack<label>.json and writes repack<label>-<room>.png beside it (or in
// -out), <room> being the room's label in the JSON made file-name safe.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/mtxdb/mtxdb/bench/internal/barplot"
)

// benchFile is the part of cmd/mtxdb's repackBench (repack<label>.json) drawn here.
type benchFile struct {
	Machine string `json:"machine"`
	Runs    int    `json:"cold_runs"`
	Rooms   []struct {
		Label  string `json:"label"`
		Events int64  `json:"events"`
	} `json:"rooms"`
	Cells []cell `json:"cells"`
}

type cell struct {
	Room   string `json:"room"`
	Walk   string `json:"walk"`
	Layout string `json:"layout"`
	Total  struct {
		Pages int64
		Seeks int64
	} `json:"total"`
	ColdMed float64 `json:"cold_ms_median"`
}

func main() {
	out := flag.String("out", "", "output directory (default: beside each JSON file)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: plotrepack [-out DIR] repack<label>.json ...")
		os.Exit(1)
	}
	for _, in := range flag.Args() {
		files, err := plotFile(in, *out)
		if err != nil {
			fmt.Fprintf(os.Stderr, "plotrepack: %s: %v\n", in, err)
			os.Exit(1)
		}
		for _, f := range files {
			fmt.Println(f)
		}
	}
}

// plotFile draws every measured room of one JSON file and returns the PNGs written.
func plotFile(in, outDir string) ([]string, error) {
	b, err := os.ReadFile(in)
	if err != nil {
		return nil, err
	}
	var bf benchFile
	if err := json.Unmarshal(b, &bf); err != nil {
		return nil, err
	}
	if len(bf.Cells) == 0 {
		return nil, fmt.Errorf("no cells (is this a bench-repack JSON?)")
	}
	if outDir == "" {
		outDir = filepath.Dir(in)
	}
	base := strings.TrimSuffix(filepath.Base(in), ".json")
	var written []string
	for _, r := range bf.Rooms {
		name := filepath.Join(outDir, base+"-"+slug(r.Label)+".png")
		title := fmt.Sprintf("%s: %s room, %d events", base, r.Label, r.Events)
		if err := plotRoom(name, title, bf, r.Label); err != nil {
			return written, fmt.Errorf("room %s: %w", r.Label, err)
		}
		written = append(written, name)
	}
	return written, nil
}

// slug makes a room label file-name safe: lower case, runs of other characters as '-'.
func slug(s string) string {
	var sb strings.Builder
	dash := false
	for _, c := range strings.ToLower(s) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			sb.WriteRune(c)
			dash = false
		} else if !dash && sb.Len() > 0 {
			sb.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimSuffix(sb.String(), "-")
}

// metric is one panel: what it shows of a cell, and its axis label.
type metric struct {
	label string
	value func(cell) float64
}

// plotRoom writes one PNG: pages, seeks and cold ms panels and a legend panel.
func plotRoom(file, title string, bf benchFile, room string) error {
	var walks, layouts []string
	byKey := map[[2]string]cell{}
	for _, c := range bf.Cells {
		if c.Room != room {
			continue
		}
		if !slices.Contains(walks, c.Walk) {
			walks = append(walks, c.Walk)
		}
		if !slices.Contains(layouts, c.Layout) {
			layouts = append(layouts, c.Layout)
		}
		byKey[[2]string{c.Walk, c.Layout}] = c
	}
	if len(walks) == 0 {
		return fmt.Errorf("no cells")
	}
	metrics := []metric{
		{"pages (4 KiB)", func(c cell) float64 { return float64(c.Total.Pages) }},
		{"seeks", func(c cell) float64 { return float64(c.Total.Seeks) }},
		{"cold wall time (ms)", func(c cell) float64 { return c.ColdMed }},
	}
	var panels []*plot.Plot
	for _, m := range metrics {
		p, err := panel(m, walks, layouts, byKey)
		if err != nil {
			return err
		}
		panels = append(panels, p)
	}
	panels = append(panels, legendPanel(layouts))

	const w, h = 11 * vg.Inch, 7.5 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	// The figure title above the tiles (a panel title would push one panel down).
	ts := panels[3].Title.TextStyle
	ts.Font.Size = vg.Points(14)
	ts.XAlign, ts.YAlign = draw.XCenter, draw.YTop
	dc.FillText(ts, vg.Point{X: w / 2, Y: h - vg.Millimeter*3}, title)
	tiles := draw.Tiles{Rows: 2, Cols: 2, PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 12, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	grid := [][]*plot.Plot{{panels[0], panels[1]}, {panels[2], panels[3]}}
	canvases := plot.Align(grid, tiles, dc)
	for i := range grid {
		for j := range grid[i] {
			grid[i][j].Draw(canvases[i][j])
		}
	}
	// What the panels count, under the legend.
	notes := []string{
		"pages: distinct 4 KiB pages of shard files read",
		"seeks: reads outside the previous read's pages and the next page",
		fmt.Sprintf("cold: shard files evicted (fadvise DONTNEED), store reopened; median of %d run(s)", bf.Runs),
		"counters are of one run; a missing bar is 0",
		bf.Machine,
	}
	note := ts
	note.Font.Size = vg.Points(9)
	note.XAlign, note.YAlign = draw.XLeft, draw.YBottom
	lc := canvases[1][1]
	for k, line := range notes {
		dc.FillText(note, vg.Point{X: lc.Min.X, Y: lc.Min.Y + vg.Length(len(notes)-1-k)*vg.Points(12)}, line)
	}
	return barplot.WritePNG(img, file)
}

// panel is one metric: the walks on the X axis, a bar per layout in each group.
func panel(m metric, walks, layouts []string, byKey map[[2]string]cell) (*plot.Plot, error) {
	p := plot.New()
	p.Y.Label.Text = m.label
	p.X.Label.Text = "walk"
	barplot.Grid(p, false)
	var vals []float64
	for _, wk := range walks {
		for _, l := range layouts {
			vals = append(vals, m.value(byKey[[2]string{wk, l}]))
		}
	}
	lo, hi := barplot.PositiveRange(vals)
	if hi == 0 {
		return nil, fmt.Errorf("%s: every value is 0", m.label)
	}
	if hi/lo >= 20 {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = barplot.DecadeTicks{}
		p.Y.Min = math.Pow(10, math.Floor(math.Log10(lo*0.9))) // a bar at lo stays visible
		p.Y.Max = math.Pow(10, math.Ceil(math.Log10(hi*1.5)))
		p.Y.Label.Text += ", log scale"
	} else {
		p.Y.Min, p.Y.Max = 0, hi*1.1
		p.Y.Tick.Marker = barplot.PlainTicks{}
	}
	width := vg.Points(60 / float64(len(layouts)))
	for i, l := range layouts {
		b := &barplot.Bars{Width: width, Color: plotutil.Color(i),
			Offset: width * vg.Length(float64(i)-float64(len(layouts)-1)/2)}
		for _, wk := range walks {
			b.Values = append(b.Values, m.value(byKey[[2]string{wk, l}]))
		}
		p.Add(b)
	}
	p.NominalX(walks...)
	p.X.Min, p.X.Max = -0.5, float64(len(walks))-0.5
	return p, nil
}

// legendPanel is the fourth tile: which colour is which layout.
func legendPanel(layouts []string) *plot.Plot {
	p := plot.New()
	p.HideAxes()
	p.Title.Text = "layout (before the repack, after each plan)"
	for i, l := range layouts {
		p.Legend.Add(l, &barplot.Bars{Color: plotutil.Color(i)})
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(11)
	return p
}
