package pg_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pg"
)

func TestConfigurePool(t *testing.T) {
	if err := pg.ConfigurePool(nil); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatalf("nil config: %v, want InvalidArgument", err)
	}
	if err := pg.ConfigurePool(&pgxpool.Config{}); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatalf("config without ConnConfig: %v, want InvalidArgument", err)
	}

	cfg, err := pgxpool.ParseConfig("postgres://u@127.0.0.1:1/db")
	if err != nil {
		t.Fatal(err)
	}
	var prevRan bool
	cfg.BeforeClose = func(*pgx.Conn) { prevRan = true }
	if err := pg.ConfigurePool(cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.ConnConfig.ConnectTimeout != 2*time.Second {
		t.Errorf("connect timeout %v, want 2s", cfg.ConnConfig.ConnectTimeout)
	}
	if cfg.BeforeClose == nil {
		t.Fatal("no BeforeClose")
	}
	// The caller's hook still runs, on a healthy connection and on a
	// closed one (whose socket the hook closes again, harmlessly).
	conn, err := pgx.Connect(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.BeforeClose(conn)
	if !prevRan || conn.IsClosed() {
		t.Fatalf("healthy connection: caller's hook ran %v, closed %v; want true, false", prevRan, conn.IsClosed())
	}
	if err := conn.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	prevRan = false
	cfg.BeforeClose(conn)
	if !prevRan {
		t.Fatal("closed connection: caller's hook did not run")
	}

	// connect_timeout in the string is kept.
	cfg, err = pgxpool.ParseConfig("postgres://u@127.0.0.1:1/db?connect_timeout=7")
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.ConfigurePool(cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.ConnConfig.ConnectTimeout != 7*time.Second {
		t.Errorf("connect timeout %v, want the string's 7s", cfg.ConnConfig.ConnectTimeout)
	}
}

func TestNewPoolBadInput(t *testing.T) {
	//lint:ignore SA1012 a nil Context is the bad input under test
	if _, err := pg.NewPool(nil, "postgres://u@127.0.0.1:1/db"); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("nil ctx: %v, want InvalidArgument", err)
	}
	_, err := pg.NewPool(context.Background(), "postgres://u:secret@127.0.0.1:1/db?pool_max_conns=zero")
	if !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatalf("bad string: %v, want InvalidArgument", err)
	}
	if s := err.Error(); strings.Contains(s, "secret") {
		t.Errorf("error quotes the password: %s", s)
	}
}
