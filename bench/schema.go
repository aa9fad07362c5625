package main

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

func sortedKeys(m map[string]float64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// serverInfo describes the server for the table header.
func serverInfo(ctx context.Context, url string) (string, error) {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", err
	}
	defer c.Close(ctx)
	var v, sc, fsync string
	if err := c.QueryRow(ctx, "SELECT version(), current_setting('synchronous_commit'), current_setting('fsync')").Scan(&v, &sc, &fsync); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s; synchronous_commit=%s fsync=%s", v, sc, fsync), nil
}

// newSchemaName returns a fresh schema name.
func newSchemaName() string { return fmt.Sprintf("pglease_bench_%d", time.Now().UnixNano()) }

// benchSchema creates a fresh schema holding SyncGuard's tables and
// pglease's server functions (migrate.Migrator.Up, default table names)
// and returns a pool of maxConns connections whose search_path points at
// it, the schema name, and a cleanup func that closes the pool and drops
// the schema.
func benchSchema(ctx context.Context, url string, maxConns int, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, string, func(), error) {
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, "", nil, err
	}
	defer admin.Close(ctx)
	schema := newSchemaName()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return nil, "", nil, err
	}
	drop := func() {
		c, err := pgx.Connect(context.Background(), url)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	}
	pool, err := newPool(ctx, url, schema, maxConns, configure...)
	if err != nil {
		drop()
		return nil, "", nil, err
	}
	mg, err := migrate.New(pool, pg.Config{})
	if err == nil {
		err = mg.Up(ctx)
	}
	if err != nil {
		pool.Close()
		drop()
		return nil, "", nil, err
	}
	return pool, schema, func() { pool.Close(); drop() }, nil
}
