// Package exampledb gives an example program a schema of its own on the
// database it is pointed at, so that running an example against your own
// DATABASE_URL leaves nothing behind: every table the example (and
// pglease's SetupSchema) creates goes into that schema, which is dropped
// with everything in it when the example ends.
package exampledb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

var validPrefix = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,40}$`)

// Schema creates a fresh schema named prefix + "_" + 8 random hex digits
// on the database at databaseURL and returns a connection string whose
// search_path is that schema (pass it to everything the example starts,
// other processes included), the schema's name, and drop, which drops the
// schema and everything in it.
func Schema(ctx context.Context, databaseURL, prefix string) (schemaURL, name string, drop func(context.Context) error, err error) {
	if databaseURL == "" {
		return "", "", nil, errors.New("DATABASE_URL is not set")
	}
	if !validPrefix.MatchString(prefix) {
		return "", "", nil, errors.New("exampledb: bad schema prefix")
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", nil, err
	}
	name = prefix + "_" + hex.EncodeToString(b[:])
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return "", "", nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		return "", "", nil, err
	}
	drop = func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, databaseURL)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		_, err = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+name+" CASCADE")
		return err
	}
	return WithSearchPath(databaseURL, name), name, drop, nil
}

// WithSearchPath returns the connection string s (URL or keyword/value
// form) with its search_path set to schema.
func WithSearchPath(s, schema string) string {
	if u, err := url.Parse(s); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return strings.TrimSpace(s) + " search_path=" + schema
}

// Run runs fn with the connection string of a fresh schema (see Schema)
// and drops the schema afterwards, also when fn fails or ctx ends.
func Run(ctx context.Context, databaseURL, prefix string, fn func(schemaURL string) error) error {
	schemaURL, _, drop, err := Schema(ctx, databaseURL, prefix)
	if err != nil {
		return err
	}
	err = fn(schemaURL)
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return errors.Join(err, drop(dctx))
}
