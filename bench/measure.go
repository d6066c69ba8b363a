package main

import (
	"bufio"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Summary of a sample set, in the samples' unit.
type Summary struct {
	N    int     `json:"n"`
	Min  float64 `json:"min"`
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

func summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	q := func(p float64) float64 { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return Summary{N: len(s), Min: s[0], P50: q(0.5), P99: q(0.99), Max: s[len(s)-1], Mean: sum / float64(len(s))}
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// evictDir drops every file of dir from the page cache: fsync (dirty pages
// cannot be dropped) then posix_fadvise(DONTNEED). The store must be closed
// (unmapped) first, or mapped pages stay pinned.
func evictDir(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // an engine deleted an obsolete file meanwhile
		}
		if err != nil || d.IsDir() {
			return err
		}
		return evictFile(p)
	})
}

func evictFile(p string) error {
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	_ = f.Sync()
	return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// diskUsage returns allocated bytes (st_blocks*512, what du reports) and
// apparent bytes of the files under dir.
func diskUsage(dir string) (alloc, apparent int64) {
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		var st syscall.Stat_t
		if syscall.Stat(p, &st) == nil {
			alloc += st.Blocks * 512
			apparent += st.Size
		}
		return nil
	})
	return
}

// procIO reads this process's storage-layer read_bytes / write_bytes.
func procIO() (read, write int64) {
	f, err := os.Open("/proc/self/io")
	if err != nil {
		return -1, -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ": ")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "read_bytes":
			read = n
		case "write_bytes":
			write = n
		}
	}
	return
}

// vmRSS returns the current resident set in KiB.
func vmRSS() int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return -1
}

// Limits are the filesystem's physical limits, measured in the same run on
// the same directory as the engines.
type Limits struct {
	When            string  `json:"when"`
	FileBytes       int64   `json:"file_bytes"`
	SeqWriteSyncMBs float64 `json:"seq_write_fdatasync_per_batch_mb_s"` // 512 KiB writes, fdatasync after each (the workload's durability point)
	SeqWriteEndMBs  float64 `json:"seq_write_fdatasync_at_end_mb_s"`    // 1 MiB writes, one fdatasync at the end
	SeqReadMBs      float64 `json:"seq_read_mb_s"`                      // O_DIRECT 1 MiB reads
	RandRead4K      Summary `json:"rand_read_4k_qd1_us"`                // O_DIRECT 4 KiB preads, queue depth 1
	RandRead4KIOPS  float64 `json:"rand_read_4k_qd1_iops"`
	Append4KSync    Summary `json:"append_4k_fdatasync_us"` // 4 KiB append + fdatasync
	Direct          bool    `json:"direct_io"`
	// One cold 1-byte read through a MAP_SHARED mapping of the file, after
	// eviction: device bytes read (/proc/self/io) and time, with the default
	// advice and with MADV_RANDOM (mean of 20). Shows the kernel's read-around.
	MmapFaultKiB       float64 `json:"mmap_cold_fault_read_kib"`
	MmapFaultUs        float64 `json:"mmap_cold_fault_us"`
	MmapRandomFaultKiB float64 `json:"mmap_cold_fault_madv_random_read_kib"`
	MmapRandomFaultUs  float64 `json:"mmap_cold_fault_madv_random_us"`
}

func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := int(uintptr(unsafe.Pointer(&b[0])) & 4095)
	if off != 0 {
		off = 4096 - off
	}
	return b[off : off+n]
}

func measureLimits(dir, when string, size int64, randSamples int) (Limits, error) {
	l := Limits{When: when, FileBytes: size}
	p := filepath.Join(dir, "limits.dat")
	defer os.Remove(p)
	buf := alignedBuf(1 << 20)
	r := rand.New(rand.NewPCG(7, 7))
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	// Sequential write, fdatasync per 512 KiB (one workload batch is ~512 KiB).
	write := func(chunk int, syncEach bool) (float64, error) {
		os.Remove(p)
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		t := time.Now()
		for off := int64(0); off < size; off += int64(chunk) {
			if _, err := f.Write(buf[:chunk]); err != nil {
				return 0, err
			}
			if syncEach {
				if err := unix.Fdatasync(int(f.Fd())); err != nil {
					return 0, err
				}
			}
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return 0, err
		}
		return float64(size) / 1e6 / time.Since(t).Seconds(), nil
	}
	var err error
	if l.SeqWriteSyncMBs, err = write(512<<10, true); err != nil {
		return l, err
	}
	if l.SeqWriteEndMBs, err = write(1<<20, false); err != nil {
		return l, err
	}
	if err := evictFile(p); err != nil {
		return l, err
	}
	// Reads with O_DIRECT (the device, not the page cache); buffered reads
	// after eviction if the filesystem refuses O_DIRECT.
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_DIRECT, 0)
	l.Direct = err == nil
	if err != nil {
		if f, err = os.Open(p); err != nil {
			return l, err
		}
	}
	t := time.Now()
	var n int64
	for {
		k, err := f.ReadAt(buf, n)
		n += int64(k)
		if err != nil || k == 0 {
			break
		}
	}
	l.SeqReadMBs = float64(n) / 1e6 / time.Since(t).Seconds()
	evictFile(p)
	pages := size / 4096
	var lat []float64
	b4 := buf[:4096]
	for i := 0; i < randSamples; i++ {
		off := r.Int64N(pages) * 4096
		t := time.Now()
		if _, err := f.ReadAt(b4, off); err != nil {
			f.Close()
			return l, err
		}
		lat = append(lat, us(time.Since(t)))
	}
	f.Close()
	l.RandRead4K = summarize(lat)
	l.RandRead4KIOPS = 1e6 / l.RandRead4K.Mean
	for _, adv := range []int{unix.MADV_NORMAL, unix.MADV_RANDOM} {
		kib, u, err := mmapFault(p, size, adv, r)
		if err != nil {
			return l, err
		}
		if adv == unix.MADV_RANDOM {
			l.MmapRandomFaultKiB, l.MmapRandomFaultUs = kib, u
		} else {
			l.MmapFaultKiB, l.MmapFaultUs = kib, u
		}
	}
	// 4 KiB append + fdatasync: the floor under a small durable append.
	a, err := os.OpenFile(p+".append", os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return l, err
	}
	defer os.Remove(p + ".append")
	lat = lat[:0]
	for i := 0; i < 300; i++ {
		t := time.Now()
		a.Write(b4)
		if err := unix.Fdatasync(int(a.Fd())); err != nil {
			a.Close()
			return l, err
		}
		lat = append(lat, us(time.Since(t)))
	}
	a.Close()
	l.Append4KSync = summarize(lat)
	return l, nil
}

var mmapSink byte

func mmapFault(p string, size int64, adv int, r *rand.Rand) (kib, usMean float64, err error) {
	const n = 20
	var bytes int64
	var d time.Duration
	for k := 0; k < n; k++ {
		if err := evictFile(p); err != nil {
			return 0, 0, err
		}
		f, err := os.Open(p)
		if err != nil {
			return 0, 0, err
		}
		m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			f.Close()
			return 0, 0, err
		}
		unix.Madvise(m, adv)
		off := r.Int64N(size)
		r0, _ := procIO()
		t := time.Now()
		mmapSink += m[off]
		d += time.Since(t)
		r1, _ := procIO()
		bytes += r1 - r0
		unix.Munmap(m)
		f.Close()
	}
	return float64(bytes) / 1024 / n, us(d) / n, nil
}
