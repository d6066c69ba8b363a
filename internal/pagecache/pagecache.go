// Package pagecache drops files from the Linux page cache and counts their
// resident pages, for cold-read measurements (close the mappings first, evict,
// reopen, check that nothing is resident).
package pagecache

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"unsafe"

	"github.com/edsrzf/mmap-go"
	"golang.org/x/sys/unix"
)

// Evict drops the clean pages of each file from the page cache
// (posix_fadvise POSIX_FADV_DONTNEED). Pages that a live mapping has faulted
// in are not dropped: unmap first.
func Evict(paths ...string) error {
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		err = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		f.Close()
		if err != nil {
			return fmt.Errorf("fadvise %s: %w", p, err)
		}
	}
	return nil
}

// Resident counts the files' pages in the page cache (mincore over a fresh
// read-only mapping, which faults nothing in).
func Resident(paths ...string) (int64, error) {
	var n int64
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return 0, err
		}
		fi, err := f.Stat()
		if err != nil || fi.Size() == 0 {
			f.Close()
			if err != nil {
				return 0, err
			}
			continue
		}
		m, err := mmap.Map(f, mmap.RDONLY, 0)
		f.Close()
		if err != nil {
			return 0, err
		}
		vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
		_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0])))
		_ = m.Unmap()
		if errno != 0 {
			return 0, fmt.Errorf("mincore %s: %w", p, errno)
		}
		for _, b := range vec {
			n += int64(b & 1)
		}
	}
	return n, nil
}

// ReadBytes returns this process's read_bytes from /proc/self/io: the bytes the
// kernel read from storage on its behalf, page-fault read-around included.
func ReadBytes() (int64, error) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("read_bytes: ")); ok {
			return strconv.ParseInt(string(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/self/io: no read_bytes line")
}
