package store_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
)

// isDeadlock reports whether err carries SQLSTATE 40P01.
func isDeadlock(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "40P01"
	}
	return err != nil && strings.Contains(err.Error(), "40P01")
}

// A writer's check and a batched release of readers lock a key's shared
// rows in one order (by lockId), so they cannot deadlock. Set up so that
// the two orders differ when the check locks in storage order: the
// reader inserted first has the larger lockId. A third session holds the
// larger one FOR KEY SHARE (as a snapshot does), so the release locks the
// smaller and waits; the writer's check then starts. In storage order it
// would lock the larger row first (FOR SHARE does not conflict with KEY
// SHARE), then wait for the smaller one the release holds; when the third
// session ends the release waits for the writer: 40P01. In lockId order
// the check waits for the release and both finish.
func TestSharedRowsOneLockOrder(t *testing.T) {
	t.Parallel()
	pool, rs := pgtest.RuntimePool(t)
	relPool := rs.RuntimePool(t, appName("rwdl_release"))
	wrPool := rs.RuntimePool(t, appName("rwdl_writer"))
	mk := func(db store.DB) *store.Store {
		s, err := store.New("pg.New", db, store.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s, rel, wr := mk(pool), mk(relPool), mk(wrPool)
	c := ctx(t)
	key := pgtest.RandomName("rwdl_")
	big, small := strings.Repeat("B", 22), strings.Repeat("A", 22)
	for _, id := range []string{big, small} {
		res, err := s.AcquireSharedMany(c, []store.SharedRequest{{Key: key, TTL: time.Minute, LockID: id}})
		if err != nil || !res[0].OK {
			t.Fatalf("reader: %+v, %v", res, err)
		}
	}
	blocker, err := pool.Begin(c)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback(context.Background()) }()
	if _, err := blocker.Exec(c, "SELECT 1 FROM syncguard_locks_shared WHERE lock_id = $1 FOR KEY SHARE", big); err != nil {
		t.Fatal(err)
	}
	relErr := make(chan error, 1)
	go func() {
		ok, err := rel.ReleaseMany(c, []string{big, small})
		if err == nil && (!ok[0] || !ok[1]) {
			err = errors.New("release answered not held")
		}
		relErr <- err
	}()
	waitLockWait(t, pool, "rwdl_release")
	wrErr, answered := make(chan error, 1), make(chan struct{})
	go func() {
		_, err := wr.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
		wrErr <- err
		close(answered)
	}()
	// The writer's wait is bounded (100 ms): on a loaded machine it may
	// answer before its wait is seen.
	waitLockWaitOr(t, pool, "rwdl_writer", answered)
	if err := blocker.Rollback(c); err != nil {
		t.Fatal(err)
	}
	if err := <-relErr; err != nil {
		t.Errorf("release: %v (deadlock: %t)", err, isDeadlock(err))
	}
	if err := <-wrErr; err != nil {
		t.Errorf("writer acquire: %v (deadlock: %t)", err, isDeadlock(err))
	}
}

// Many connections hammer one reader-writer key: readers take batches of
// holds and release each batch in one statement, writers try the key
// exclusively (checking, and locking, every shared row) and release it.
// No statement may fail, in particular none with a deadlock (40P01).
func TestHotReaderWriterKeyNoDeadlock(t *testing.T) {
	t.Parallel()
	s, _, _ := newStore(t, store.Config{}, maxConns(24))
	c, cancel := context.WithTimeout(ctx(t), 25*time.Second)
	defer cancel()
	key := pgtest.RandomName("rwhot_")
	stop := time.Now().Add(3 * time.Second)
	var deadlocks, readerGrants, writerGrants atomic.Int64
	var mu sync.Mutex
	var firstErr error
	fail := func(err error) {
		if isDeadlock(err) {
			deadlocks.Add(1)
		}
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := make([]store.SharedRequest, 6)
			for i := range reqs {
				reqs[i] = store.SharedRequest{Key: key, TTL: time.Minute}
			}
			for time.Now().Before(stop) {
				res, err := s.AcquireSharedMany(c, reqs)
				if err != nil {
					fail(err)
					continue
				}
				var ids []string
				for _, r := range res {
					if r.OK {
						ids = append(ids, r.LockID)
					}
				}
				if len(ids) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				readerGrants.Add(int64(len(ids)))
				if _, err := s.ReleaseMany(c, ids); err != nil {
					fail(err)
				}
			}
		}()
	}
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				r, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
				if err != nil {
					fail(err)
					continue
				}
				if !r.OK {
					continue
				}
				writerGrants.Add(1)
				if _, err := s.Release(c, r.LockID); err != nil {
					fail(err)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("reader holds %d, writer grants %d, deadlocks %d", readerGrants.Load(), writerGrants.Load(), deadlocks.Load())
	if firstErr != nil {
		t.Fatalf("%d deadlocks; first error: %v", deadlocks.Load(), firstErr)
	}
	if readerGrants.Load() == 0 || writerGrants.Load() == 0 {
		t.Fatalf("the key was not contended both ways: %d reader holds, %d writer grants", readerGrants.Load(), writerGrants.Load())
	}
}
