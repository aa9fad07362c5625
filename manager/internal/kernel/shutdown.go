package kernel

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// Close is Manager.Close: it starts the shutdown and waits for it.
func (m *Kernel) Close(ctx context.Context) error {
	const op = "manager.Close"
	if ctx == nil {
		return Invalid(op, "nil context")
	}
	m.closeOnce.Do(func() { close(m.Closing) })
	select {
	case <-m.Done:
		return m.closeErr
	case <-ctx.Done():
		return pgerr.New(pglease.CodeAborted, op, "context ended before the shutdown finished", ctx.Err())
	}
}

// beginDrain is run's first step of shutdown (steps 2–4 of Close).
func (st *LoopState) beginDrain() {
	st.closing = true
	st.closeBy = st.m.Now().Add(st.m.cfg.CloseTimeout)
	st.m.cancelWork() // in-flight extends are moot now; acquires finish (see sendAttempts)
	if st.m.AdvClose != nil {
		st.m.AdvClose(st.m.cfg.CloseTimeout)
	}
	st.lis.Stop()
	st.closeWatches()
	for _, ks := range st.keys {
		st.failAll(ks, ClosedErr("manager.Acquire"))
	}
	for _, w := range st.sets {
		st.answerSet(w, AcquireReply{Err: ClosedErr("manager.AcquireAll")})
	}
	for h := range st.held {
		st.dropHolding(h, ClosedCause)
		rel, sc := startRelease(h, trace.SpanContext{})
		st.releases.add(releaseItem{lockID: h.lock.ID, key: h.ks.Key, rel: rel, sc: sc, ttl: h.lock.TTL, handed: true})
	}
	// Lost locks whose rows were kept for their holders: Close releases
	// them like the held ones (their holders were told long ago).
	now := st.m.Now()
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
func (st *LoopState) drained() bool {
	return st.inFlight() == 0 && st.pendingItems() == 0 && len(st.relRetries) == 0 && !st.lis.Running() && !st.fq.refreshing
}

// finish is the last step of the drain: close an owned pool and record the
// outcome for Close. run closes done right after.
func (st *LoopState) finish() {
	st.loss.Close()
	if st.m.AdvWait != nil {
		st.m.AdvWait() // the advisory session is closed before an owned pool
	}
	st.m.closeErr = st.closeErr
	st.m.Rec.Close() // unregisters the loop's metric callbacks
	if st.m.ownsPool {
		st.m.Pool.Close()
	}
}
