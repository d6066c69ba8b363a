package main

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"unicode"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
)

// defaultStreamLimit is the soft heap limit of the commands that stream a
// room through memory (import, verify, repack, demo): 1.5 GiB. Without a limit
// the collector lets the heap grow to twice the live data (GOGC=100) or three
// times (replay and import's GOGC=200).
const defaultStreamLimit = 3 << 29

// defaultReplayLimit is replay's soft heap limit: 900 MiB, so that the replay
// of a 1M-event room peaks under 1 GB (10^9 bytes) of RSS. Its live heap there
// is 450-560 MB (the auth index, the engine's index, parsed-PDU caches, the
// batch being written); the rest of its RSS is the store's mapped pages
// (packstore releases them every 1,024 frame reads). The replay of the
// generated 1M-event room peaks at about 920 MiB (965 MB) under this limit and
// at about 1,565 MiB under 1.5 GiB, where the collector runs a third as often.
// A room much larger than that needs --memory-limit raised, or the collector
// runs all the time.
const defaultReplayLimit = 900 << 20

// minMemoryLimit refuses limits too small to mean what the user meant ("12"
// read as 12 bytes would make the collector run all the time).
const minMemoryLimit = 64 << 20

// defaultGenLimit is gen's soft heap limit: 2.25 GiB. gen collects seldom
// (GOGC=400: it allocates much short-lived JSON), so without a limit its heap
// grows to five times the live data; the live heap of a 1M-event room, with
// the reference's checks, stays under about 1.5 GB (docs/generator.md).
const defaultGenLimit = 9 << 28

// defaultLimits are the commands with a soft heap limit of their own
// (defaultStreamLimit, defaultReplayLimit, defaultGenLimit) unless --memory-limit or GOMEMLIMIT
// says otherwise; the others keep the 60%-of-memory default (main).
var defaultLimits = map[string]int64{"import": defaultStreamLimit, "replay": defaultReplayLimit, "verify": defaultStreamLimit,
	"repack": defaultStreamLimit, "demo": defaultStreamLimit, "gen": defaultGenLimit}

// memoryLimitFlag is --memory-limit: a byte size ("1.5GiB", "800MB"), or
// "none" for the 60%-of-memory default every other command runs with.
type memoryLimitFlag struct {
	set   bool
	none  bool
	bytes int64
}

var memoryLimit memoryLimitFlag

func (f *memoryLimitFlag) String() string {
	switch {
	case !f.set:
		return ""
	case f.none:
		return "none"
	}
	return humanize.IBytes(uint64(f.bytes))
}

func (f *memoryLimitFlag) Set(v string) error {
	v = strings.TrimSpace(v)
	if strings.EqualFold(v, "none") {
		*f = memoryLimitFlag{set: true, none: true}
		return nil
	}
	if strings.Contains(v, ",") {
		// humanize drops commas as thousands separators: "1,5GiB" would be 15 GiB.
		return fmt.Errorf("%q has a comma: write sizes without separators, with a decimal point (examples: 1.5GiB, 800MiB)", v)
	}
	var n uint64
	var err error
	if digits := strings.TrimSuffix(v, "B"); digits != "" && strings.Trim(digits, "0123456789") == "" {
		// Bytes exactly (humanize goes through a float64, which rounds past 2^53).
		if n, err = strconv.ParseUint(digits, 10, 64); err != nil {
			n, err = math.MaxUint64, nil
		}
	} else {
		n, err = humanize.ParseBytes(v)
	}
	if err != nil && strings.HasPrefix(err.Error(), "too large") {
		// A size past 16 EiB (humanize's uint64) is out of range, not malformed.
		n, err = math.MaxUint64, nil
	}
	if err != nil {
		return fmt.Errorf("%q is not a size (examples: 1.5GiB, 800MiB, none)", v)
	}
	if n < minMemoryLimit && strings.IndexFunc(v, unicode.IsLetter) < 0 {
		return fmt.Errorf("%q has no unit, so it would be bytes, below the smallest limit of 64 MiB (give a unit: 1.5GiB, 800MiB)", v)
	}
	if n < minMemoryLimit {
		// Exact bytes: a rounded size ("64 MiB" for 63.9MiB) would read as the limit itself.
		return fmt.Errorf("%q is %d bytes, below the smallest limit of 64 MiB (%d bytes; examples: 1.5GiB, 800MiB)", v, n, minMemoryLimit)
	}
	if n > math.MaxInt64 {
		// The runtime takes a limit as an int64; a larger value would reach it
		// negative, which it reads as "leave the limit as it is".
		return fmt.Errorf("%q is more than the largest limit, %d bytes (8 EiB less a byte; use none for no limit of ours)", v, int64(math.MaxInt64))
	}
	*f = memoryLimitFlag{set: true, bytes: int64(n)}
	return nil
}

func (f *memoryLimitFlag) Type() string { return "SIZE" }

// applyMemoryLimit sets the soft heap limit for cmd (see defaultStreamLimit):
// the flag's value when given, else GOMEMLIMIT when set (the runtime already
// applied it), else the command's entry in defaultLimits. It returns the
// limit in force, or -1 for none of ours.
func applyMemoryLimit(cmd *cobra.Command) int64 {
	switch {
	case memoryLimit.set && memoryLimit.none:
		return -1
	case memoryLimit.set:
		debug.SetMemoryLimit(memoryLimit.bytes)
		return memoryLimit.bytes
	case os.Getenv("GOMEMLIMIT") != "":
		return -1
	case defaultLimits[cmd.Name()] > 0:
		debug.SetMemoryLimit(defaultLimits[cmd.Name()])
		return defaultLimits[cmd.Name()]
	}
	return -1
}
