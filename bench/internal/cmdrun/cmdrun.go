// Package cmdrun runs mtxdb commands for the benchmark drivers and measures
// them: wall and CPU seconds and peak RSS of the child process, and the
// machine facts a published figure states (load averages, CPU model, commit).
package cmdrun

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Step is one command's measurement.
type Step struct {
	Wall   float64 `json:"wall_s"`
	CPU    float64 `json:"cpu_s"`       // user + system
	PeakMB float64 `json:"peak_rss_mb"` // maximum resident set, MB (10^6 bytes)
	Output string  `json:"summary"`     // the command's last line
	Stdout string  `json:"-"`
}

// Run runs bin with args and measures it (rusage of the child: CPU and
// maximum resident set, which Linux gives in KiB and Step in MB). A failed
// command is an error holding its output.
func Run(bin string, args ...string) (Step, error) {
	cmd := exec.Command(bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	if err != nil {
		return Step{}, fmt.Errorf("%s %s: %v\n%s%s", filepath.Base(bin), strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return Step{Wall: wall.Seconds(), CPU: cpu.Seconds(), PeakMB: float64(ru.Maxrss) * 1024 / 1e6, Output: LastLine(stdout.String()), Stdout: stdout.String()}, nil
}

// LastLine is the last non-empty line of s.
func LastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// Field reads key=N from a summary line, -1 when absent.
func Field(line, key string) int {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return n
			}
		}
	}
	return -1
}

// DuBytes is the total size in bytes of the files under dir.
func DuBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			n += info.Size()
		}
		return err
	})
	return n, err
}

// Loadavg returns the 1, 5 and 15 minute load averages (/proc/loadavg).
func Loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// Machine names the CPUs, the platform and the Go version.
func Machine() string {
	model := ""
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
		f.Close()
	}
	return fmt.Sprintf("%d CPUs (%s), %s/%s, %s", runtime.NumCPU(), model, runtime.GOOS, runtime.GOARCH, runtime.Version())
}

// Commit is the repository's short HEAD ("unknown" outside git).
func Commit() string {
	b, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}
