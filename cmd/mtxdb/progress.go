package main

import (
	"io"
	"os"

	"github.com/mattn/go-isatty"
	"github.com/schollz/progressbar/v3"
)

// progress is a progress bar shown only when the output is a terminal; a nil
// *progress is a no-op, so callers need no checks. MTXDB_PROGRESS=0 turns bars
// off; MTXDB_PROGRESS=1 draws them on standard error when the output is not a
// terminal (a log, a test).
type progress struct{ bar *progressbar.ProgressBar }

func newProgress(out io.Writer, total int64, what string, bytes bool) *progress {
	mode := os.Getenv("MTXDB_PROGRESS")
	if mode == "0" {
		return nil
	}
	f, ok := out.(*os.File)
	if !ok || !(isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd())) {
		if mode != "1" {
			return nil
		}
		f = os.Stderr
	}
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(f),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(),
		progressbar.OptionThrottle(100_000_000), // redraw at most every 100 ms
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetRenderBlankState(true), // drawn at once, not at the first update
	}
	if bytes {
		opts = append(opts, progressbar.OptionShowBytes(true))
	}
	return &progress{bar: progressbar.NewOptions64(total, opts...)}
}

func (p *progress) add(n int) {
	if p != nil {
		_ = p.bar.Add(n)
	}
}

func (p *progress) finish() {
	if p != nil {
		_ = p.bar.Finish()
	}
}

// set moves the bar to n.
func (p *progress) set(n int64) {
	if p != nil {
		_ = p.bar.Set64(n)
	}
}

// clear erases the bar from its line before other output is printed there; the
// next update draws it again.
func (p *progress) clear() {
	if p != nil {
		_ = p.bar.Clear()
	}
}
