package gen

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGenerateGolden pins the sha256 of every file of a few generated rooms (the
// sums of `mtxdb gen` with the flags in each case's comment): a change that
// alters any byte of the output for the same options fails here. The
// simulation drops dead states every 64 events here (dropEvery), so the
// stateLog rebuilds far more of what the files record than at the default.
func TestGenerateGolden(t *testing.T) {
	defer func(n int) { dropEvery = n }(dropEvery)
	dropEvery = 64
	for _, tc := range []struct {
		name  string
		opts  func(o *Options)
		rooms int
		sums  map[string]string
	}{{
		// --events 3000 --seed 1 --servers 5 --room-version 12 --backfill
		name: "v12-backfill",
		opts: func(o *Options) { o.Events, o.Backfill = 3000, true },
		sums: map[string]string{
			"backfill_order.jsonl":  "dd50749b8559e28a4aa3a1fc253346e8795b389ab8fdd2b676f9db63713e93f7",
			"current_state.json":    "03720facd60b926f3a0a163d0b6ad5f611ad151bd4839189aa8473eb79255720",
			"events.jsonl":          "e242d8e3f76fa37c5b1c6d506fc217ed31c3fa9c44abe8e254cdf2041835be86",
			"events_backfill.jsonl": "7ca56fe3e43db461ba50cd65a4f0f5b35c6368aaf17d9a5d06f7ba0526341512",
			"expected_state.jsonl":  "fe28cd373f8839eb6b3ad2905ac092fc7b48ec57a5d14aa49aa5f95f4414470e",
			"meta.json":             "c4d392a537e78ac7498f985b4199e95647ea65f75732c65127b36aa3297baaa5",
		},
	}, {
		// --events 1500 --seed 2 --servers 4 --room-version 10 --loss 0.2 --max-delay 20
		name: "v10-lossy",
		opts: func(o *Options) {
			o.Events, o.Seed, o.Servers, o.RoomVersion, o.Loss, o.MaxDelay = 1500, 2, 4, "10", 0.2, 20
		},
		sums: map[string]string{
			"current_state.json":   "54943cdd21eb9f5978cf38e514d4cfb4625e0d904d919bfd5606e89b12cfb18f",
			"events.jsonl":         "3bae1ff68da6a9c9d64b51eb949a8afe13d8606474d121e46a861af748956fe6",
			"expected_state.jsonl": "cfd341289bb105dd53f0be8f4b2bca8565af674cd257ae812e5f91d41d1190fa",
			"meta.json":            "c09542e4247575b1dd763d53f31774e1ef38e01e08668da65fb035ef4f1233a7",
		},
	}, {
		// --events 12000 --seed 3 --servers 5 --room-version 11 --no-reference --state-budget 200000
		// (expected_state.jsonl: every 107th event)
		name: "v11-sampled",
		opts: func(o *Options) {
			o.Events, o.Seed, o.RoomVersion, o.NoReference, o.StateBudget = 12000, 3, "11", true, 200000
		},
		sums: map[string]string{
			"current_state.json":   "e4e59f98ce351f6700976a8ec41f8176f99205f4b6252ce099d9861e07efcd00",
			"events.jsonl":         "76a0e7bb4074b6684e2439a41b181172329557926312fca97f90615b46f66372",
			"expected_state.jsonl": "9a56217a1421b1be6c7c0023f5e961ed3d3c381f22677b93d5fcc83bf378e66e",
			"meta.json":            "da255e0b7e50def65b87e27aa74ecb2fe5d7b4efb46fc8b1157b822685e52a77",
		},
	}, {
		// --events 400 --seed 4 --servers 3 --room-version 12 --rooms 3
		name:  "multi",
		opts:  func(o *Options) { o.Events, o.Seed, o.Servers = 400, 4, 3 },
		rooms: 3,
		sums: map[string]string{
			"interleaved.jsonl":            "444f7b7d0e35024f384ca119134b826cf55b5c1d219cb316af8eb263688505cb",
			"room001/current_state.json":   "55149edebce6498f384a689ef8b5a767ce94801db034908fbe473da40d3d243b",
			"room001/events.jsonl":         "a4c6755457b4b1d1958463fd11f4a88a7fb20d1a70daec9392af60724c7a2e7d",
			"room001/expected_state.jsonl": "46439e339e45f925b36f37f05ea19697caebd5680bdc2fbfa7efb72d346312df",
			"room001/meta.json":            "3f239380349d0de4360d3cbb7db5015401520ef077b348c6179fd07524d38b70",
			"room002/current_state.json":   "2fb1ff8e836caa407001cac11eedefc6afb2f30f5e45d665ac122a17ec02552f",
			"room002/events.jsonl":         "91dd76aff20f23c83ff0e11f1af58eed758fa269a5fdb2e29df84df4765c132a",
			"room002/expected_state.jsonl": "ece042cc016f591458bc7e83c4dfbb48f0e0d18a92be97b712343e0f240e017c",
			"room002/meta.json":            "8c81ecb983cf6c318911f957383cac52f41eaf0211c24c6435a3951bb19ca84c",
			"room003/current_state.json":   "ae06bd426e2dbac9a9a401df82e96eee714694d2a81105d47bff2a222c892464",
			"room003/events.jsonl":         "5de859802ac2ce643b5ede3ea8bdfdae64be3872428d343d11ff5a96756c7b81",
			"room003/expected_state.jsonl": "37d167e5d138228a5ba6a370b3da77d8adc730f736ce6987c8366e577ec715f6",
			"room003/meta.json":            "ce17e0bf2133df3beaa9f9358f3a8d0ae4b52e969fa95398886a4cb00d4cb604",
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if testing.Short() && tc.name == "v11-sampled" {
				t.Skip("-short: 12,000 events")
			}
			o := DefaultOptions()
			tc.opts(&o)
			dir := filepath.Join(t.TempDir(), "room")
			var err error
			if tc.rooms > 1 {
				_, err = GenerateMulti(o, tc.rooms, dir, nil)
			} else {
				_, err = Generate(o, dir, nil)
			}
			require.NoError(t, err)
			require.Equal(t, tc.sums, fileSums(t, dir))
		})
	}
}

// fileSums returns the hex sha256 of every file under dir, by slash path.
func fileSums(t *testing.T, dir string) map[string]string {
	sums := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h := sha256.Sum256(b)
		sums[filepath.ToSlash(rel)] = hex.EncodeToString(h[:])
		return nil
	}))
	return sums
}
