package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

var (
	pkgURL    string   // the package's own database
	serverURL string   // the server's maintenance database
	cluster   *Cluster // nil when DATABASE_URL was given
)

// MainOption tunes Main.
type MainOption func(*mainOpts)

type mainOpts struct {
	noLeakCheck bool
	ignore      []goleak.Option
}

// WithoutLeakCheck turns off the goroutine leak check after the tests.
func WithoutLeakCheck() MainOption { return func(o *mainOpts) { o.noLeakCheck = true } }

// IgnoreLeak adds goleak options (each with its reason in a comment at the
// call site).
func IgnoreLeak(opts ...goleak.Option) MainOption {
	return func(o *mainOpts) { o.ignore = append(o.ignore, opts...) }
}

// Main runs a package's tests against a database of their own: a fresh
// database on DATABASE_URL's server, or on a throwaway cluster when
// DATABASE_URL is unset. It sets DATABASE_URL to that database for the
// duration (so Example functions connect like user code does), drops the
// database and stops the cluster afterwards, also on SIGINT/SIGTERM, and
// then checks for leaked goroutines. Call it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
func Main(m *testing.M, opts ...MainOption) {
	os.Exit(run(m, opts...))
}

func run(m *testing.M, opts ...MainOption) int {
	var o mainOpts
	for _, f := range opts {
		f(&o)
	}
	ctx := context.Background()
	base := os.Getenv("DATABASE_URL")
	if base == "" {
		c, err := Start(ctx, Options{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		cluster = c
		base = c.URL
	}
	stopSignals := make(chan os.Signal, 1)
	signal.Notify(stopSignals, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(stopSignals)
	go func() {
		if _, ok := <-stopSignals; ok {
			cluster.Stop()
			os.Exit(130)
		}
	}()
	defer cluster.Stop()

	dbName, err := CreateDatabase(ctx, base)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	serverURL = base
	pkgURL = WithDatabase(base, dbName)
	os.Setenv("DATABASE_URL", pkgURL)
	os.Setenv("PGLEASE_TEST_SERVER_URL", base)
	code := m.Run()
	removeTemplate()
	if err := DropDatabase(ctx, base, dbName); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	} else if err := dropRoles(ctx, base); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	if code == 0 && !o.noLeakCheck {
		if err := goleak.Find(append(o.ignore, goleak.IgnoreCurrent())...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// ClusterForTest returns the throwaway cluster Main started, or nil when the
// tests run on DATABASE_URL (fault tests that restart the server skip then).
func ClusterForTest() *Cluster { return cluster }

// URL returns the connection string of the package's database.
func URL(tb testing.TB) string {
	tb.Helper()
	if pkgURL == "" {
		tb.Fatal("pgtest: URL called outside pgtest.Main")
	}
	return pkgURL
}

// ServerURL returns the connection string of the server's maintenance
// database (for creating databases or roles).
func ServerURL(tb testing.TB) string {
	tb.Helper()
	if serverURL == "" {
		tb.Fatal("pgtest: ServerURL called outside pgtest.Main")
	}
	return serverURL
}

// RandomName returns prefix followed by 12 random hex digits: a valid,
// unquoted PostgreSQL identifier when prefix is one.
func RandomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// WithDatabase returns the connection string s with its database
// replaced by db (URL or keyword/value form).
func WithDatabase(s, db string) string {
	if u, err := url.Parse(s); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + db
		return u.String()
	}
	return s + " dbname=" + db
}

// CreateDatabase creates a fresh database with a random name on the server
// at url and returns its name.
func CreateDatabase(ctx context.Context, url string) (string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	name := RandomName("pglease_test_")
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("pgtest: create database: %w", err)
	}
	return name, nil
}

// DropDatabase drops database name on the server at url, disconnecting
// whoever is still connected.
func DropDatabase(ctx context.Context, url, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgtest: drop database: %w", err)
	}
	return nil
}

// Schema creates a fresh schema in the package's database, dropped (with
// everything in it) when the test ends, and returns its name.
func Schema(tb testing.TB) string {
	tb.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, URL(tb))
	if err != nil {
		tb.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(ctx)
	name := RandomName("t_")
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		tb.Fatalf("pgtest: create schema: %v", err)
	}
	tb.Cleanup(func() {
		conn, err := pgx.Connect(ctx, URL(tb))
		if err != nil {
			tb.Errorf("pgtest: connect: %v", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+name+" CASCADE"); err != nil {
			tb.Errorf("pgtest: drop schema: %v", err)
		}
	})
	return name
}

// Pool returns a pool on the package's database whose search_path is a
// fresh schema (see Schema), closed when the test ends. configure, if
// given, may change the pool config (e.g. add a tracer, MaxConns).
func Pool(tb testing.TB, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, string) {
	tb.Helper()
	schema := Schema(tb)
	cfg, err := pgxpool.ParseConfig(URL(tb))
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool, schema
}

// SchemaURL returns the package database's connection string with its
// search_path set to a fresh schema (see Schema), for code under test that
// opens its own pool from a URL.
func SchemaURL(tb testing.TB) string {
	tb.Helper()
	schema := Schema(tb)
	u, err := url.Parse(URL(tb))
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return URL(tb) + " search_path=" + schema
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
