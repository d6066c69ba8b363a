package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// errInterrupted is returned through a command's loop when SIGINT or SIGTERM asked it
// to stop (import's reader returns it; replay's Stop hook makes the resolver stop).
var errInterrupted = errors.New("interrupted")

// interruptSignal is the signal number that asked the running command to stop, 0
// while none has. Set once by the handler of catchInterrupts.
var interruptSignal atomic.Int32

// interrupted reports whether SIGINT or SIGTERM asked the command to stop.
func interrupted() bool { return interruptSignal.Load() != 0 }

// interruptExit is the exit status of a command a signal stopped: 128 + signal, as
// a shell reports a process the signal killed (130 for Ctrl-C).
func interruptExit() exitError { return exitError(128 + interruptSignal.Load()) }

// catchInterrupts handles SIGINT and SIGTERM until the returned function is called.
// The returned function may be called more than once. With now == nil the command stops gracefully: the first signal sets interrupted
// (its loops stop at the next batch, sync, and say what was kept and how to go on);
// a second signal exits at once. With now set, the first signal prints what now
// returns (what is kept, how to resume) and exits at once: for steps that cannot
// stop part-way (a repack's copy, whose crash safety makes an abandoned copy
// harmless) and for commands that write nothing.
func catchInterrupts(cmd string, now func() string) (stop func()) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		for {
			var sig os.Signal
			select {
			case sig = <-sigs:
			case <-done:
				return
			}
			n := int32(sig.(syscall.Signal))
			if now != nil {
				fmt.Fprintf(os.Stderr, "mtxdb: %s: %v: %s\n", cmd, sig, now())
				os.Exit(128 + int(n))
			}
			if !interruptSignal.CompareAndSwap(0, n) {
				fmt.Fprintf(os.Stderr, "mtxdb: %s: %v again: stopped at once; what was synced is kept (the next command may warn that it cut an unsynced tail)\n", cmd, sig)
				os.Exit(128 + int(n))
			}
			fmt.Fprintf(os.Stderr, "mtxdb: %s: %v: stopping at the next safe point (send it again to stop at once)\n", cmd, sig)
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			signal.Stop(sigs)
			close(done)
		})
	}
}

// testStall is a hook for the CLI's signal tests: when MTXDB_TEST_STALL names
// phase, the command says so on standard error and waits there (up to a minute)
// for a signal, so a test can interrupt it at a known point. Unset, it does
// nothing.
func testStall(phase string) {
	if os.Getenv("MTXDB_TEST_STALL") != phase {
		return
	}
	fmt.Fprintf(os.Stderr, "mtxdb: test stall at %s\n", phase)
	for i := 0; i < 6000 && !interrupted(); i++ {
		time.Sleep(10 * time.Millisecond)
	}
}

// noticed holds the phases testNotice has announced.
var noticed sync.Map

// testNotice announces reaching phase on stderr, once, when MTXDB_TEST_STALL names
// it, and goes on: for tests that signal a command while it waits outside this
// program (import blocked on an idle pipe).
func testNotice(phase string) {
	if os.Getenv("MTXDB_TEST_STALL") != phase {
		return
	}
	if _, dup := noticed.LoadOrStore(phase, true); !dup {
		fmt.Fprintf(os.Stderr, "mtxdb: test stall at %s\n", phase)
	}
}
