package main

import (
	"io"
	"os"

	"github.com/mattn/go-isatty"
	"github.com/schollz/progressbar/v3"
)

// progress is a progress bar shown only when the output is a terminal; a nil
// *progress is a no-op, so callers need no checks.
type progress struct{ bar *progressbar.ProgressBar }

func newProgress(out io.Writer, total int64, what string, bytes bool) *progress {
	f, ok := out.(*os.File)
	if !ok || !(isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd())) {
		return nil
	}
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(f),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(),
		progressbar.OptionThrottle(100_000_000), // redraw at most every 100 ms
		progressbar.OptionClearOnFinish(),
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
