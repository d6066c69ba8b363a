package main

import (
	"strings"
	"testing"
)

// TestReplayResumeHintMasksPassword: the advice after an interrupted replay on
// a PostgreSQL store does not print its password (fresh-user pass), and keeps
// --room and --force.
func TestReplayResumeHintMasksPassword(t *testing.T) {
	h := replayResumeHint("postgres://mtxdb:s3cret@127.0.0.1:5432/db?sslmode=disable", "!r:x", true)
	if strings.Contains(h, "s3cret") || !strings.Contains(h, "mtxdb:xxxxx@127.0.0.1") || !strings.Contains(h, "--room !r:x --force") {
		t.Fatalf("hint %q", h)
	}
	if h := replayResumeHint("/tmp/s", "", false); !strings.Contains(h, "mtxdb replay --store /tmp/s to continue") {
		t.Fatalf("hint %q", h)
	}
}
