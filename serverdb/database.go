package serverdb

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite"
)

// database is a server's database opened read-only, read in one transaction.
type database struct {
	db    *sql.DB
	tx    *sql.Tx
	pg    bool
	where string // for messages: the path, or the URL without its password
}

// isURL reports whether target names a PostgreSQL database.
func isURL(target string) bool {
	return strings.HasPrefix(target, "postgres://") || strings.HasPrefix(target, "postgresql://")
}

// open opens target (a SQLite path or a PostgreSQL URL) read-only and begins
// the read transaction; server names the kind for messages.
func (d *database) open(ctx context.Context, server, target string) error {
	d.where = target
	var err error
	if isURL(target) {
		d.pg = true
		d.where = redactURL(target)
		d.db, err = sql.Open("pgx", target)
	} else {
		fi, err := os.Stat(target)
		if err != nil {
			return fmt.Errorf("serverdb: %s database %s: %w", server, target, err)
		}
		if fi.IsDir() {
			return fmt.Errorf("serverdb: %s database %s is a directory: give the database file", server, target)
		}
		err = d.openSQLite(ctx, target, false)
		if err != nil && readOnlyPlace(err) {
			// A copy in WAL mode in a directory this user cannot write: SQLite
			// cannot make its -shm file, so the copy is read as immutable.
			d.Close()
			err = d.openSQLite(ctx, target, true)
		}
		if err != nil {
			d.Close()
			return fmt.Errorf("serverdb: %s: %w", d.where, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("serverdb: %s: %w", d.where, err)
	}
	if d.tx, err = d.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead}); err != nil {
		d.db.Close()
		return fmt.Errorf("serverdb: %s: %w", d.where, err)
	}
	return nil
}

// openSQLite opens a SQLite file read-only (query_only; immutable: no locks and
// no -shm, for a file nothing writes) and begins the read transaction, with a
// first read so that a file that cannot be read fails here.
func (d *database) openSQLite(ctx context.Context, path string, immutable bool) error {
	dsn := "file:" + SQLitePath(path) + "?mode=ro&_pragma=query_only(1)&_pragma=busy_timeout(10000)&_pragma=cache_size(-65536)"
	if immutable {
		dsn += "&immutable=1"
	}
	var err error
	if d.db, err = sql.Open("sqlite", dsn); err != nil {
		return err
	}
	if d.tx, err = d.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true}); err != nil {
		return err
	}
	var n int
	return d.tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM sqlite_master").Scan(&n)
}

// SQLitePath escapes the characters a SQLite URI filename gives a meaning to
// ('%', '?', '#'), so that "file:"+SQLitePath(p) opens the file p names
// (modernc.org/sqlite cuts even a plain path at '?').
func SQLitePath(p string) string {
	return strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(p)
}

// readOnlyPlace reports whether a SQLite open failed because the file's
// directory or -shm cannot be written.
func readOnlyPlace(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "readonly database") || strings.Contains(msg, "unable to open database file")
}

// notTheSchema reports whether err, from reading a table, says the table or a
// column is missing (another program's database) rather than that the file
// cannot be read.
func notTheSchema(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "no such table") || strings.Contains(msg, "no such column") ||
		strings.Contains(msg, "does not exist") || strings.Contains(msg, "file is not a database")
}

// Redact is target for messages and files: a URL's password masked, a path as
// it is.
func Redact(target string) string {
	if isURL(target) {
		return redactURL(target)
	}
	return target
}

// redactURL drops the password of a URL for messages.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "a PostgreSQL URL"
	}
	return p.Redacted()
}

// Close ends the read transaction and closes the database.
func (d *database) Close() error {
	if d.tx != nil {
		d.tx.Rollback()
		d.tx = nil
	}
	if d.db == nil {
		return nil
	}
	err := d.db.Close()
	d.db = nil
	return err
}

// probe selects every column read from every table, so that a database of
// another layout is refused at once, with notIt naming the table and columns.
func (d *database) probe(ctx context.Context, notIt error, columns [][2]string) error {
	for _, tc := range columns {
		rows, err := d.tx.QueryContext(ctx, "SELECT "+tc[1]+" FROM "+tc[0]+" LIMIT 0")
		if err != nil && notTheSchema(err) {
			return fmt.Errorf("%w: %s: table %s (%s): %v", notIt, d.where, tc[0], tc[1], err)
		}
		if err != nil {
			return fmt.Errorf("serverdb: %s: cannot read table %s: %w", d.where, tc[0], err)
		}
		rows.Close()
	}
	return nil
}

// q adapts a query written with ? placeholders to the database.
func (d *database) q(query string) string {
	if !d.pg {
		return query
	}
	return Placeholders(query)
}

// Placeholders turns each ? of a query into $1, $2, ... (PostgreSQL's form).
// The queries it is given have no ? inside string literals.
func Placeholders(query string) string {
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
