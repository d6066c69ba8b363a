package barplot

import (
	"slices"
	"testing"

	"gonum.org/v1/plot"
)

func TestThousands(t *testing.T) {
	for _, c := range []struct {
		v    float64
		want string
	}{{0, "0"}, {999, "999"}, {1000, "1,000"}, {1234567, "1,234,567"}, {-12000, "-12,000"}, {0.25, "0.25"}} {
		if got := Thousands(c.v); got != c.want {
			t.Errorf("Thousands(%v) = %q, want %q", c.v, got, c.want)
		}
	}
}

// labels returns the labelled ticks of a ticker over [min, max].
func labels(tk plot.Ticker, min, max float64) []string {
	var out []string
	for _, t := range tk.Ticks(min, max) {
		if t.Label != "" {
			out = append(out, t.Label)
		}
	}
	return out
}

func TestDecadeTicks(t *testing.T) {
	if got, want := labels(DecadeTicks{}, 10, 100000), []string{"10", "100", "1,000", "10,000", "100,000"}; !slices.Equal(got, want) {
		t.Errorf("DecadeTicks{} over 10..1e5: %q, want %q", got, want)
	}
	if got, want := labels(DecadeTicks{Short: true}, 1e4, 1e6), []string{"10k", "100k", "1M"}; !slices.Equal(got, want) {
		t.Errorf("DecadeTicks{Short} over 1e4..1e6: %q, want %q", got, want)
	}
}

func TestPlainTicks(t *testing.T) {
	for _, c := range []struct {
		min, max float64
		want     []string
	}{
		{0, 0.29, []string{"0", "0.05", "0.1", "0.15", "0.2", "0.25"}},
		{0, 500, []string{"0", "100", "200", "300", "400", "500"}},
		{0, 1900, []string{"0", "200", "400", "600", "800", "1,000", "1,200", "1,400", "1,600", "1,800"}},
	} {
		got := labels(PlainTicks{}, c.min, c.max)
		if !slices.Equal(got, c.want) {
			t.Errorf("PlainTicks over %v..%v: %q, want %q", c.min, c.max, got, c.want)
		}
		if n := len(got); n < 4 || n > 10 {
			t.Errorf("PlainTicks over %v..%v: %d labels, want 4 to 10", c.min, c.max, n)
		}
	}
}
