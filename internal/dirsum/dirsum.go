// Package dirsum summarises a directory's files by size and SHA-256, for
// tests that must show an operation changed no file.
package dirsum

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Of maps the name of each entry of dir (not recursive) to "SIZE:SHA256HEX"
// of its content. It is safe for concurrent use (it only reads).
func Of(dir string) (map[string]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(ents))
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out[e.Name()] = fmt.Sprintf("%d:%x", len(b), sha256.Sum256(b))
	}
	return out, nil
}

// Must is Of for tests: it fails tb on error.
func Must(tb testing.TB, dir string) map[string]string {
	tb.Helper()
	m, err := Of(dir)
	if err != nil {
		tb.Fatal(err)
	}
	return m
}
