package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/mtxdb/mtxdb/recorded"
)

// importPaths resolves import's arguments to the files to read, in order: "-"
// (standard input) and a file as they are; a room directory (holding events.jsonl) as its events.jsonl; a
// directory of room directories (testrooms/real, a gen --rooms output; symlinked
// room directories included) as each room's events.jsonl, sorted by name. Each
// subdirectory of a directory of rooms that holds no events.jsonl is passed to
// skip.
func importPaths(args []string, skip skipFunc) ([]string, error) {
	var paths []string
	for _, a := range args {
		if a == "-" { // standard input
			paths = append(paths, a)
			continue
		}
		fi, err := os.Stat(a)
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() {
			paths = append(paths, a)
			continue
		}
		p, ok, err := recorded.EventsFile(a)
		if err != nil {
			return nil, err
		}
		if ok {
			paths = append(paths, p)
			continue
		}
		dirs, err := recorded.RoomDirs(a)
		if err != nil {
			return nil, err
		}
		if len(dirs) == 0 {
			return nil, fmt.Errorf("%s is a directory without events.jsonl and without room directories holding one", a)
		}
		for _, d := range dirs {
			paths = append(paths, filepath.Join(d, "events.jsonl"))
		}
		others, err := recorded.OtherSubdirs(a, dirs)
		if err != nil {
			return nil, err
		}
		for _, d := range others {
			skip(d, skipNoEvents)
		}
	}
	return paths, nil
}

// skipFunc is told of an input import leaves out, and why (skipNoEvents,
// skipBlank).
type skipFunc func(path, reason string)

const (
	skipNoEvents = "no events.jsonl"
	skipBlank    = "empty or blank"
)

// importSkips returns the skipFunc of import: a warning on warn, and with asJSON
// also a {"kind":"skipped","path":...,"reason":...} line on out.
func importSkips(warn, out io.Writer, asJSON bool) skipFunc {
	return func(path, reason string) {
		switch reason {
		case skipNoEvents:
			fmt.Fprintf(warn, "mtxdb: import: warning: %s holds no events.jsonl: skipped\n", path)
		default:
			fmt.Fprintf(warn, "mtxdb: warning: %s is empty or blank: no PDUs in it\n", path)
		}
		if asJSON {
			printLine(out, true, "skipped", kv{"path", path}, kv{"reason", reason})
		}
	}
}

// blankInput reports whether a file holds nothing but white space (and a UTF-8
// byte order mark): no PDU to import.
//
// Only a regular file is looked into: a pipe, a FIFO or a terminal can be read
// once, and the import must read it from its start (reading ahead here lost the
// first PDUs of `cat events.jsonl | mtxdb import /dev/stdin`, and a FIFO hung on
// its second open); such an input is never blank to this check.
func blankInput(path string) (bool, error) {
	if path == "-" {
		return false, nil // standard input is read once, by the import
	}
	fi, err := os.Stat(path)
	if err != nil {
		return false, err
	}
	if !fi.Mode().IsRegular() {
		return false, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	if bom, _ := br.Peek(3); bytes.Equal(bom, []byte{0xEF, 0xBB, 0xBF}) {
		_, _ = br.Discard(3)
	}
	for {
		c, err := br.ReadByte()
		if err == io.EOF {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		switch c {
		case ' ', '\t', '\n', '\r':
		default:
			return false, nil
		}
	}
}

// dropBlank passes each input that holds no PDU to skip and returns the others;
// when every input is blank it fails before a store is created.
func dropBlank(paths []string, skip skipFunc) ([]string, error) {
	var out []string
	for _, p := range paths {
		blank, err := blankInput(p)
		if err != nil {
			return nil, err
		}
		if blank {
			skip(p, skipBlank)
			continue
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("nothing to import: every input is empty or blank (no store written)")
	}
	return out, nil
}
