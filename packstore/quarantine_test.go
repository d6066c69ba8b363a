package packstore

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStrayShardQuarantined: a shard file with a bad
// header that holds no acknowledged data (what a crash while creating a
// shard leaves: an empty file, a short or zero-filled header, a damaged
// one) is renamed aside and reported, and the store opens with every
// record; the same damage on a shard whose frames the index files say were
// synced fails Open with ErrCorrupt naming the file and renames nothing.
func TestStrayShardQuarantined(t *testing.T) {
	damaged := func(b []byte) []byte {
		b = append([]byte(nil), b...)
		b[100] ^= 0xff
		return b
	}
	hdr := encodeHeader(shardHeader{PackID: 9})
	strays := map[string][]byte{
		"empty":       nil,
		"short":       hdr[:1000],
		"zero-filled": make([]byte, HeaderSize),
		"damaged":     damaged(hdr),
	}
	for name, content := range strays {
		t.Run(name, func(t *testing.T) {
			dir, opts := filledStore(t)
			stray := shardPath(dir, 9)
			if err := os.WriteFile(stray, content, 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := Open(opts)
			if err != nil {
				t.Fatalf("Open with a stray %s shard file: %v", name, err)
			}
			defer s.Close()
			r := s.OpenReport()
			if len(r.Quarantined) != 1 || !strings.Contains(r.Quarantined[0], "shard-00009.mtdb") {
				t.Fatalf("OpenReport.Quarantined = %q", r.Quarantined)
			}
			if _, err := os.Stat(stray); !os.IsNotExist(err) {
				t.Fatalf("stray file still in place: %v", err)
			}
			aside, _ := filepath.Glob(stray + ".quarantined-*")
			if len(aside) != 1 {
				t.Fatalf("quarantined copies: %q", aside)
			}
			if got, _ := os.ReadFile(aside[0]); !bytes.Equal(got, content) {
				t.Fatalf("quarantined file changed")
			}
			for i := range 60 {
				mustGet(t, s, ID{1}, idN(2, i), bytes.Repeat([]byte{byte(i)}, 500))
			}
			mustCheck(t, s)
			// The store keeps working: a write that rolls into pack ID 9
			// gets a fresh file.
			for i := 60; i < 300; i++ {
				if err := s.Put(ID{1}, idN(2, i), bytes.Repeat([]byte{byte(i)}, 500)); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Sync(); err != nil {
				t.Fatal(err)
			}
			mustCheck(t, s)
			if s.shards[9].Load() == nil {
				t.Fatalf("writes did not reach pack ID 9 (active %d)", s.active.id)
			}
		})
	}
	t.Run("synced-data-at-stake", func(t *testing.T) {
		dir, opts := filledStore(t)
		path := shardPath(dir, 1)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b[100] ^= 0xff
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(opts); !IsCorruption(err) || !strings.Contains(err.Error(), "shard-00001.mtdb") {
			t.Fatalf("Open with a damaged header on a synced shard: %v", err)
		}
		if aside, _ := filepath.Glob(path + ".quarantined-*"); len(aside) != 0 {
			t.Fatalf("a shard with synced data was quarantined: %q", aside)
		}
	})
}

// filledStore returns a closed store of 16 KiB shards holding records
// idN(2, 0..59) of collection {1}, 500 bytes of byte(i) each (three shards).
func filledStore(t *testing.T) (string, Options) {
	t.Helper()
	dir := t.TempDir()
	opts := Options{Dir: dir, MaxShardBytes: 16 << 10}
	s := openStore(t, opts)
	for i := range 60 {
		if err := s.Put(ID{1}, idN(2, i), bytes.Repeat([]byte{byte(i)}, 500)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, opts
}
