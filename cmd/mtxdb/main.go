// Command mtxdb imports Matrix room histories into an mtxdb store, replays them
// through state resolution, repacks, verifies and reports.
//
//	mtxdb import  --store DIR PATH...   PDUs from JSON-lines/JSON-array files or room dirs
//	mtxdb replay  --store DIR           state before/after every event, current state
//	mtxdb verify  --store DIR [--expected DIR]  structural check, and against recorded state
//	mtxdb repack  --store DIR           rewrite rooms in walk order, drop garbage
//	mtxdb stats   --store DIR           shards, bytes, the largest rooms
//	mtxdb rooms   --store DIR [--json]  every room: version, events, replayed, bytes
//	mtxdb demo                          the main job on the bundled real rooms
package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/mtxdb/mtxdb/roomrecord"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/spf13/cobra"

	"github.com/mtxdb/mtxdb/hamtstore"
	"github.com/mtxdb/mtxdb/packstore"
)

func main() {
	// A soft memory limit of 60% of the cgroup's (or else the machine's) memory:
	// the collector works harder near it instead of letting a large generation or
	// replay grow the heap to GOGC's multiple of the live data. GOMEMLIMIT, when
	// set, wins; AUTOMEMLIMIT=off turns this off.
	_, _ = memlimit.Set(memlimit.WithRatio(0.6), memlimit.WithProvider(memlimit.ApplyFallback(memlimit.FromCgroup, memlimit.FromSystem)))
	// A closed standard output (import ... | head -1) makes writes fail instead of
	// killing the process: the command finishes its work and its exit status
	// stays its own.
	signal.Ignore(syscall.SIGPIPE)
	root := rootCmd()
	err := root.Execute()
	if perr := profs.stop(); err == nil {
		err = perr
	}
	if err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(int(ee)) // the command printed what was wrong
		}
		fmt.Fprintln(os.Stderr, "mtxdb:", err)
		if isDataProblem(err) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// rootCmd builds the mtxdb command tree: the global flags (read-ahead, memory
// limit, profiles) and every command. docs/cli.md is generated from it.
func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "mtxdb",
		Short:         "Matrix room state in append-only packfiles: import, replay, repack, verify",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return plainFlagError(err) })
	root.PersistentFlags().Var(&readAhead, "read-ahead", "access-pattern hint for the shard mappings: random (MADV_RANDOM plus read-ahead of forward runs) or kernel (no hint)")
	root.PersistentFlags().Var(&memoryLimit, "memory-limit", "soft limit of the Go heap (default 900MiB for replay, 1.5GiB for import, verify, repack and demo, 2.25GiB for gen; e.g. 1.5GiB, 800MiB; none: what the other commands use, GOMEMLIMIT when set, else 60% of memory); GOMEMLIMIT, when set, wins over the defaults but not over a size given here")
	root.PersistentFlags().StringVar(&profs.cpuPath, "cpuprofile", "", "write a CPU profile of the command to this file (go tool pprof reads it); created before the command runs")
	root.PersistentFlags().StringVar(&profs.memPath, "memprofile", "", "write a heap profile (live objects at the command's end) to this file; created before the command runs")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		applyMemoryLimit(cmd)
		return profs.start()
	}
	root.AddCommand(importCmd(), replayCmd(), verifyCmd(), auditCmd(), repackCmd(), statsCmd(), roomsCmd(), benchRepackCmd(), demoCmd(), stateCmd(), benchResolverCmd(), genCmd())
	return root
}

// profs are the profiles --cpuprofile and --memprofile ask for.
var profs profiles

// inStoreDir reports whether path's directory holds a packstore store (its
// LOCK file or a shard file).
func inStoreDir(path string) bool {
	dir := filepath.Dir(path)
	if _, err := os.Stat(filepath.Join(dir, "LOCK")); err == nil {
		return true
	}
	shards, _ := filepath.Glob(filepath.Join(dir, "shard-*.mtdb"))
	return len(shards) > 0
}

// profiles are the files --cpuprofile and --memprofile name. start creates them
// before the command runs, so that a path that cannot be written fails before
// the work rather than after it; stop, after the command (failed or not), ends
// the CPU profile and writes the heap profile.
type profiles struct {
	cpuPath, memPath string
	cpu, mem         *os.File // nil until start creates them
}

func (p *profiles) start() error {
	for _, c := range []struct{ flag, path string }{{"--memprofile", p.memPath}, {"--cpuprofile", p.cpuPath}} {
		if c.path != "" && inStoreDir(c.path) {
			return fmt.Errorf("%s %s: that directory holds an mtxdb store, whose files the profile would overwrite: write it elsewhere", c.flag, c.path)
		}
	}
	if p.memPath != "" {
		f, err := os.Create(p.memPath)
		if err != nil {
			return fmt.Errorf("--memprofile: %w", err)
		}
		p.mem = f
	}
	if p.cpuPath != "" {
		f, err := os.Create(p.cpuPath)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		p.cpu = f
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpuprofile %s: %w", p.cpuPath, err)
		}
	}
	return nil
}

func (p *profiles) stop() error {
	var errs []error
	if p.cpu != nil {
		pprof.StopCPUProfile() // a no-op when start failed to start it
		if err := p.cpu.Close(); err != nil {
			errs = append(errs, fmt.Errorf("--cpuprofile: %w", err))
		}
	}
	if p.mem != nil {
		err := pprof.Lookup("heap").WriteTo(p.mem, 0)
		if cerr := p.mem.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("--memprofile %s: %w", p.memPath, err))
		}
	}
	return errors.Join(errs...)
}

// isDataProblem reports whether err says the stored data is damaged: a store
// that failed to open as corrupt, a frame or node failing its checks, a record
// that does not decode. Every command exits 2 for those, as verify does.
func isDataProblem(err error) bool {
	var ce corruptError
	return errors.As(err, &ce) || packstore.IsCorruption(err) ||
		errors.Is(err, hamtstore.ErrCorrupt) || errors.Is(err, roomrecord.ErrCorruptRecord)
}

// isRoomDamage reports whether err, met reading one room, is damage to that
// room's records: a data problem (isDataProblem) or a record its other
// records name that the store does not find. The commands that walk many
// rooms name such a room on a problem line and go on with the others.
func isRoomDamage(err error) bool {
	return isDataProblem(err) || errors.Is(err, packstore.ErrNotFound)
}

// exitError carries a specific exit status (e.g. 2 for "mismatches found").
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// plainFlagError rewrites a flag parse error that ends in Go's number parser's
// message (`invalid argument "-1" for "--seed" flag: strconv.ParseUint: parsing
// "-1": invalid syntax`) into what the flag wants; other errors are returned as
// they are.
func plainFlagError(err error) error {
	msg := err.Error()
	for _, p := range []struct{ parser, want string }{
		{": strconv.ParseUint: ", "want a whole number, 0 or more"},
		{": strconv.ParseInt: ", "want a whole number"},
		{": strconv.ParseFloat: ", "want a number"},
		{": strconv.ParseBool: ", "want true or false"},
	} {
		if head, tail, ok := strings.Cut(msg, p.parser); ok {
			if strings.HasSuffix(tail, "value out of range") {
				return fmt.Errorf("%s: out of range", head)
			}
			return fmt.Errorf("%s: %s", head, p.want)
		}
	}
	return err
}
