package gen

import (
	"bufio"
	"os"
	"path/filepath"
)

// GenerateMulti writes n rooms (seeds opts.Seed .. opts.Seed+n-1, wrapping past
// 2^64-1; every room's servers sign with the keys of opts.KeySeed, or else of
// opts.Seed, so the rooms share one keyring) to dir/roomNNN
// and dir/interleaved.jsonl: every room's events in one stream, as one server in
// all the rooms receives them (merged by the simulated arrival time, rooms in
// order on ties; each room's own arrival order is kept, so the importer accepts
// the stream). progress, if set, is called with the number of events created since
// the previous call.
//
// Like Generate, it writes to a new directory beside dir and renames it to dir
// at the end.
func GenerateMulti(opts Options, n int, dir string, progress func(n int)) (metas []*Meta, err error) {
	if err := opts.normalise(); err != nil {
		return nil, err
	}
	err = publish(dir, func(tmp string) (err error) {
		metas, err = generateMulti(opts, n, tmp, progress)
		return err
	})
	return metas, err
}

func generateMulti(opts Options, n int, dir string, progress func(n int)) ([]*Meta, error) {
	type stream struct {
		sc *bufio.Scanner
		f  *os.File
		ts []int64
		i  int
	}
	var metas []*Meta
	var streams []*stream
	defer func() {
		for _, s := range streams {
			s.f.Close()
		}
	}()
	for i := range n {
		o := opts
		o.Seed = opts.Seed + uint64(i)
		if o.KeySeed == 0 {
			o.KeySeed = opts.Seed
		}
		r, err := newRoom(o)
		if err != nil {
			return nil, err
		}
		rd := filepath.Join(dir, RoomName(i))
		last := 0
		err = r.run(rd, func(done int) {
			if progress != nil {
				progress(done - last)
			}
			last = done
		})
		if err == nil {
			err = r.check()
		}
		var m *Meta
		if err == nil {
			m, err = r.write(rd, RoomName(i))
		}
		r.closeLines()
		if err != nil {
			return nil, err
		}
		metas = append(metas, m)
		f, err := os.Open(filepath.Join(rd, "events.jsonl"))
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		streams = append(streams, &stream{sc: sc, f: f, ts: r.arrTS})
	}
	out, err := os.Create(filepath.Join(dir, "interleaved.jsonl"))
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriterSize(out, 1<<20)
	for {
		best := -1
		for k, s := range streams {
			if s.i < len(s.ts) && (best < 0 || s.ts[s.i] < streams[best].ts[streams[best].i]) {
				best = k
			}
		}
		if best < 0 {
			break
		}
		s := streams[best]
		if !s.sc.Scan() {
			break
		}
		w.Write(s.sc.Bytes())
		w.WriteByte('\n')
		s.i++
	}
	if err := w.Flush(); err != nil {
		out.Close()
		return nil, err
	}
	return metas, out.Close()
}
