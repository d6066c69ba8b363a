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
		if _, err := os.Stat(target); err != nil {
			return fmt.Errorf("serverdb: %s database %s: %w", server, target, err)
		}
		d.db, err = sql.Open("sqlite", "file:"+target+"?mode=ro&_pragma=query_only(1)&_pragma=busy_timeout(10000)")
	}
	if err != nil {
		return fmt.Errorf("serverdb: %s: %w", d.where, err)
	}
	opts := &sql.TxOptions{ReadOnly: true}
	if d.pg {
		opts.Isolation = sql.LevelRepeatableRead
	}
	if d.tx, err = d.db.BeginTx(ctx, opts); err != nil {
		d.db.Close()
		return fmt.Errorf("serverdb: %s: %w", d.where, err)
	}
	return nil
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
	}
	return d.db.Close()
}

// probe selects every column read from every table, so that a database of
// another layout is refused at once, with notIt naming the table and columns.
func (d *database) probe(ctx context.Context, notIt error, columns [][2]string) error {
	for _, tc := range columns {
		rows, err := d.tx.QueryContext(ctx, "SELECT "+tc[1]+" FROM "+tc[0]+" LIMIT 0")
		if err != nil {
			return fmt.Errorf("%w: %s: table %s (%s): %v", notIt, d.where, tc[0], tc[1], err)
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
