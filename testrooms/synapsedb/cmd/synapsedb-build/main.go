// Command synapsedb-build writes a Synapse-layout database (package synapsedb)
// from room directories, for make bench-import-synapse:
//
//	synapsedb-build TARGET ROOM_DIR...
//
// TARGET is a new SQLite file's path or an empty PostgreSQL database's URL.
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/mtxdb/mtxdb/testrooms/synapsedb"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: synapsedb-build TARGET ROOM_DIR...")
		os.Exit(2)
	}
	start := time.Now()
	ids, err := synapsedb.Build(os.Args[1], os.Args[2:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "synapsedb-build:", err)
		os.Exit(1)
	}
	fmt.Printf("synapsedb-build: %d rooms into %s in %.1f s\n", len(ids), os.Args[1], time.Since(start).Seconds())
}
