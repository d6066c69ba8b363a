package pgstore

import (
	"context"
)

// SetVersion records a schema version (for TestSchema's newer-schema case).
func SetVersion(s *Store, v int) error {
	_, err := s.pool.Exec(context.Background(), `INSERT INTO mtxdb_schema (version) VALUES ($1)`, v)
	return err
}
