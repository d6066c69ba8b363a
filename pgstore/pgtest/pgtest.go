// Package pgtest gives tests a fresh PostgreSQL database on the server `make
// test` starts (scripts/pgserver.sh). The server's URL comes from the
// environment variable MTXDB_TEST_POSTGRES; without it a test that needs
// PostgreSQL fails when CI is set (CI=true: CI must run them) and is skipped
// with a message naming the variable otherwise.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvURL names the environment variable holding the test server's URL.
const EnvURL = "MTXDB_TEST_POSTGRES"

// ServerURL returns the test server's URL, skipping or failing t as the
// package doc says when there is none.
func ServerURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(EnvURL)
	if u != "" {
		return u
	}
	msg := EnvURL + " is not set: this test needs PostgreSQL (`make test` starts one with scripts/pgserver.sh; or run `scripts/pgserver.sh start DIR` and export " + EnvURL + "=$(scripts/pgserver.sh url DIR))"
	if os.Getenv("CI") != "" {
		t.Fatal("CI: " + msg)
	}
	t.Skip(msg)
	return ""
}

// NewDatabase creates an empty database on the test server, drops it when the
// test ends, and returns its URL.
func NewDatabase(t testing.TB) string {
	t.Helper()
	admin := ServerURL(t)
	cfg, err := pgx.ParseConfig(admin)
	if err != nil {
		t.Fatalf("pgtest: %s: %v", EnvURL, err)
	}
	var b [6]byte
	rand.Read(b[:])
	name := "mtxdbtest_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: connect to the test server (%s): %v", EnvURL, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return withDatabase(t, admin, name)
}

// withDatabase returns the server's URL with another database name.
func withDatabase(t testing.TB, admin, db string) string {
	u, err := url.Parse(admin)
	if err != nil || u.Scheme == "" {
		t.Fatalf("pgtest: %s must be a postgres:// URL: %v", EnvURL, err)
	}
	u.Path = "/" + db
	return u.String()
}
