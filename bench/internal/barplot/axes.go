package barplot

import (
	"image/color"
	"math"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// GridColor is the colour of the grid lines Grid draws: light enough that bars and
// lines drawn over it stay the eye's first stop.
var GridColor = color.Gray{Y: 215}

// Grid adds grid lines at p's major ticks: horizontal only (bar charts, whose X
// axis is nominal) or both. Add it before the data so the data is drawn over it.
func Grid(p *plot.Plot, vertical bool) {
	g := plotter.NewGrid()
	g.Horizontal.Color = GridColor
	g.Horizontal.Width = vg.Points(0.5)
	if vertical {
		g.Vertical.Color = GridColor
		g.Vertical.Width = vg.Points(0.5)
	} else {
		g.Vertical.Color = nil
	}
	p.Add(g)
}

// DecadeTicks marks a log axis: a labelled tick at every power of ten, written
// out in full with thousands separators (1,000 and 100,000 rather than Go's
// 1e+03 and 1e+05) or, with Short, as 10k, 100k, 1M; unlabelled ticks at 2x-9x
// between them.
type DecadeTicks struct {
	Short bool
}

// Ticks implements plot.Ticker. min and max must be above 0.
func (t DecadeTicks) Ticks(min, max float64) []plot.Tick {
	ticks := plot.LogTicks{}.Ticks(min, max)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = t.format(ticks[i].Value)
		}
	}
	return ticks
}

func (t DecadeTicks) format(v float64) string {
	if t.Short {
		switch {
		case v >= 1e9:
			return Thousands(v/1e9) + "G"
		case v >= 1e6:
			return Thousands(v/1e6) + "M"
		case v >= 1e3:
			return Thousands(v/1e3) + "k"
		}
	}
	return Thousands(v)
}

// Thousands writes v with a comma between groups of three digits (12,345) when it
// is a whole number, and with Go's shortest form otherwise (0.1).
func Thousands(v float64) string {
	if v != math.Trunc(v) || math.Abs(v) >= 1e15 {
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	s := strconv.FormatInt(int64(math.Abs(v)), 10)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if v < 0 {
		return "-" + string(out)
	}
	return string(out)
}

// LogRange sets an axis to whole decades that hold every positive value of vals:
// log scale, DecadeTicks, Min the decade at or below the smallest value, Max the
// decade at or above the largest. It reports false, leaving the axis alone, when
// no value is positive.
func LogRange(a *plot.Axis, short bool, vals ...float64) bool {
	lo, hi := PositiveRange(vals)
	if hi == 0 {
		return false
	}
	a.Scale = plot.LogScale{}
	a.Tick.Marker = DecadeTicks{Short: short}
	a.Min = math.Pow(10, math.Floor(math.Log10(lo)))
	a.Max = math.Pow(10, math.Ceil(math.Log10(hi)))
	if a.Max <= a.Min {
		a.Max = a.Min * 10
	}
	return true
}

// PlainTicks marks a linear axis with 4 to 10 labelled ticks at a step of 1, 2
// or 5 times a power of ten, an unlabelled tick halfway between each two, and
// labels written without trailing zeros and with thousands separators (250 and
// 1,500 rather than 250.00 and 1500.00).
type PlainTicks struct{}

// Ticks implements plot.Ticker.
func (PlainTicks) Ticks(min, max float64) []plot.Tick {
	if !(max > min) {
		return []plot.Tick{{Value: min, Label: Thousands(min)}}
	}
	step := math.Pow(10, math.Floor(math.Log10((max-min)/4)))
	for _, m := range []float64{1, 2, 5, 10} {
		if (max-min)/(step*m) <= 10 {
			step *= m
			break
		}
	}
	var ticks []plot.Tick
	for i := math.Ceil(min / step); i*step <= max; i++ {
		v := i * step
		ticks = append(ticks, plot.Tick{Value: v, Label: Thousands(roundTo(v, step))})
		if half := v + step/2; half <= max {
			ticks = append(ticks, plot.Tick{Value: half})
		}
	}
	return ticks
}

// roundTo drops the float error that a multiple of step picks up (0.30000000000000004).
func roundTo(v, step float64) float64 {
	digits := max(0, -math.Floor(math.Log10(step)))
	scale := math.Pow(10, digits)
	return math.Round(v*scale) / scale
}

// PositiveRange returns the smallest and the largest value of vals above 0, or
// (+Inf, 0) when there is none.
func PositiveRange(vals []float64) (lo, hi float64) {
	lo = math.Inf(1)
	for _, v := range vals {
		if v > 0 {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	return lo, hi
}
