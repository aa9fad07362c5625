package manager

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// Close stops the Manager, in this order: new calls fail with ErrClosed;
// every waiting Acquire fails with ErrClosed; every held lock's Context
// is cancelled with cause ErrClosed; all held locks, and the rows kept for
// lost locks whose holders never called Release, are released in one
// round trip (detached from ctx, bounded by Config.CloseTimeout), and so is
// whatever an acquire batch still in flight grants (such a batch is let
// finish, bounded by Config.StatementTimeout, so its outcome is known); the
// listener and every database goroutine are stopped; the pool is closed
// if the Manager opened it (Open). No goroutine outlives a completed
// Close. (A pool connection that broke under a statement is cleaned up by
// pgx in a goroutine of the pool's, which pool.Close waits for: bounded
// by the connect timeout + 2 s on a pool configured by pg.ConfigurePool,
// as Open's is, and by pgx's 15 s on another.)
//
// ctx bounds only how long Close waits: if it ends first, Close returns
// CodeAborted and the shutdown goes on in the background (Done is closed
// when it has finished). Close is idempotent and safe to call
// concurrently; every call waits for the same shutdown.
//
// Close reports on the locks callers hold: it returns the first failure
// to release a lock handed to a caller and not released by it (held at
// Close, lost with its row kept, or whose Release had an unknown outcome
// still being retried), after retrying it until CloseTimeout; such a
// lock expires by itself at the end of its TTL. The clean-up of lockIds
// no caller ever got (an acquire whose answer was lost, a grant taken
// back from a caller who left) is best effort: each is sent once more,
// never retried, and never the error Close returns. So with the database
// down and no lock held, Close takes about one failed round trip; with
// locks held it takes up to CloseTimeout (5 s by default), on purpose: a
// release that gets through, say after a failover of a few seconds,
// spares every other process a wait of up to the lease's TTL + 1 s for
// the key, which a shutdown that gave up at once would impose. A service
// whose shutdown must be quicker sets CloseTimeout lower; its leases then
// expire by themselves at the end of their TTL.
func (m *Manager) Close(ctx context.Context) error {
	const op = "manager.Close"
	if ctx == nil {
		return invalid(op, "nil context")
	}
	m.closeOnce.Do(func() { close(m.closing) })
	select {
	case <-m.done:
		return m.closeErr
	case <-ctx.Done():
		return pgerr.New(pglease.CodeAborted, op, "context ended before the shutdown finished", ctx.Err())
	}
}

// beginDrain is run's first step of shutdown (steps 2–4 of Close).
func (st *loopState) beginDrain() {
	st.closing = true
	st.closeBy = st.m.now().Add(st.m.cfg.CloseTimeout)
	st.m.cancelWork() // in-flight extends are moot now; acquires finish (see sendAttempts)
	st.m.adv.beginClose(st.m.cfg.CloseTimeout)
	st.lis.Stop()
	st.closeWatches()
	for _, ks := range st.keys {
		st.failAll(ks, closedErr("manager.Acquire"))
	}
	for _, w := range st.sets {
		st.answerSet(w, acquireReply{err: closedErr("manager.AcquireAll")})
	}
	for h := range st.held {
		st.dropHolding(h, closedCause)
		rel, sc := startRelease(h, trace.SpanContext{})
		st.releases.add(releaseItem{lockID: h.lock.id, key: h.ks.key, rel: rel, sc: sc, ttl: h.lock.ttl, handed: true})
	}
	// Lost locks whose rows were kept for their holders: Close releases
	// them like the held ones (their holders were told long ago).
	now := st.m.now()
	for h := range st.kept {
		delete(st.kept, h)
		if now.Before(st.keptUntil(h)) {
			st.releaseKept(h, nil)
		}
	}
	st.leaveStrays() // fair.go
	// Releases waiting for their retry go out now, once more (relretry.go).
	st.releases.pending = append(st.releases.pending, st.relRetries...)
	clear(st.relRetries)
	st.relRetries = st.relRetries[:0]
	st.extends.pending = nil
	st.hbNext = time.Time{}
}

// drained reports whether nothing is pending or in flight any more.
func (st *loopState) drained() bool {
	return st.inFlight() == 0 && st.pendingItems() == 0 && len(st.relRetries) == 0 && !st.lis.Running() && !st.fq.refreshing
}

// finish is the last step of the drain: close an owned pool and record the
// outcome for Close. run closes done right after.
func (st *loopState) finish() {
	st.loss.close()
	st.m.adv.wait() // the advisory session is closed before an owned pool
	st.m.closeErr = st.closeErr
	st.m.rec.Close() // unregisters the loop's metric callbacks
	if st.m.ownsPool {
		st.m.pool.Close()
	}
}
