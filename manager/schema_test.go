package manager

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// A Manager on a database without the schema it needs fails its first
// acquire with an error that says how to migrate, works once SetupSchema
// ran, and records its Holder on its leases.
func TestManagerChecksSchemaAndRecordsHolder(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Pool(t)
	ctx := ctxT(t)
	m, err := New(pool, Config{Config: pg.Config{Holder: "scheduler on host-7"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := m.Close(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	_, err = m.Acquire(ctx, "k", WithAcquireTimeout(waitTimeout()))
	var se *migrate.SchemaError
	if !errors.As(err, &se) || se.Found != 0 || !strings.Contains(err.Error(), "pglease migrate") {
		t.Fatalf("Acquire without the schema = %v, want a *migrate.SchemaError saying how to migrate", err)
	}
	if _, ok, err := m.TryAcquire(ctx, "k"); ok || !errors.As(err, &se) {
		t.Fatalf("TryAcquire without the schema = %v, %v", ok, err)
	}
	if err := m.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	lk, err := m.Acquire(ctx, "k", WithAcquireTimeout(waitTimeout()))
	if err != nil {
		t.Fatal(err)
	}
	s, err := pg.New(pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Lookup(ctx, "k")
	if err != nil || info == nil || info.Holder != "scheduler on host-7" {
		t.Fatalf("Lookup = %v, %v", info, err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := New(pool, Config{Config: pg.Config{Holder: "bad\x00holder"}}); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatalf("New with a bad Holder = %v", err)
	}
}

// Config embeds pg.Config: its OnFenceWarning reaches the Manager's store,
// called with the key's hash for a grant above the warning level.
func TestConfigOnFenceWarning(t *testing.T) {
	t.Parallel()
	type warn struct {
		hash  string
		fence pglease.Fence
	}
	warns := make(chan warn, 4)
	b := setup(t, setupOpts{cfg: Config{Config: pg.Config{OnFenceWarning: func(h string, f pglease.Fence) { warns <- warn{h, f} }}}})
	ctx := ctxT(t)
	if _, err := b.admin.Exec(ctx, `INSERT INTO `+b.schema+`.syncguard_fence_counters (fence_key, fence, key_debug) VALUES ('fence:warm', $1, 'warm')`,
		int64(keys.FenceWarn)); err != nil {
		t.Fatal(err)
	}
	lk, err := b.m.Acquire(ctx, "warm")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	if lk.Fence() != keys.FenceWarn+1 {
		t.Fatalf("fence = %d, want %d", lk.Fence(), keys.FenceWarn+1)
	}
	select {
	case w := <-warns:
		if w != (warn{pglease.HashKey("warm"), keys.FenceWarn + 1}) {
			t.Fatalf("OnFenceWarning(%q, %d), want the key's hash and fence %d", w.hash, w.fence, keys.FenceWarn+1)
		}
	default:
		t.Fatal("OnFenceWarning was not called")
	}
	cold, err := b.m.Acquire(ctx, "cold")
	if err != nil {
		t.Fatal(err)
	}
	defer cold.Release(ctx)
	select {
	case w := <-warns:
		t.Fatalf("OnFenceWarning(%q, %d) for a fence below the warning level", w.hash, w.fence)
	default:
	}
}
