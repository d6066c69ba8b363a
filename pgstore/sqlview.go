package pgstore

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/mtxdb/mtxdb/internal/storage"
)

// SQLConn is the part of database/sql that SQLView runs its statements on:
// *sql.DB, *sql.Conn and *sql.Tx satisfy it, whatever the driver (lib/pq, as
// Dendrite uses, or pgx's stdlib).
type SQLConn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// SQLView reads and writes a store's records (the tables of the package doc)
// through a database/sql handle of the same database, so that the records join
// a transaction another program opened with another driver: a view over a
// *sql.Tx writes inside that transaction and commits or rolls back with it; a
// view over a *sql.DB or *sql.Conn writes each PutMany in a transaction of
// its own. Its statements take only []byte parameters (no arrays: lib/pq has
// no [][]byte parameter type), so any driver encodes them:
//
//   - Get: one SELECT; GetMany: SELECT ... WHERE coll = $1 AND id IN ($2, ...),
//     one round trip per viewBatch IDs;
//   - PutMany: multi-row INSERT ... VALUES ($1, $2, $3), ($1, $4, $5), ...
//     ON CONFLICT (coll, id) DO UPDATE ... WHERE data IS DISTINCT FROM
//     excluded.data (Store's upsert, the same rows and semantics), at most
//     viewBatch rows or batchBytes payload bytes per statement, rows in ID
//     order so that two transactions writing overlapping records lock them in
//     the same order (no deadlock between them);
//   - DeleteCollection: one DELETE.
//
// The view checks no schema: call PrepareSQL once first. A zero-cost value:
// make one per transaction.
type SQLView struct {
	ctx context.Context
	c   SQLConn
}

// viewBatch bounds the IDs of one GetMany statement and the rows of one PutMany
// statement of SQLView (2*viewBatch+1 parameters, far below PostgreSQL's 65535).
const viewBatch = 1000

// OverSQL returns the view of the store in c's database; ctx bounds every
// statement.
func OverSQL(ctx context.Context, c SQLConn) SQLView { return SQLView{ctx: ctx, c: c} }

// PrepareSQL is Open's schema step over database/sql: it creates the tables
// unless noCreate and checks the recorded version (ErrNoSchema,
// ErrSchemaVersion).
func PrepareSQL(ctx context.Context, c SQLConn, noCreate bool) error {
	err := checkSchema(ctx, noCreate,
		func(q string) error { _, err := c.ExecContext(ctx, q); return err },
		func() (*int32, error) {
			var v sql.NullInt32
			rows, err := c.QueryContext(ctx, `SELECT max(version) FROM mtxdb_schema`)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			if rows.Next() {
				if err := rows.Scan(&v); err != nil {
					return nil, err
				}
			}
			if err := rows.Err(); err != nil || !v.Valid {
				return nil, err
			}
			return &v.Int32, nil
		})
	if err != nil {
		return fmt.Errorf("pgstore: %w", err)
	}
	return nil
}

// Get returns the record's payload or storage.ErrNotFound.
func (v SQLView) Get(coll, id storage.ID) ([]byte, error) {
	out, err := v.GetMany(coll, []storage.ID{id})
	if err != nil {
		return nil, err
	}
	if out[0] == nil {
		return nil, storage.ErrNotFound
	}
	return out[0], nil
}

// GetMany returns one entry per ID in request order, nil where absent.
func (v SQLView) GetMany(coll storage.ID, ids []storage.ID) ([][]byte, error) {
	out := make([][]byte, len(ids))
	found := make(map[storage.ID][]byte, len(ids))
	for start := 0; start < len(ids); start += viewBatch {
		part := ids[start:min(start+viewBatch, len(ids))]
		var q strings.Builder
		q.WriteString(`SELECT id, data FROM mtxdb_records WHERE coll = $1 AND id IN (`)
		args := make([]any, 1, len(part)+1)
		args[0] = coll[:]
		for i := range part {
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString("$" + strconv.Itoa(i+2))
			args = append(args, part[i][:])
		}
		q.WriteString(")")
		if err := v.scan(q.String(), args, found); err != nil {
			return nil, fmt.Errorf("pgstore: get %d records of %s: %w", len(ids), coll, err)
		}
	}
	seen := make(map[storage.ID]bool, len(found))
	for i, id := range ids {
		if d, ok := found[id]; ok {
			if seen[id] { // an ID asked twice gets its own copy
				d = bytes.Clone(d)
			}
			seen[id] = true
			out[i] = d
		}
	}
	return out, nil
}

func (v SQLView) scan(q string, args []any, found map[storage.ID][]byte) error {
	rows, err := v.c.QueryContext(v.ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id, data []byte
		if err := rows.Scan(&id, &data); err != nil {
			return err
		}
		if len(id) != len(storage.ID{}) {
			return fmt.Errorf("%w: a %d-byte ID", storage.ErrCorrupt, len(id))
		}
		if data == nil {
			data = []byte{}
		}
		found[storage.ID(id)] = data
	}
	return rows.Err()
}

// Put writes one record (superseding an existing one).
func (v SQLView) Put(coll, id storage.ID, data []byte) error {
	return v.PutMany(coll, []storage.Record{{ID: id, Data: data}})
}

// PutMany writes the records (the last occurrence of an ID wins): in the view's
// transaction when it is a *sql.Tx, else in one transaction of its own.
func (v SQLView) PutMany(coll storage.ID, recs []storage.Record) error {
	if len(recs) == 0 {
		return nil
	}
	last := make(map[storage.ID]int, len(recs))
	for i, r := range recs {
		last[r.ID] = i
	}
	rows := make([]storage.Record, 0, len(last))
	for i, r := range recs {
		if last[r.ID] == i {
			rows = append(rows, r)
		}
	}
	slices.SortFunc(rows, func(a, b storage.Record) int { return bytes.Compare(a.ID[:], b.ID[:]) })
	err := v.inTx(func(c SQLConn) error { return v.upsert(c, coll, rows) })
	if err != nil {
		return writeErr(coll, len(recs), err)
	}
	return nil
}

// PutIf writes one record if it still holds old (nil: absent), as
// Store.PutManyIf does for one record; otherwise nothing is written and the
// error wraps storage.ErrConflict. In the view's transaction when it is a
// *sql.Tx, else committed on its own.
func (v SQLView) PutIf(coll, id storage.ID, data, old []byte) error {
	var res sql.Result
	var err error
	if old == nil {
		res, err = v.c.ExecContext(v.ctx, `INSERT INTO mtxdb_records (coll, id, data) VALUES ($1, $2, $3) ON CONFLICT (coll, id) DO NOTHING`,
			coll[:], id[:], nonNil(data))
	} else {
		res, err = v.c.ExecContext(v.ctx, `UPDATE mtxdb_records SET data = $3 WHERE coll = $1 AND id = $2 AND data = $4`,
			coll[:], id[:], nonNil(data), old)
	}
	if err != nil {
		return writeErr(coll, 1, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return writeErr(coll, 1, err)
	} else if n != 1 {
		return fmt.Errorf("%w: collection %s record %s", storage.ErrConflict, coll, id)
	}
	return nil
}

// upsert writes rows (distinct IDs) in statements of at most viewBatch rows
// and batchBytes payload bytes.
func (v SQLView) upsert(c SQLConn, coll storage.ID, rows []storage.Record) error {
	for start := 0; start < len(rows); {
		end, size := start, 0
		for end < len(rows) && end-start < viewBatch && (end == start || size+len(rows[end].Data) <= batchBytes) {
			size += len(rows[end].Data)
			end++
		}
		var q strings.Builder
		q.WriteString(`INSERT INTO mtxdb_records (coll, id, data) VALUES `)
		args := make([]any, 1, 2*(end-start)+1)
		args[0] = coll[:]
		for i, r := range rows[start:end] {
			if i > 0 {
				q.WriteString(", ")
			}
			fmt.Fprintf(&q, "($1, $%d, $%d)", 2*i+2, 2*i+3)
			args = append(args, r.ID[:], nonNil(r.Data))
		}
		q.WriteString(` ON CONFLICT (coll, id) DO UPDATE SET data = excluded.data WHERE mtxdb_records.data IS DISTINCT FROM excluded.data`)
		if _, err := c.ExecContext(v.ctx, q.String(), args...); err != nil {
			return err
		}
		start = end
	}
	return nil
}

// DeleteCollection deletes every record of the collection (in the view's
// transaction when it is a *sql.Tx).
func (v SQLView) DeleteCollection(coll storage.ID) error {
	if _, err := v.c.ExecContext(v.ctx, `DELETE FROM mtxdb_records WHERE coll = $1`, coll[:]); err != nil {
		return writeErr(coll, 0, err)
	}
	return nil
}

// DeleteCollectionExcept deletes every record of the collection but those
// named in keep (in the view's transaction when it is a *sql.Tx).
func (v SQLView) DeleteCollectionExcept(coll storage.ID, keep ...storage.ID) error {
	if len(keep) == 0 {
		return v.DeleteCollection(coll)
	}
	if len(keep) > viewBatch {
		return fmt.Errorf("pgstore: delete collection %s except %d records: at most %d", coll, len(keep), viewBatch)
	}
	q := `DELETE FROM mtxdb_records WHERE coll = $1 AND id NOT IN (`
	args := []any{coll[:]}
	for i := range keep {
		if i > 0 {
			q += ", "
		}
		q += "$" + strconv.Itoa(i+2)
		args = append(args, keep[i][:])
	}
	if _, err := v.c.ExecContext(v.ctx, q+")", args...); err != nil {
		return writeErr(coll, 0, err)
	}
	return nil
}

// Empty reports whether mtxdb_records holds no record at all.
func (v SQLView) Empty() (bool, error) {
	found := map[storage.ID][]byte{}
	if err := v.scan(`SELECT id, data FROM mtxdb_records LIMIT 1`, nil, found); err != nil {
		return false, fmt.Errorf("pgstore: mtxdb_records: %w", err)
	}
	return len(found) == 0, nil
}

// inTx runs f in the view's transaction (a *sql.Tx, or any SQLConn that cannot
// begin one), or in a new transaction of a *sql.DB or *sql.Conn, committed
// when f succeeds.
func (v SQLView) inTx(f func(SQLConn) error) error {
	b, ok := v.c.(interface {
		BeginTx(context.Context, *sql.TxOptions) (*sql.Tx, error)
	})
	if !ok {
		return f(v.c)
	}
	tx, err := b.BeginTx(v.ctx, nil)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		return errors.Join(err, ignoreDone(tx.Rollback()))
	}
	return tx.Commit()
}

func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}
