package manager

import (
	"context"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/pg"
)

// Config returns the Manager's configuration as it runs: the Config
// given to New or Open with its defaults filled in (TTL,
// StatementTimeout, CloseTimeout, MaxBatch, MaxInFlight, NotifyChannel),
// and Holder the identity its leases record (by default
// "program[pid]@host"). Code built on a Manager reads its settings here,
// e.g. the TTL its leases get without WithTTL (package election does).
func (m *Manager) Config() Config {
	c := m.cfg
	c.Holder = m.k.Store.Holder()
	return c
}

// Lookup returns the state of key's exclusive lease, or nil, nil when
// there is none or it is not live, as pg.Store.Lookup: its fence, the
// holder identity its Manager recorded and its expiry, with hashes
// instead of the key and lockId. It reads the lease table once, on the
// Manager's pool, bounded by Config.StatementTimeout; it neither waits
// for nor changes the lease. Diagnostic: by the time you act on it the
// answer may be stale (Watch reports the changes; the fence protects
// data). Bad input is CodeInvalidArgument before any I/O; a closed
// Manager answers CodeClosed.
func (m *Manager) Lookup(ctx context.Context, key string) (*pg.LockInfo, error) {
	const op = "manager.Lookup"
	nk, err := m.k.CheckKeyCall(op, ctx, key)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithTimeoutCause(ctx, m.cfg.StatementTimeout, pgerr.ErrStatementTimeout)
	defer cancel()
	r, err := m.k.Store.LookupByKey(lctx, nk)
	if err != nil {
		return nil, kernel.Reop(op, err)
	}
	if r == nil {
		return nil, nil
	}
	i := pg.LockInfo(*r)
	return &i, nil
}
