package pg_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pg"
)

// TestAcquireAmbiguousGivesLockID: the context of an acquire ends while
// the acquire waits on the server, so its outcome is unknown: pgx
// abandons the connection, and the server still runs the statement once
// the wait ends, which commits it or not (it does most of the time here:
// whether the server still reads the end of the statement's messages
// from the closed connection is a race). Acquire answers CodeAmbiguous,
// never success, and its result carries the lockId the grant gets:
// Release by that lockId removes the grant when it committed, and finds
// nothing when it did not. The error text does not show the lockId.
func TestAcquireAmbiguousGivesLockID(t *testing.T) {
	t.Parallel()
	other, pool, schema := newStore(t, pg.Config{}, maxConns(2))
	c := ctx(t)
	cfg := pool.Config().ConnConfig.Copy() // the runtime role, like pool's
	cfg.RuntimeParams["search_path"] = schema
	conn, err := pgx.ConnectConfig(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	s, err := pg.New(conn, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// A first acquire checks the schema and prepares the statement, so
	// that the acquire below is one statement, sent whole before it waits.
	warm, err := s.Acquire(c, "amb-warm", time.Minute)
	if err != nil || !warm.OK {
		t.Fatal(warm, err)
	}

	tx, err := pool.Begin(c)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck
	if _, err := tx.Exec(c, "SELECT pg_advisory_xact_lock(hashtext('amb'))"); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		r   pg.AcquireResult
		err error
	}
	done := make(chan answer, 1)
	actx, cancel := context.WithCancel(c)
	defer cancel()
	go func() {
		r, err := s.Acquire(actx, "amb", time.Minute)
		done <- answer{r, err}
	}()
	waitForLockWait(t, c, pool, "advisory")
	cancel()
	a := <-done
	if a.err == nil || a.r.OK || pglease.CodeOf(a.err) != pglease.CodeAmbiguous || !errors.Is(a.err, context.Canceled) {
		t.Fatalf("acquire whose context ended while it waited: %+v, %v; want Ambiguous", a.r, a.err)
	}
	if len(a.r.LockID) != 22 {
		t.Fatalf("the ambiguous result has no lockId to release (%d bytes)", len(a.r.LockID))
	}
	if strings.Contains(a.err.Error(), a.r.LockID) {
		t.Fatal("error echoes the lockId")
	}
	// The orphaned statement proceeds once the wait ends.
	if err := tx.Rollback(c); err != nil {
		t.Fatal(err)
	}
	for running := 1; running > 0; {
		if err := pool.QueryRow(c, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND state = 'active' AND query LIKE 'SELECT o_idx, o_status%'`).Scan(&running); err != nil {
			t.Fatal(err)
		}
		select {
		case <-c.Done():
			t.Fatal("the orphaned acquire never ended")
		case <-time.After(10 * time.Millisecond):
		}
	}
	committed, err := other.IsLocked(c, "amb")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the orphaned acquire committed: %v", committed)
	if ok, err := other.Release(c, a.r.LockID); err != nil || ok != committed {
		t.Fatalf("Release(the ambiguous result's LockID) = %v, %v; want %v (the grant committed: %v)", ok, err, committed, committed)
	}
	if locked, err := other.IsLocked(c, "amb"); err != nil || locked {
		t.Fatalf("IsLocked after the release = %v, %v", locked, err)
	}
}

// waitForLockWait returns once some session of the database waits for a
// lock of the given wait event (advisory, tuple, …).
func waitForLockWait(t *testing.T, c context.Context, db testDB, event string) {
	t.Helper()
	for {
		var n int
		if err := db.QueryRow(c, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = $1
			AND datname = current_database()`, event).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		select {
		case <-c.Done():
			t.Fatal("nobody waited")
		case <-time.After(5 * time.Millisecond):
		}
	}
}
