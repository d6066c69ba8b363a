// Package testseed gives a randomised test its seed, and logs the seed with the
// flag that runs the test again on it.
package testseed

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// Seed returns the seed of the randomised test t: flagValue, the value of the
// flag named flagName, when it is not 0; else the decimal uint64 in the
// environment variable env when env is not "" and the variable is set (t fails
// on any other value); else the clock's nanoseconds. It logs the seed and the
// -run and -flagName arguments that repeat the test with it.
func Seed(t testing.TB, flagName string, flagValue uint64, env string) uint64 {
	t.Helper()
	seed := flagValue
	if seed == 0 && env != "" {
		if v := os.Getenv(env); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", env, err)
			}
			seed = n
		}
	}
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay: go test -run '^%s$' -%s=%d)", seed, t.Name(), flagName, seed)
	return seed
}
