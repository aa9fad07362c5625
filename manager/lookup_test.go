package manager

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg"
)

// TestConfigAsRun: Config returns the configuration with its defaults
// filled in and the holder identity the Manager's leases record.
func TestConfigAsRun(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{cfg: Config{TTL: 7 * time.Second, LossMargin: time.Second}})
	c := b.m.Config()
	if c.TTL != 7*time.Second || c.LossMargin != time.Second || c.StatementTimeout != kernel.DefaultStatementTimeout ||
		c.NotifyChannel != DefaultNotifyChannel || c.Holder != store.DefaultHolder() {
		t.Fatalf("Config() = TTL %v, LossMargin %v, StatementTimeout %v, NotifyChannel %q, Holder %q",
			c.TTL, c.LossMargin, c.StatementTimeout, c.NotifyChannel, c.Holder)
	}
	peer, _ := b.newPeer(t, Config{Config: pg.Config{Holder: "peer-1"}})
	if h := peer.Config().Holder; h != "peer-1" {
		t.Fatalf("Config().Holder = %q, want the configured peer-1", h)
	}
}

// TestLookup: Lookup reads a key's live lease (fence, holder, expiry;
// hashes, not the key or lockId), nil when there is none; bad input is
// InvalidArgument and a closed Manager answers Closed, both before any
// I/O.
func TestLookup(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	peer, _ := b.newPeer(t, Config{Config: pg.Config{Holder: "peer-1"}})
	if info, err := b.m.Lookup(ctx, "lookup:k"); info != nil || err != nil {
		t.Fatalf("Lookup of a free key = %v, %v; want nil, nil", info, err)
	}
	lk, err := peer.Acquire(ctx, "lookup:k")
	if err != nil {
		t.Fatal(err)
	}
	info, err := b.m.Lookup(ctx, "lookup:k")
	if err != nil || info == nil {
		t.Fatalf("Lookup of a held key = %v, %v", info, err)
	}
	if info.Holder != "peer-1" || info.Fence != lk.Fence() || info.KeyHash != pglease.HashKey("lookup:k") ||
		!info.ExpiresAt.After(info.AcquiredAt) || strings.Contains(info.String(), "lookup:k") {
		t.Fatalf("Lookup = %v; want peer-1's lease of fence %v, by hashes", info, lk.Fence())
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err := b.m.Lookup(ctx, "lookup:k"); info != nil || err != nil {
		t.Fatalf("Lookup after the release = %v, %v; want nil, nil", info, err)
	}
	if _, err := b.m.Lookup(ctx, ""); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatalf("Lookup of an empty key = %v", err)
	}
	var nilCtx context.Context
	if _, err := b.m.Lookup(nilCtx, "lookup:k"); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatalf("Lookup with a nil context = %v", err)
	}
	if err := peer.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Lookup(ctx, "lookup:k"); !errors.Is(err, pglease.ErrClosed) {
		t.Fatalf("Lookup on a closed Manager = %v", err)
	}
}
