package gen

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/tidwall/sjson"
)

// lineWriter writes events.jsonl while the simulation runs, in the origin's
// arrival order, on its own goroutine: a line built by the signer is written
// once its signature is made (signing.done). It records where each line starts,
// so that the room's events can be read back (room.loadPDU, room.readLine)
// without keeping them in memory.
type lineWriter struct {
	path  string
	items chan lineItem
	done  chan struct{}
	// off[i] is the byte offset of line i (arrival order) in the file; after
	// finish it has one more entry, the file's size. Written by the writer's
	// goroutine only, read after finish.
	off []int64
	err error // the first write error, read after finish
}

// lineItem is one line to write: g's line once signed, or line.
type lineItem struct {
	g    *signing
	line []byte
}

// startLineWriter creates path and starts writing lines to it.
func startLineWriter(path string) (*lineWriter, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	lw := &lineWriter{path: path, items: make(chan lineItem, 4096), done: make(chan struct{})}
	go lw.loop(f)
	return lw, nil
}

func (lw *lineWriter) loop(f *os.File) {
	defer close(lw.done)
	w := bufio.NewWriterSize(f, 1<<20)
	var at int64
	for it := range lw.items {
		line := it.line
		if it.g != nil {
			<-it.g.done
			line, it.g.line = it.g.line, nil
		}
		lw.off = append(lw.off, at)
		if lw.err == nil {
			_, lw.err = w.Write(line)
			if lw.err == nil {
				lw.err = w.WriteByte('\n')
			}
		}
		at += int64(len(line)) + 1
	}
	lw.off = append(lw.off, at)
	if err := w.Flush(); err != nil && lw.err == nil {
		lw.err = err
	}
	if err := f.Close(); err != nil && lw.err == nil {
		lw.err = err
	}
	if lw.err != nil {
		lw.err = fmt.Errorf("gen: %s: %w", lw.path, lw.err)
	}
}

// finish waits for every line submitted so far to be written and closes the
// file; it returns the first write error.
func (lw *lineWriter) finish() error {
	close(lw.items)
	<-lw.done
	return lw.err
}

// emitLine submits event x's events.jsonl line (it has just arrived at the
// origin). Once submitted, the line is no longer kept with the event; a
// non-state event also gives up its PDU (the simulation reads only state
// events' PDUs after their arrival at the origin; room.pduOf reads it back).
func (r *room) emitLine(e *event) {
	if e.sign != nil {
		r.lines.items <- lineItem{g: e.sign}
		e.sign = nil
	} else {
		line, err := r.line(e)
		if err != nil {
			if r.err == nil {
				r.err = fmt.Errorf("gen: events.jsonl line of %s: %w", e.id, err)
			}
			return
		}
		r.lines.items <- lineItem{line: line}
	}
	if e.key == "" {
		e.pdu = nil
	}
}

// readLine returns the events.jsonl line of event x (without its newline), read
// from the file written during the run. Safe for concurrent use after run.
func (r *room) readLine(x int32) ([]byte, error) {
	i := r.arrivalPos[x]
	b := make([]byte, r.lines.off[i+1]-r.lines.off[i]-1)
	if _, err := r.linesFile.ReadAt(b, r.lines.off[i]); err != nil {
		return nil, fmt.Errorf("gen: read back %s line %d: %w", r.lines.path, i+1, err)
	}
	return b, nil
}

// pduOf returns event x's PDU: the one the event keeps (state events, and
// events that have not reached the origin yet), or else parsed again from its
// events.jsonl line (without the line's top-level "event_id"). Safe for
// concurrent use after run.
func (r *room) pduOf(x int32) (gomatrixserverlib.PDU, error) {
	e := r.events[x]
	if e.pdu != nil {
		return e.pdu, nil
	}
	line, err := r.readLine(x)
	if err != nil {
		return nil, err
	}
	if line, err = sjson.DeleteBytes(line, "event_id"); err != nil {
		return nil, err
	}
	p, err := r.ver.NewEventFromTrustedJSONWithEventID(e.id, line, false)
	if err != nil {
		return nil, fmt.Errorf("gen: parse %s again: %w", e.id, err)
	}
	return p, nil
}

// openLines finishes events.jsonl and opens it for reading back (readLine).
func (r *room) openLines() error {
	if err := r.lines.finish(); err != nil {
		return err
	}
	r.arrivalPos = make([]int32, len(r.events))
	for i, x := range r.arrival {
		r.arrivalPos[x] = int32(i)
	}
	f, err := os.Open(r.lines.path)
	if err != nil {
		return err
	}
	r.linesFile = f
	return nil
}

// copyLines writes events.jsonl to dir when the run wrote it elsewhere.
func (r *room) copyLines(dir string) error {
	dst := filepath.Join(dir, "events.jsonl")
	if a, b := filepath.Clean(dst), filepath.Clean(r.lines.path); a == b {
		return nil
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, io.NewSectionReader(r.linesFile, 0, r.lines.off[len(r.lines.off)-1])); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// closeLines closes the events.jsonl opened for reading back (after write).
func (r *room) closeLines() {
	if r.linesFile != nil {
		r.linesFile.Close()
		r.linesFile = nil
	}
}
