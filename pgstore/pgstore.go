package pgstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mtxdb/mtxdb/internal/storage"
)

// SchemaVersion is the newest schema this package writes and reads. Versions:
// 1: mtxdb_schema and mtxdb_records (package doc).
const SchemaVersion = 1

// PutMany statement limits: one INSERT carries at most batchRows rows and
// batchBytes payload bytes (a statement's parameters are sent whole; PostgreSQL
// takes up to 1 GB per parameter, CockroachDB limits a statement to about 16 MiB
// by default).
const (
	batchRows  = 1000
	batchBytes = 4 << 20
)

// Errors of Open.
var (
	// ErrNoSchema is returned by Open with Options.NoCreate when the database
	// has no mtxdb tables (nothing was ever written there).
	ErrNoSchema = errors.New("pgstore: database has no mtxdb schema")
	// ErrSchemaVersion is returned by Open when the database records a schema
	// version newer than SchemaVersion.
	ErrSchemaVersion = errors.New("pgstore: database schema is newer than this mtxdb")
)

// Options configure Open.
type Options struct {
	// URL is a PostgreSQL connection string (postgres://user:pw@host:port/db?...,
	// or keyword=value form), as pgx parses it; search_path selects the schema
	// the tables live in.
	URL string
	// NoCreate opens an existing store without creating or upgrading its
	// tables: for read-only commands, replicas and SELECT-only roles. Open
	// returns ErrNoSchema when the tables are missing.
	NoCreate bool
	// ReadOnly implies NoCreate and opens every session with
	// default_transaction_read_only, so a write fails (storage.ErrReadOnly)
	// instead of changing anything: verify, stats and state use it.
	ReadOnly bool
	// MaxConns bounds the connection pool (0: pgxpool's default, max(4, CPUs)).
	MaxConns int32
}

// Store is a storage.Engine over one PostgreSQL database. Safe for
// concurrent use by multiple goroutines; several processes may share one
// database (package doc).
type Store struct {
	pool   *pgxpool.Pool
	closed atomic.Bool
	errMu  sync.Mutex // guards err
	err    error      // first Collections failure, returned by the next Sync
}

var (
	_ storage.Engine            = (*Store)(nil)
	_ storage.ConditionalPutter = (*Store)(nil)
)

// IsURL reports whether s names a PostgreSQL store (postgres:// or
// postgresql://) rather than a directory.
func IsURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// Redacted returns s with the password of a postgres:// URL replaced by
// "xxxxx" (for messages); anything else unchanged.
func Redacted(s string) string {
	if !IsURL(s) {
		return s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "postgres://(unparsable URL)"
	}
	return u.Redacted()
}

// Open connects to the database, checks (and unless NoCreate, creates) the
// schema. Errors name the host and database, never the password.
func Open(opts Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(opts.URL)
	if err != nil {
		return nil, fmt.Errorf("pgstore: parse connection string: %w", err)
	}
	if opts.ReadOnly {
		opts.NoCreate = true
		cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	where := fmt.Sprintf("%s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: connect to %s: %w", where, err)
	}
	s := &Store{pool: pool}
	if err := s.schema(ctx, opts.NoCreate); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pgstore: %s: %w", where, err)
	}
	return s, nil
}

// createStatements create the schema (version 1); each is idempotent.
var createStatements = []string{
	`CREATE TABLE IF NOT EXISTS mtxdb_schema (
	version INT PRIMARY KEY,
	created TIMESTAMPTZ NOT NULL DEFAULT now()
)`,
	`CREATE TABLE IF NOT EXISTS mtxdb_records (
	coll BYTEA NOT NULL CHECK (length(coll) = 16),
	id   BYTEA NOT NULL CHECK (length(id) = 16),
	data BYTEA NOT NULL,
	PRIMARY KEY (coll, id)
)`,
	`INSERT INTO mtxdb_schema (version) VALUES (1) ON CONFLICT (version) DO NOTHING`,
}

// schema creates the tables (unless noCreate) and checks the recorded version.
func (s *Store) schema(ctx context.Context, noCreate bool) error {
	return checkSchema(ctx, noCreate,
		func(q string) error { _, err := s.pool.Exec(ctx, q); return err },
		func() (*int32, error) {
			var v *int32
			err := s.pool.QueryRow(ctx, `SELECT max(version) FROM mtxdb_schema`).Scan(&v)
			return v, err
		})
}

// checkSchema is schema's logic over any connection: exec runs one statement
// without parameters, version reads max(version) of mtxdb_schema (nil: no row).
func checkSchema(ctx context.Context, noCreate bool, exec func(string) error, version func() (*int32, error)) error {
	if !noCreate {
		// Two processes creating the tables at once can collide in
		// PostgreSQL's catalog (a unique violation on pg_type, or "type ...
		// already exists") even with IF NOT EXISTS; the second attempt then
		// finds them. The statements go as one string (one implicit
		// transaction of the simple query protocol).
		var err error
		for range 3 {
			if err = exec(strings.Join(createStatements, ";\n")); err == nil || !isCode(err, "23505", "42P07", "42710", "40001") {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
	}
	v, err := version()
	switch {
	case isCode(err, "42P01"): // undefined_table
		return ErrNoSchema
	case err != nil:
		return fmt.Errorf("read schema version: %w", err)
	case v == nil:
		return ErrNoSchema
	case *v > SchemaVersion:
		return fmt.Errorf("%w: version %d, this mtxdb reads up to %d", ErrSchemaVersion, *v, SchemaVersion)
	}
	if err := exec(`SELECT coll, id, data FROM mtxdb_records LIMIT 0`); err != nil {
		if isCode(err, "42P01") {
			return fmt.Errorf("%w (mtxdb_schema exists, mtxdb_records does not)", ErrNoSchema)
		}
		return fmt.Errorf("read mtxdb_records: %w", err)
	}
	return nil
}

// isCode reports whether err is a PostgreSQL error with one of the SQLSTATE
// codes: pgx's *pgconn.PgError and lib/pq's *pq.Error both have SQLState.
func isCode(err error, codes ...string) bool {
	var pe interface{ SQLState() string }
	if !errors.As(err, &pe) {
		return false
	}
	for _, c := range codes {
		if pe.SQLState() == c {
			return true
		}
	}
	return false
}

func (s *Store) live() error {
	if s.closed.Load() {
		return storage.ErrClosed
	}
	return nil
}

// Get returns the record's payload or storage.ErrNotFound.
func (s *Store) Get(coll, id storage.ID) ([]byte, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	var data []byte
	err := s.pool.QueryRow(context.Background(),
		`SELECT data FROM mtxdb_records WHERE coll = $1 AND id = $2`, coll[:], id[:]).Scan(&data)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, storage.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("pgstore: get %s/%s: %w", coll, id, err)
	}
	if data == nil {
		data = []byte{}
	}
	return data, nil
}

// GetMany returns one entry per ID in request order, nil where absent, in one
// round trip.
func (s *Store) GetMany(coll storage.ID, ids []storage.ID) ([][]byte, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	out := make([][]byte, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	keys := make([][]byte, len(ids))
	for i := range ids {
		keys[i] = ids[i][:]
	}
	rows, err := s.pool.Query(context.Background(),
		`SELECT id, data FROM mtxdb_records WHERE coll = $1 AND id = ANY($2)`, coll[:], keys)
	if err != nil {
		return nil, fmt.Errorf("pgstore: get %d records of %s: %w", len(ids), coll, err)
	}
	found := make(map[storage.ID][]byte, len(ids))
	for rows.Next() {
		var id, data []byte
		if err := rows.Scan(&id, &data); err != nil {
			rows.Close()
			return nil, fmt.Errorf("pgstore: get %d records of %s: %w", len(ids), coll, err)
		}
		if data == nil {
			data = []byte{}
		}
		found[storage.ID(id)] = data
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: get %d records of %s: %w", len(ids), coll, err)
	}
	seen := make(map[storage.ID]bool, len(found))
	for i, id := range ids {
		if d, ok := found[id]; ok {
			if seen[id] { // an ID asked twice gets its own copy
				d = append([]byte{}, d...)
			}
			seen[id] = true
			out[i] = d
		}
	}
	return out, nil
}

// Put writes one record (superseding an existing one).
func (s *Store) Put(coll, id storage.ID, data []byte) error {
	return s.PutMany(coll, []storage.Record{{ID: id, Data: data}})
}

// PutMany writes the records in one transaction (the last occurrence of an ID
// wins).
func (s *Store) PutMany(coll storage.ID, recs []storage.Record) error {
	return s.putMany(coll, recs, nil, nil)
}

// PutManyIf writes recs as PutMany does if record cond still holds old (nil:
// absent); otherwise nothing is written and the error wraps
// storage.ErrConflict. recs must hold cond's new value.
func (s *Store) PutManyIf(coll storage.ID, recs []storage.Record, cond storage.ID, old []byte) error {
	return s.putMany(coll, recs, &cond, old)
}

const upsertSQL = `
INSERT INTO mtxdb_records (coll, id, data)
SELECT $1, u.id, u.data FROM unnest($2::BYTEA[], $3::BYTEA[]) AS u(id, data)
ON CONFLICT (coll, id) DO UPDATE SET data = excluded.data
WHERE mtxdb_records.data IS DISTINCT FROM excluded.data`

func (s *Store) putMany(coll storage.ID, recs []storage.Record, cond *storage.ID, old []byte) error {
	if err := s.live(); err != nil {
		return err
	}
	// Last occurrence wins: one statement may not touch a row twice.
	last := make(map[storage.ID]int, len(recs))
	for i, r := range recs {
		last[r.ID] = i
	}
	var condData []byte
	if cond != nil {
		i, ok := last[*cond]
		if !ok {
			return fmt.Errorf("pgstore: conditional write to %s: the batch does not write the condition record %s", coll, *cond)
		}
		condData = nonNil(recs[i].Data)
	}
	if len(recs) == 0 {
		return nil
	}
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: write %d records to %s: %w", len(recs), coll, err)
	}
	defer tx.Rollback(ctx)
	if cond != nil {
		var tag pgconn.CommandTag
		if old == nil {
			tag, err = tx.Exec(ctx, `INSERT INTO mtxdb_records (coll, id, data) VALUES ($1, $2, $3) ON CONFLICT (coll, id) DO NOTHING`,
				coll[:], cond[:], condData)
		} else {
			tag, err = tx.Exec(ctx, `UPDATE mtxdb_records SET data = $3 WHERE coll = $1 AND id = $2 AND data = $4`,
				coll[:], cond[:], condData, old)
		}
		if err != nil {
			return writeErr(coll, len(recs), err)
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("%w: collection %s record %s", storage.ErrConflict, coll, *cond)
		}
	}
	skip := storage.ID{}
	if cond != nil {
		skip = *cond
	}
	if err := upsert(ctx, tx, coll, recs, last, cond != nil, skip); err != nil {
		return writeErr(coll, len(recs), err)
	}
	if err := tx.Commit(ctx); err != nil {
		return writeErr(coll, len(recs), err)
	}
	return nil
}

// upsert writes recs (those whose index is last[ID], and not skip when
// skipping) to coll in tx, in statements of at most batchRows rows and
// batchBytes payload bytes.
func upsert(ctx context.Context, tx pgx.Tx, coll storage.ID, recs []storage.Record, last map[storage.ID]int, skipping bool, skip storage.ID) error {
	ids := make([][]byte, 0, min(len(last), batchRows))
	datas := make([][]byte, 0, cap(ids))
	bytes := 0
	flush := func() error {
		if len(ids) == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, upsertSQL, coll[:], ids, datas); err != nil {
			return err
		}
		ids, datas, bytes = ids[:0], datas[:0], 0
		return nil
	}
	for i := range recs {
		r := &recs[i]
		if last[r.ID] != i || skipping && r.ID == skip {
			continue
		}
		ids = append(ids, r.ID[:])
		datas = append(datas, nonNil(r.Data))
		bytes += len(r.Data)
		if len(ids) >= batchRows || bytes >= batchBytes {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// CollectionBatch is one collection's part of PutCollections.
type CollectionBatch struct {
	Collection storage.ID
	Records    []storage.Record
}

// PutCollections writes several collections' records as one transaction: one
// commit (one WAL flush) for all of them, where PutMany per collection commits
// each. Within a collection the last occurrence of an ID wins.
func (s *Store) PutCollections(batches []CollectionBatch) error {
	if err := s.live(); err != nil {
		return err
	}
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: write %d collections: %w", len(batches), err)
	}
	defer tx.Rollback(ctx)
	for _, b := range batches {
		last := make(map[storage.ID]int, len(b.Records))
		for i, r := range b.Records {
			last[r.ID] = i
		}
		if err := upsert(ctx, tx, b.Collection, b.Records, last, false, storage.ID{}); err != nil {
			return writeErr(b.Collection, len(b.Records), err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return writeErr(storage.ID{}, 0, err)
	}
	return nil
}

// writeErr wraps a write failure; a serialization failure (SERIALIZABLE
// isolation) or deadlock is a lost race, reported as storage.ErrConflict.
func writeErr(coll storage.ID, n int, err error) error {
	if isCode(err, "40001", "40P01") {
		return fmt.Errorf("%w: collection %s: %v", storage.ErrConflict, coll, err)
	}
	if isCode(err, "25006") { // read_only_sql_transaction
		return fmt.Errorf("%w: pgstore: write to %s", storage.ErrReadOnly, coll)
	}
	return fmt.Errorf("pgstore: write %d records to %s: %w", n, coll, err)
}

// nonNil maps a nil payload to an empty one (data is NOT NULL).
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// DeleteCollection deletes every record of the collection.
func (s *Store) DeleteCollection(coll storage.ID) error {
	if err := s.live(); err != nil {
		return err
	}
	if _, err := s.pool.Exec(context.Background(), `DELETE FROM mtxdb_records WHERE coll = $1`, coll[:]); err != nil {
		return writeErr(coll, 0, err)
	}
	return nil
}

// Sync returns nil once the store is open: every write was committed before it
// returned (its durability is the server's: synchronous_commit, replicas). It
// returns the first error Collections met since the last Sync.
func (s *Store) Sync() error {
	if err := s.live(); err != nil {
		return err
	}
	s.errMu.Lock()
	defer s.errMu.Unlock()
	err := s.err
	s.err = nil
	return err
}

// RefreshCollection is a no-op: the process caches nothing of a collection.
func (s *Store) RefreshCollection(coll storage.ID) error { return s.live() }

const collectionsSQL = `
WITH RECURSIVE c(coll) AS (
	(SELECT coll FROM mtxdb_records ORDER BY coll LIMIT 1)
	UNION ALL
	SELECT (SELECT r.coll FROM mtxdb_records r WHERE r.coll > c.coll ORDER BY r.coll LIMIT 1)
	FROM c WHERE c.coll IS NOT NULL
)
SELECT coll FROM c WHERE coll IS NOT NULL`

// ListCollections returns the IDs of collections holding at least one record,
// sorted bytewise: one primary-key probe per collection.
func (s *Store) ListCollections() ([]storage.ID, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(context.Background(), collectionsSQL)
	if err != nil {
		return nil, fmt.Errorf("pgstore: list collections: %w", err)
	}
	return collectIDs(rows, "list collections")
}

func collectIDs(rows pgx.Rows, what string) ([]storage.ID, error) {
	var out []storage.ID
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			rows.Close()
			return nil, fmt.Errorf("pgstore: %s: %w", what, err)
		}
		if len(b) != len(storage.ID{}) {
			rows.Close()
			return nil, fmt.Errorf("%w: pgstore: %s: a %d-byte ID", storage.ErrCorrupt, what, len(b))
		}
		out = append(out, storage.ID(b))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: %s: %w", what, err)
	}
	return out, nil
}

// Collections is ListCollections for the StorageEngine interface, which has no
// error: on failure it returns nil and the next Sync returns the error.
func (s *Store) Collections() []storage.ID {
	ids, err := s.ListCollections()
	if err != nil {
		s.errMu.Lock()
		if s.err == nil {
			s.err = err
		}
		s.errMu.Unlock()
		return nil
	}
	return ids
}

// CollectionRecords returns the record IDs of a collection, sorted bytewise.
func (s *Store) CollectionRecords(coll storage.ID) ([]storage.ID, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(context.Background(),
		`SELECT id FROM mtxdb_records WHERE coll = $1 ORDER BY id`, coll[:])
	if err != nil {
		return nil, fmt.Errorf("pgstore: records of %s: %w", coll, err)
	}
	return collectIDs(rows, "records of "+coll.String())
}

// Repack keeps, for each collection of the plan, the records it lists and
// deletes the others, in one transaction (package doc: what repack means on a
// database). A plan listing a collection or a record twice is refused; one
// listing a record that does not exist fails with storage.ErrNotFound; in
// both cases nothing changes.
func (s *Store) Repack(plan storage.RepackPlan) (storage.RepackStats, error) {
	var st storage.RepackStats
	if err := s.live(); err != nil {
		return st, err
	}
	seen := make(map[storage.ID]bool, len(plan.Collections))
	for _, cp := range plan.Collections {
		if seen[cp.Collection] {
			return st, fmt.Errorf("pgstore: repack plan lists collection %s twice", cp.Collection)
		}
		seen[cp.Collection] = true
		ids := make(map[storage.ID]bool, len(cp.Records))
		for _, id := range cp.Records {
			if ids[id] {
				return st, fmt.Errorf("pgstore: repack plan lists record %s of collection %s twice", id, cp.Collection)
			}
			ids[id] = true
		}
	}
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return st, fmt.Errorf("pgstore: repack: %w", err)
	}
	defer tx.Rollback(ctx)
	for _, cp := range plan.Collections {
		keys := make([][]byte, len(cp.Records))
		for i := range cp.Records {
			keys[i] = cp.Records[i][:]
		}
		// Lock the listed rows; a missing one fails the plan.
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT id FROM mtxdb_records WHERE coll = $1 AND id = ANY($2) FOR UPDATE) AS k`,
			cp.Collection[:], keys).Scan(&n); err != nil {
			return st, writeErr(cp.Collection, len(keys), err)
		}
		if n != len(keys) {
			return st, fmt.Errorf("pgstore: repack: %w", &storage.RepackMissingError{Collection: cp.Collection, Missing: len(keys) - n})
		}
		tag, err := tx.Exec(ctx, `DELETE FROM mtxdb_records WHERE coll = $1 AND NOT (id = ANY($2))`, cp.Collection[:], keys)
		if err != nil {
			return st, writeErr(cp.Collection, len(keys), err)
		}
		st.CollectionsRepacked++
		st.RecordsCopied += len(keys)
		st.RecordsDropped += int(tag.RowsAffected())
	}
	if err := tx.Commit(ctx); err != nil {
		return storage.RepackStats{}, writeErr(storage.ID{}, 0, err)
	}
	return st, nil
}

// Stats is a point-in-time summary of a Store.
type Stats struct {
	Collections int   // collections with at least one record
	LiveRecords int64 // rows of mtxdb_records
	LiveBytes   int64 // sum of payload lengths
	TableBytes  int64 // pg_total_relation_size(mtxdb_records): heap, TOAST, indexes; -1 where the server has no such function
}

// Stats counts the records (a full scan: for the CLI's stats, not hot paths).
func (s *Store) Stats() (Stats, error) {
	var st Stats
	if err := s.live(); err != nil {
		return st, err
	}
	ctx := context.Background()
	if err := s.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(length(data)), 0) FROM mtxdb_records`).Scan(&st.LiveRecords, &st.LiveBytes); err != nil {
		return st, fmt.Errorf("pgstore: stats: %w", err)
	}
	colls, err := s.ListCollections()
	if err != nil {
		return st, err
	}
	st.Collections = len(colls)
	if err := s.pool.QueryRow(ctx, `SELECT pg_total_relation_size('mtxdb_records')`).Scan(&st.TableBytes); err != nil {
		st.TableBytes = -1
	}
	return st, nil
}

// Close closes the pool; later calls return storage.ErrClosed.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return storage.ErrClosed
	}
	s.pool.Close()
	return nil
}

// Ping checks the connection to the server with a query that reads no table.
func (s *Store) Ping() error {
	if err := s.live(); err != nil {
		return err
	}
	return s.pool.Ping(context.Background())
}
