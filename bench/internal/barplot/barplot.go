// Package barplot draws the benchmark reports' charts with gonum/plot: grouped
// bars that start at the axis floor (so a log scale can place them), a Y axis that
// turns logarithmic when the values span more than a factor of LogSpan, the legend
// in a strip of its own under the plot, where it covers no bar, grid lines at the
// labelled ticks, and tick labels written as people write numbers (1,000; 10k).
package barplot

import (
	"image/color"
	"math"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// LogSpan is the ratio of the largest to the smallest positive value above which
// ScaleY chooses a log scale: at 20x a linear axis leaves the small bars a few
// pixels high.
const LogSpan = 20

// Bars draws one series: a bar per X position (the nominal X values 0, 1, ...),
// from the axis floor up, shifted by Offset within its group. A value <= 0 draws
// nothing (plotter.BarChart starts bars at 0, which a log scale cannot place).
type Bars struct {
	Values []float64
	Width  vg.Length
	Offset vg.Length
	Color  color.Color
}

// Plot implements plot.Plotter.
func (b *Bars) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	for i, v := range b.Values {
		if v <= 0 {
			continue
		}
		x := trX(float64(i)) + b.Offset
		bottom, top := trY(p.Y.Min), trY(min(v, p.Y.Max))
		rect := []vg.Point{{X: x - b.Width/2, Y: bottom}, {X: x - b.Width/2, Y: top},
			{X: x + b.Width/2, Y: top}, {X: x + b.Width/2, Y: bottom}}
		c.FillPolygon(b.Color, c.ClipPolygonY(rect))
	}
}

// Thumbnail draws the legend swatch.
func (b *Bars) Thumbnail(c *draw.Canvas) {
	pts := []vg.Point{{X: c.Min.X, Y: c.Min.Y}, {X: c.Min.X, Y: c.Max.Y}, {X: c.Max.X, Y: c.Max.Y}, {X: c.Max.X, Y: c.Min.Y}}
	c.FillPolygon(b.Color, c.ClipPolygonY(pts))
}

// ScaleY sets p's Y range to show every value of vals (and of extra, such as a
// reference line): from 0 on a linear axis, or on a log axis (whole decades, with
// " (log scale)" added to the label) when the positive values span more than
// LogSpan. It reports whether it chose the log scale; with no positive value it
// leaves the axis alone.
func ScaleY(p *plot.Plot, vals ...float64) bool {
	lo, hi := PositiveRange(vals)
	if hi == 0 {
		return false
	}
	if hi/lo > LogSpan {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = DecadeTicks{}
		p.Y.Min = math.Pow(10, math.Floor(math.Log10(lo*0.9))) // a bar at lo stays visible
		p.Y.Max = math.Pow(10, math.Ceil(math.Log10(hi*1.1)))
		p.Y.Label.Text += " (log scale)"
		return true
	}
	p.Y.Min, p.Y.Max = 0, hi*1.1
	p.Y.Tick.Marker = PlainTicks{}
	return false
}

// Entry is one legend line.
type Entry struct {
	Label string
	Thumb plot.Thumbnailer
}

// SavePNG draws p (without its own legend) over a strip holding the entries, one
// per line, and writes a PNG of w x h.
func SavePNG(p *plot.Plot, entries []Entry, w, h vg.Length, file string) error {
	img := vgimg.New(w, h)
	dc := draw.New(img)
	l := plot.NewLegend()
	l.Left, l.Top = true, true
	for _, e := range entries {
		l.Add(e.Label, e.Thumb)
	}
	lineH := l.TextStyle.Height(" ")
	strip := vg.Length(len(entries))*lineH + vg.Points(8)
	legendArea := draw.Canvas{Canvas: dc, Rectangle: vg.Rectangle{
		Min: vg.Point{X: dc.Min.X + vg.Points(50), Y: dc.Min.Y + vg.Points(4)},
		Max: vg.Point{X: dc.Max.X, Y: dc.Min.Y + strip}}}
	p.Draw(draw.Crop(dc, 0, -vg.Points(12), strip, 0)) // room on the right for the last tick label
	l.Draw(legendArea)
	return WritePNG(img, file)
}

// WritePNG writes a drawn image to file as PNG.
func WritePNG(img *vgimg.Canvas, file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
