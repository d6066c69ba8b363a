package statetables

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/matrix-org/dendrite/roomserver/storage/shared"
	"github.com/matrix-org/dendrite/roomserver/storage/tables"
	"github.com/matrix-org/dendrite/roomserver/types"
	"github.com/matrix-org/dendrite/setup/config"
)

// Environment variables that place the store (see DirFor).
const (
	// EnvDir names the store directory outright (one roomserver database per process).
	EnvDir = "MTXDB_DENDRITE_STATE_DIR"
	// EnvBase is the directory under which PostgreSQL databases get a store each
	// (default: "mtxdb-state" in the working directory).
	EnvBase = "MTXDB_DENDRITE_STATE_BASE"
)

// DirFor returns the store directory of a roomserver database: $MTXDB_DENDRITE_STATE_DIR
// when set; for SQLite (file:PATH[?...]) PATH + ".mtxdb-state" beside the database
// file; for PostgreSQL $MTXDB_DENDRITE_STATE_BASE (default ./mtxdb-state) joined with
// "pg-" + host + "-" + database name. Errors: an empty connection string without
// $MTXDB_DENDRITE_STATE_DIR, a file: string without a path.
func DirFor(conn config.DataSource) (string, error) {
	if d := os.Getenv(EnvDir); d != "" {
		return d, nil
	}
	cs := string(conn)
	if cs == "" {
		return "", fmt.Errorf("statetables: the roomserver database has no connection string of its own; set %s to the mtxdb state directory", EnvDir)
	}
	if conn.IsSQLite() {
		path := strings.TrimPrefix(cs, "file:")
		if i := strings.IndexByte(path, '?'); i >= 0 {
			path = path[:i]
		}
		if path == "" || path == ":memory:" {
			return "", fmt.Errorf("statetables: SQLite connection string %q names no database file; set %s", cs, EnvDir)
		}
		return path + ".mtxdb-state", nil
	}
	base := os.Getenv(EnvBase)
	if base == "" {
		base = "mtxdb-state"
	}
	host, db := postgresHostDB(cs)
	return filepath.Join(base, "pg-"+sanitize(host)+"-"+sanitize(db)), nil
}

// postgresHostDB reads host and database name from a PostgreSQL URL or key=value
// connection string (libpq defaults: host "local", database = user).
func postgresHostDB(cs string) (host, db string) {
	if u, err := url.Parse(cs); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		host, db = u.Host, strings.TrimPrefix(u.Path, "/")
		if db == "" && u.User != nil {
			db = u.User.Username()
		}
	} else {
		user := ""
		for _, f := range strings.Fields(cs) {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				continue
			}
			v = strings.Trim(v, "'")
			switch k {
			case "host":
				host = v
			case "dbname":
				db = v
			case "user":
				user = v
			}
		}
		if db == "" {
			db = user
		}
	}
	if host == "" {
		host = "local"
	}
	return host, db
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func sanitize(s string) string { return unsafeChars.ReplaceAllString(s, "_") }

// Swap opens the store of a roomserver database (DirFor) and puts it in place of
// Dendrite's SQL state snapshot and state block tables, after CheckMigrated; purges
// also purge the store (PurgeAfterSQL). This is the whole change a fork makes, right
// after roomserver/storage's sqlite3.Open or postgres.Open.
func Swap(ctx context.Context, d *shared.Database, opts *config.DatabaseOptions) error {
	dir, err := DirFor(opts.ConnectionString)
	if err != nil {
		return err
	}
	s, err := Open(dir)
	if err != nil {
		return err
	}
	if err := CheckMigrated(ctx, d.DB, s); err != nil {
		_ = s.Close()
		return err
	}
	d.StateSnapshotTable = s
	d.StateBlockTable = s
	d.Purge = PurgeAfterSQL(d.Purge, d.DB, s)
	return nil
}

// ErrNotMigrated: the SQL snapshot table has rows and the store is empty.
var ErrNotMigrated = errors.New("statetables: this roomserver database keeps its state in SQL (roomserver_state_snapshots has rows) and its mtxdb state store is empty")

// CheckMigrated refuses a database whose state is still in SQL while the store is
// empty (a Dendrite that ran without mtxdb before): every state request would fail.
// The error names the migration command.
func CheckMigrated(ctx context.Context, db *sql.DB, s *Store) error {
	if !s.Empty() {
		return nil
	}
	var one int
	err := db.QueryRowContext(ctx, "SELECT 1 FROM roomserver_state_snapshots LIMIT 1").Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("statetables: check roomserver_state_snapshots: %w", err)
	}
	return fmt.Errorf("%w (%s): run `mtxdb-dendrite-migrate -db CONNECTION -store %s` first", ErrNotMigrated, s.Dir(), s.Dir())
}

// PurgeAfterSQL wraps Dendrite's purge: the SQL purge runs in its transaction as
// before, and the store's copy of the room is deleted only once the room's row is
// gone from roomserver_rooms outside that transaction (committed), checked every
// 100 ms for up to a minute; a rolled-back purge leaves the store untouched.
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
	go p.afterCommit(roomNID)
	return nil
}

func (p purge) afterCommit(roomNID types.RoomNID) {
	ctx := context.Background()
	for i := 0; i < 600; i++ {
		var one int
		err := p.db.QueryRowContext(ctx, "SELECT 1 FROM roomserver_rooms WHERE room_nid = $1", int64(roomNID)).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			_ = p.s.PurgeRoom(ctx, roomNID)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}
