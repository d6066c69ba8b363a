package statetables

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/matrix-org/dendrite/roomserver/storage/shared"
	"github.com/matrix-org/dendrite/roomserver/storage/tables"
	"github.com/matrix-org/dendrite/roomserver/types"
	"github.com/matrix-org/dendrite/setup/config"
	"github.com/prometheus/client_golang/prometheus"
)

// Environment variables that place the store (see Swap and DirFor).
const (
	// EnvDir names a store directory outright (one roomserver database per
	// process), for SQLite and PostgreSQL alike: a PostgreSQL Dendrite then keeps
	// its state in that directory instead of its database.
	EnvDir = "MTXDB_DENDRITE_STATE_DIR"
	// EnvBase is the directory under which earlier versions kept a store per
	// PostgreSQL database (default: "mtxdb-state" in the working directory); Swap
	// only checks that no such store is left behind (ErrStoreInDirectory).
	EnvBase = "MTXDB_DENDRITE_STATE_BASE"
	// EnvLog, when set, names a file to which Swap appends one line per store it
	// opens ("postgres DATABASE" or "directory DIR"): for Dendrite's suite
	// (make test-dendrite-suite), whose databases are gone when it ends.
	EnvLog = "MTXDB_DENDRITE_STATE_LOG"
)

// DirFor returns the store directory of a roomserver database, from the database
// itself (so that a connection string inherited from Dendrite's global database
// options works too): $MTXDB_DENDRITE_STATE_DIR when set; for SQLite the main
// database file (PRAGMA database_list) + ".mtxdb-state"; for PostgreSQL, where
// earlier versions kept it (Swap keeps the store in the database unless
// $MTXDB_DENDRITE_STATE_DIR is set), $MTXDB_DENDRITE_STATE_BASE (default ./mtxdb-state) joined with
// "pg-" + server address + "-" + port + "-" + database name. Errors: an in-memory
// SQLite database, a failed query.
func DirFor(ctx context.Context, db *sql.DB, sqlite bool) (string, error) {
	if d := os.Getenv(EnvDir); d != "" {
		return d, nil
	}
	if sqlite {
		rows, err := db.QueryContext(ctx, "PRAGMA database_list")
		if err != nil {
			return "", fmt.Errorf("statetables: SQLite database file: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var seq int
			var name, file string
			if err := rows.Scan(&seq, &name, &file); err != nil {
				return "", fmt.Errorf("statetables: SQLite database file: %w", err)
			}
			if name == "main" {
				return sqliteDir(file)
			}
		}
		if err := rows.Err(); err != nil {
			return "", fmt.Errorf("statetables: SQLite database file: %w", err)
		}
		return sqliteDir("")
	}
	var host, port sql.NullString
	var name string
	if err := db.QueryRowContext(ctx, "SELECT current_database(), host(inet_server_addr()), inet_server_port()::text").Scan(&name, &host, &port); err != nil {
		return "", fmt.Errorf("statetables: PostgreSQL database name: %w", err)
	}
	return postgresDir(host.String, port.String, name), nil
}

func sqliteDir(file string) (string, error) {
	if file == "" {
		return "", fmt.Errorf("statetables: the SQLite roomserver database has no file (in memory?); set %s", EnvDir)
	}
	return file + ".mtxdb-state", nil
}

// postgresDir: host "" (a Unix socket) is "local".
func postgresDir(host, port, db string) string {
	base := os.Getenv(EnvBase)
	if base == "" {
		base = "mtxdb-state"
	}
	if host == "" {
		host = "local"
	}
	return filepath.Join(base, "pg-"+sanitize(host)+"-"+sanitize(port)+"-"+sanitize(db))
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func sanitize(s string) string { return unsafeChars.ReplaceAllString(s, "_") }

// Swap opens the store of a roomserver database and puts it in place of Dendrite's
// SQL state snapshot and state block tables, after CheckMigrated: a SQLite Dendrite's
// store is a packstore directory (DirFor); a PostgreSQL Dendrite's is in its own
// database (OpenPostgres: pgstore's tables, written in the transactions Dendrite
// hands the tables), unless $MTXDB_DENDRITE_STATE_DIR names a directory. Purges
// also purge the store (PurgeAfterSQL). This is the whole change a fork makes, right
// after roomserver/storage's sqlite3.Open or postgres.Open. Errors: those of
// DirFor, Open, OpenPostgres and CheckMigrated, and ErrStoreInDirectory.
func Swap(ctx context.Context, d *shared.Database, opts *config.DatabaseOptions) error {
	sqlite := opts.ConnectionString.IsSQLite()
	var s *Store
	if sqlite || os.Getenv(EnvDir) != "" {
		dir, err := DirFor(ctx, d.DB, sqlite)
		if err != nil {
			return err
		}
		if s, err = Open(dir); err != nil {
			return err
		}
	} else {
		var err error
		if s, err = OpenPostgres(ctx, d.DB); err != nil {
			return err
		}
		if err := checkNoDirectory(ctx, d.DB, s); err != nil {
			return err
		}
	}
	if err := CheckMigrated(ctx, d.DB, s); err != nil {
		_ = s.Close()
		return err
	}
	if f := os.Getenv(EnvLog); f != "" {
		logOpen(f, s)
	}
	if err := RegisterMetrics(prometheus.DefaultRegisterer, s); err != nil {
		_ = s.Close()
		return fmt.Errorf("statetables: register metrics: %w", err)
	}
	s.SetEventsDB(d.DB, sqlite)
	d.StateSnapshotTable = s
	d.StateBlockTable = s
	d.Purge = PurgeAfterSQL(d.Purge, d.DB, s)
	return nil
}

// logOpen appends the store's line to EnvLog's file (best effort: a test hook).
func logOpen(file string, s *Store) {
	line := "directory " + s.Dir() + "\n"
	if s.db != nil {
		line = "postgres " + s.Where() + "\n"
	}
	if f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		_, _ = f.WriteString(line)
		_ = f.Close()
	}
}

// ErrStoreInDirectory: a PostgreSQL Dendrite's state is in a store directory where
// earlier versions kept it, and its database holds no mtxdb state yet.
var ErrStoreInDirectory = errors.New("statetables: this PostgreSQL roomserver database's mtxdb state is in a store directory (the layout before state moved into the database), and the database holds none")

// checkNoDirectory refuses to start on an empty in-database store while the store
// directory of earlier versions exists for this database: Dendrite would name
// snapshot NIDs that only that directory has. The error says how to keep using it.
func checkNoDirectory(ctx context.Context, db *sql.DB, s *Store) error {
	empty, err := s.Empty()
	if err != nil || !empty {
		return err
	}
	dir, err := DirFor(ctx, db, false)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
		return fmt.Errorf("%w: %s; set %s=%s to keep using it", ErrStoreInDirectory, dir, EnvDir, dir)
	}
	return nil
}

// ErrNotMigrated: the SQL snapshot table has rows and the store is empty.
var ErrNotMigrated = errors.New("statetables: this roomserver database keeps its state in SQL (roomserver_state_snapshots has rows) and its mtxdb state store is empty")

// CheckMigrated refuses a database whose state is still in SQL while the store is
// empty (a Dendrite that ran without mtxdb before): every state request would fail.
// The error names the migration command.
func CheckMigrated(ctx context.Context, db *sql.DB, s *Store) error {
	if empty, err := s.Empty(); err != nil || !empty {
		return err
	}
	var one int
	err := db.QueryRowContext(ctx, "SELECT 1 FROM roomserver_state_snapshots LIMIT 1").Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("statetables: check roomserver_state_snapshots: %w", err)
	}
	if s.db != nil {
		return fmt.Errorf("%w (%s): run `mtxdb-dendrite-migrate -db CONNECTION` first", ErrNotMigrated, s.Where())
	}
	return fmt.Errorf("%w (%s): run `mtxdb-dendrite-migrate -db CONNECTION -store %s` first", ErrNotMigrated, s.Dir(), s.Dir())
}

// PurgeAfterSQL wraps Dendrite's purge: the SQL purge runs in its transaction as
// before. On PostgreSQL the store's copy of the room is deleted in that same
// transaction. On packstore it is deleted only once the room's row is gone from
// roomserver_rooms outside that transaction (committed), checked every 100 ms for up
// to a minute; a rolled-back purge leaves the store untouched.
func PurgeAfterSQL(p tables.Purge, db *sql.DB, s *Store) tables.Purge {
	return purge{next: p, db: db, s: s}
}

type purge struct {
	next tables.Purge
	db   *sql.DB
	s    *Store
}

func (p purge) PurgeRoom(ctx context.Context, txn *sql.Tx, roomNID types.RoomNID, roomID string) error {
	if err := p.next.PurgeRoom(ctx, txn, roomNID, roomID); err != nil {
		return err
	}
	if p.s.db != nil {
		return p.s.PurgeRoom(ctx, txn, roomNID)
	}
	go p.afterCommit(roomNID)
	return nil
}

func (p purge) afterCommit(roomNID types.RoomNID) {
	ctx := context.Background()
	for i := 0; i < 600; i++ {
		var one int
		err := p.db.QueryRowContext(ctx, "SELECT 1 FROM roomserver_rooms WHERE room_nid = $1", int64(roomNID)).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			_ = p.s.PurgeRoom(ctx, nil, roomNID)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}
