package store_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
)

// Server errors are mapped by SQLSTATE and never echo a lockId.
func TestErrorMapping(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.Pool(t)
	c := ctx(t)
	// No schema: the function is missing (42883) → InvalidArgument.
	missing, err := store.New("pg.New", pool, store.Config{LockTable: "nope_locks", FenceTable: "nope_fences"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := missing.Acquire(c, store.AcquireRequest{Key: "k", TTL: time.Second}); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("Acquire without schema: %v", err)
	}
	if _, err := missing.IsLocked(c, "k"); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("IsLocked on a missing table: %v", err)
	}
	// A schema-qualified name in a schema that does not exist.
	noSchema, _ := store.New("pg.New", pool, store.Config{LockTable: "no_such_schema.locks"})
	if err := setupSchema(noSchema, c); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("SetupSchema in a missing schema: %v", err)
	}

	s, err := store.New("pg.New", pool, store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := setupSchema(s, c); err != nil {
		t.Fatal(err)
	}
	// Unique violation on lock_id (a pre-generated id reused on another
	// key): Internal, Detail (which holds the lockId) dropped.
	id := keys.NewLockID()
	if r, err := s.AcquireMany(c, []store.AcquireRequest{{Key: "u1", TTL: time.Minute, LockID: id}}); err != nil || !r[0].OK {
		t.Fatal(r, err)
	}
	_, err = s.AcquireMany(c, []store.AcquireRequest{{Key: "u2", TTL: time.Minute, LockID: id}})
	if !errors.Is(err, pglease.ErrInternal) || strings.Contains(err.Error(), id) {
		t.Fatalf("reused lockId: %v", err)
	}
	// Table dropped under a live Store: 42P01 → InvalidArgument. (The SQL
	// API's views depend on it: CASCADE drops them too.)
	if _, err := pool.Exec(c, "DROP TABLE syncguard_locks CASCADE"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(c, store.AcquireRequest{Key: "k", TTL: time.Second}); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("Acquire on a dropped table: %v", err)
	}
}

// A context cancelled while the acquire waits for the key's advisory lock
// is Aborted wrapping context.Canceled. With pgx's default context
// handling the connection is abandoned mid-statement, so the outcome is
// also unknown (the server may still grant the lock once the wait ends):
// the code is then Ambiguous, still errors.Is(err, ErrAborted), never
// success.
func TestCancelWhileWaiting(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{}, maxConns(3))
	c := ctx(t)
	tx, err := pool.Begin(c)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(c, "SELECT pg_advisory_xact_lock(hashtext('waiting'))"); err != nil {
		t.Fatal(err)
	}
	// The acquire waits at most 100 ms for the key's lock and then answers
	// "held, try again" (no error). On a loaded machine that answer can
	// come before the cancel; the attempt is then made again.
	for attempt := 1; ; attempt++ {
		cc, cancel := context.WithCancel(c)
		done, answered := make(chan error, 1), make(chan struct{})
		go func() {
			_, err := s.Acquire(cc, store.AcquireRequest{Key: "waiting", TTL: time.Second})
			done <- err
			close(answered)
		}()
		waitForLockWait(t, c, pool, "advisory", answered)
		cancel()
		err = <-done
		if err != nil || attempt == 20 {
			break
		}
	}
	if !errors.Is(err, pglease.ErrAborted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled acquire: %v", err)
	}
	if code := pglease.CodeOf(err); code != pglease.CodeAborted && code != pglease.CodeAmbiguous {
		t.Fatalf("cancelled acquire: code %v", code)
	}
}

// waitForLockWait returns once a backend waits for a lock of kind event,
// or once answered is closed (nil: never), when the waiter answered
// before it was seen.
func waitForLockWait(t *testing.T, c context.Context, pool *pgxpool.Pool, event string, answered <-chan struct{}) {
	t.Helper()
	for {
		var n int
		if err := pool.QueryRow(c, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = $1
			AND datname = current_database()`, event).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		select {
		case <-c.Done():
			t.Fatal("nobody waited")
		case <-answered:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// proxy forwards TCP to the server until cut.
type proxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(out, in); out.Close() }()
			go func() { defer p.wg.Done(); _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close(); p.cut(); p.wg.Wait() })
	return p
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// The connection dies after the acquire was sent: the outcome is unknown,
// so the result is an Ambiguous error — never success — even though the
// server may (and here does) grant the lock.
func TestAmbiguousAcquire(t *testing.T) {
	t.Parallel()
	s0, pool, schema := newStore(t, store.Config{}, maxConns(2))
	_ = s0
	c := ctx(t)
	cfg := pool.Config().ConnConfig.Copy() // the runtime role, like pool's
	if cfg.Host == "" || strings.HasPrefix(cfg.Host, "/") {
		t.Skip("server is on a Unix socket")
	}
	p := newProxy(t, net.JoinHostPort(cfg.Host, itoa(int(cfg.Port))))
	cfg.Host, cfg.Port = "127.0.0.1", uint16(p.ln.Addr().(*net.TCPAddr).Port)
	cfg.RuntimeParams["search_path"] = schema
	tx, err := pool.Begin(c)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(c, "SELECT pg_advisory_xact_lock(hashtext('amb'))"); err != nil {
		t.Fatal(err)
	}
	id := keys.NewLockID()
	var cutErr error
	// The acquire waits at most 100 ms for the key's lock and then answers
	// "held, try again". On a loaded machine that answer can come before
	// the cut (or before the wait is seen); the attempt is then made again
	// on a new connection. Success is never accepted.
	for attempt := 1; ; attempt++ {
		conn, err := pgx.ConnectConfig(c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		s, err := store.New("pg.New", conn, store.Config{})
		if err != nil {
			t.Fatal(err)
		}
		type answer struct {
			held bool // answered "held" without error: too early to test
			err  error
		}
		done, answered := make(chan answer, 1), make(chan struct{})
		go func() {
			r, err := s.AcquireMany(c, []store.AcquireRequest{{Key: "amb", TTL: time.Minute, LockID: id}})
			switch {
			case err == nil && r[0].OK:
				done <- answer{err: errors.New("reported success")}
			case err == nil:
				done <- answer{held: true}
			default:
				done <- answer{err: err}
			}
			close(answered)
		}()
		waitForLockWait(t, c, pool, "advisory", answered)
		p.cut()
		a := <-done
		conn.Close(context.Background())
		if a.held && attempt < 20 {
			continue
		}
		if a.held {
			t.Fatal("the acquire answered before the cut in 20 attempts")
		}
		cutErr = a.err
		break
	}
	if !errors.Is(cutErr, pglease.ErrAmbiguous) || pglease.CodeOf(cutErr) != pglease.CodeAmbiguous {
		t.Fatalf("acquire on a cut connection: %v; want Ambiguous", cutErr)
	}
	if strings.Contains(cutErr.Error(), id) {
		t.Fatal("error echoes the lockId")
	}
	_ = tx.Rollback(c) // the orphaned statement proceeds and may commit
}

func itoa(n int) string {
	b := []byte{}
	for n > 0 || len(b) == 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}
