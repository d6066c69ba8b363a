package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestReplayResumeHintMasksPassword: the advice after an interrupted replay on
// a PostgreSQL store does not print its password, and keeps
// --room and --force.
func TestReplayResumeHintMasksPassword(t *testing.T) {
	h := replayResumeHint("postgres://mtxdb:s3cret@127.0.0.1:5432/db?sslmode=disable", "!r:x", true)
	if strings.Contains(h, "s3cret") || !strings.Contains(h, "mtxdb:xxxxx@127.0.0.1") || !strings.Contains(h, "--room '!r:x' --force") {
		t.Fatalf("hint %q", h)
	}
	if h := replayResumeHint("/tmp/s", "", false); !strings.Contains(h, "mtxdb replay --store /tmp/s to continue") {
		t.Fatalf("hint %q", h)
	}
}

// TestShellArg: arguments with shell-special characters come out single-quoted
// (a room ID's "!", a URL's "?"), plain ones as they are; the quoted form is
// what sh reads back.
func TestShellArg(t *testing.T) {
	for in, want := range map[string]string{
		"/tmp/s":            "/tmp/s",
		"!abc:server1.test": "'!abc:server1.test'",
		"postgres://u:xxxxx@h/db?sslmode=disable": "'postgres://u:xxxxx@h/db?sslmode=disable'",
		"it's": `'it'\''s'`,
		"":     "''",
	} {
		got := shellArg(in)
		if got != want {
			t.Errorf("shellArg(%q) = %s, want %s", in, got, want)
			continue
		}
		out, err := exec.Command("sh", "-c", "printf %s "+got).Output()
		if err != nil || string(out) != in {
			t.Errorf("sh read %s back as %q (%v), want %q", got, out, err, in)
		}
	}
}
