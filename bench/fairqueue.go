package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/manager"
)

// The fairness scenario's "queue" implementation: the fair queue's store
// calls (internal/store/queue.go) driven directly, without a Manager, as
// the Manager's acquire pipeline will drive them: one QueueWait per
// attempt (the ticket's lockId kept for the whole wait), the process's
// own queue channel LISTENed on one connection and its turns routed to the
// waiting caller, an attempt again every fairTicketLife/3 (which
// refreshes the ticket) or on a turn, QueueRelease serving the head,
// QueueLeave on a timeout. It measures the SQL layer's fairness and
// notification cost before the wiring.
const fairTicketLife = 3 * time.Second

// fairQueue is one worker process's queue client.
type fairQueue struct {
	s     *store.Store
	ch    string
	mu    sync.Mutex
	turns map[string]chan store.Turn
	notes atomic.Int64
	// retries counts attempts made because a wait slice (life/3) ended
	// without a turn: the ticket's refresh, and the only way a turn that
	// no release served (or a lost notification) is found.
	retries atomic.Int64
	stop    func()
}

func newFairQueue(ctx context.Context, pool *pgxpool.Pool) (*fairQueue, error) {
	s, err := store.New("bench", pool, store.Config{NotifyChannel: manager.DefaultNotifyChannel})
	if err != nil {
		return nil, err
	}
	q := &fairQueue{s: s, ch: store.QueueChannel(), turns: map[string]chan store.Turn{}}
	lctx, cancel := context.WithCancel(context.Background())
	conn, err := pool.Acquire(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+q.ch); err != nil {
		cancel()
		conn.Release()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.Conn().WaitForNotification(lctx)
			if err != nil {
				return
			}
			q.notes.Add(1)
			tr, ok := store.ParseTurn(n.Payload)
			if !ok {
				continue
			}
			q.mu.Lock()
			c := q.turns[tr.LockHash]
			q.mu.Unlock()
			if c != nil {
				select {
				case c <- tr:
				default:
				}
			}
		}
	}()
	q.stop = func() {
		cancel()
		<-done
		conn.Conn().Close(context.Background()) // LISTEN state: not back to the pool
		conn.Release()
	}
	return q, nil
}

// expect routes the turns of ids to one channel until the returned func.
func (q *fairQueue) expect(ids []string) (chan store.Turn, func()) {
	c := make(chan store.Turn, len(ids)+1)
	q.mu.Lock()
	for _, id := range ids {
		q.turns[pglease.HashKey(id)] = c
	}
	q.mu.Unlock()
	return c, func() {
		q.mu.Lock()
		for _, id := range ids {
			delete(q.turns, pglease.HashKey(id))
		}
		q.mu.Unlock()
	}
}

// acquire waits (at most fairWait) for reqs (one key, or one set: the
// items' LockIDs are set here) through the queue, and returns the release.
func (q *fairQueue) acquire(ctx context.Context, reqs []store.WaitRequest) (func() error, error) {
	ids := make([]string, len(reqs))
	rel := make([]store.ReleaseRequest, len(reqs))
	for i := range reqs {
		ids[i] = keys.NewLockID()
		reqs[i].LockID = ids[i]
		rel[i] = store.ReleaseRequest{LockID: ids[i], Key: reqs[i].Key}
	}
	release := func() error {
		_, err := q.s.QueueRelease(context.Background(), rel, true, "")
		return err
	}
	turns, done := q.expect(ids)
	defer done()
	deadline := time.Now().Add(fairWait)
	for {
		res, err := q.s.QueueWait(ctx, reqs, q.ch, fairTicketLife)
		if err != nil {
			return nil, err
		}
		ok := true
		for _, r := range res {
			if r.Err != nil {
				return nil, r.Err
			}
			ok = ok && r.OK
		}
		if ok {
			return release, nil
		}
		wait := min(fairTicketLife/3, time.Until(deadline))
		if wait <= 0 {
			// A grant that came meanwhile is released by the leave.
			if _, err := q.s.QueueLeave(context.Background(), ids); err != nil {
				return nil, err
			}
			return nil, pgerr.New(pglease.CodeAcquisitionTimeout, "bench.queue", "gave up after the wait", nil)
		}
		t := time.NewTimer(wait)
		select {
		case tr := <-turns:
			if tr.Granted && len(reqs) == 1 {
				t.Stop()
				return release, nil
			}
		case <-t.C:
			q.retries.Add(1)
		case <-ctx.Done():
			t.Stop()
			_, _ = q.s.QueueLeave(context.Background(), ids)
			return nil, ctx.Err()
		}
		t.Stop()
	}
}

// fairQueueCycles builds the queue implementation's cycle of each caller.
func fairQueueCycles(q *fairQueue, spec fairSpec, sts []fairCaller, setProc bool) []func(context.Context) (func() error, error) {
	cycles := make([]func(context.Context) (func() error, error), len(sts))
	for w := range sts {
		req := store.WaitRequest{Key: fairKey, TTL: 30 * time.Second}
		switch spec.Kind {
		case "semaphore":
			req.Shared, req.Limit = true, spec.Limit
		case "rwlock":
			sts[w].Writer = w%2 == 0
			req.Shared = !sts[w].Writer
		case "set":
			if setProc {
				sts[w].Set = true
				cycles[w] = func(ctx context.Context) (func() error, error) {
					var reqs []store.WaitRequest
					for _, k := range fairSetKeyNames() {
						reqs = append(reqs, store.WaitRequest{Key: k, TTL: 30 * time.Second, Set: 1})
					}
					return q.acquire(ctx, reqs)
				}
				continue
			}
			req.Key = fairSetKeyNames()[w]
		}
		cycles[w] = func(ctx context.Context) (func() error, error) {
			return q.acquire(ctx, []store.WaitRequest{req})
		}
	}
	return cycles
}
