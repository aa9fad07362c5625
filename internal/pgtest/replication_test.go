package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/pgtest"
)

func connectTo(t *testing.T, ctx context.Context, url string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// serverPort is the port of the server a connection reached (the real
// server's, also through a proxy).
func serverPort(t *testing.T, ctx context.Context, c *pgx.Conn) int {
	t.Helper()
	var port int
	if err := c.QueryRow(ctx, "SELECT current_setting('port')::int").Scan(&port); err != nil {
		t.Fatal(err)
	}
	return port
}

// waitRow waits until standby node i of r has replayed the primary's
// writes so far and has a row v in table t.
func waitRow(t *testing.T, ctx context.Context, r *pgtest.Replicated, i, v int) {
	t.Helper()
	if err := r.WaitReplayed(ctx, 1-i, i); err != nil {
		t.Fatal(err)
	}
	c := connectTo(t, ctx, r.NodeURL(i, ""))
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM t WHERE v = $1", v).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("row %d not on node %d after 30 s", v, i)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReplicatedSync: with a synchronous standby, data written on the
// primary shows on the standby, a commit waits while the standby is down
// and completes when it is back, and after the primary crashes and the
// standby is promoted the multi-host URL lands on the new primary with
// every acknowledged commit.
func TestReplicatedSync(t *testing.T) {
	t.Parallel()
	r := pgtest.ReplicatedForTest(t, pgtest.ReplOptions{Sync: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := connectTo(t, ctx, r.URL(""))
	if p := serverPort(t, ctx, c); p != r.Nodes[0].Port {
		t.Fatalf("multi-host URL reached port %d, want the primary's %d", p, r.Nodes[0].Port)
	}
	if _, err := c.Exec(ctx, "CREATE TABLE t (v int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	waitRow(t, ctx, r, 1, 1)
	if rec, err := r.InRecovery(ctx, 1); err != nil || !rec {
		t.Fatalf("node1 in recovery = %v, %v; want a standby", rec, err)
	}

	// Standby down: a commit on the primary waits for it.
	if err := r.Nodes[1].StopServer(false); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, "INSERT INTO t VALUES (2)")
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("commit returned (%v) while the synchronous standby was down", err)
	case <-time.After(time.Second):
	}
	// The primary itself is alive: reads on another connection answer.
	other := connectTo(t, ctx, r.NodeURL(0, ""))
	if _, err := other.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if err := r.Nodes[1].StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("commit after the standby came back: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("commit still waiting 60 s after the standby came back")
	}

	// Crash the primary, promote the standby: the acknowledged row is there.
	if err := r.Crash(0); err != nil {
		t.Fatal(err)
	}
	if err := r.Promote(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if rec, err := r.InRecovery(ctx, 1); err != nil || rec {
		t.Fatalf("node1 in recovery after promote = %v, %v", rec, err)
	}
	c2 := connectTo(t, ctx, r.URL("", "connect_timeout=5"))
	if p := serverPort(t, ctx, c2); p != r.Nodes[1].Port {
		t.Fatalf("after failover the multi-host URL reached port %d, want the new primary's %d", p, r.Nodes[1].Port)
	}
	var n int
	if err := c2.QueryRow(ctx, "SELECT count(*) FROM t WHERE v IN (1, 2)").Scan(&n); err != nil || n != 2 {
		t.Fatalf("rows on the new primary: %d, %v; want both acknowledged rows", n, err)
	}
	if _, err := c2.Exec(ctx, "INSERT INTO t VALUES (3)"); err != nil {
		t.Fatalf("write on the promoted node: %v", err)
	}
}

// TestReplicatedAsyncSilentHost: with an asynchronous standby a commit does
// not wait for it; with a proxy in front of each node, a primary that
// crashed behind a silent (blackholed) address stalls a multi-host connect
// without connect_timeout, and with connect_timeout the connect moves on to
// the promoted standby (a failover behind an address that stopped answering).
func TestReplicatedAsyncSilentHost(t *testing.T) {
	t.Parallel()
	r := pgtest.ReplicatedForTest(t, pgtest.ReplOptions{Proxy: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := connectTo(t, ctx, r.URL(""))
	if p := serverPort(t, ctx, c); p != r.Nodes[0].Port {
		t.Fatalf("multi-host URL reached port %d, want the primary's %d", p, r.Nodes[0].Port)
	}
	if _, err := c.Exec(ctx, "CREATE TABLE t (v int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	waitRow(t, ctx, r, 1, 1)

	if err := r.Nodes[1].StopServer(false); err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	if _, err := c.Exec(cctx, "INSERT INTO t VALUES (2)"); err != nil {
		t.Fatalf("async commit with the standby down: %v", err)
	}
	ccancel()
	if err := r.Nodes[1].StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	waitRow(t, ctx, r, 1, 2)

	// The old primary's address goes silent, then it crashes.
	if err := r.Nodes[0].Proxy.Blackhole(); err != nil {
		t.Fatal(err)
	}
	if err := r.Crash(0); err != nil {
		t.Fatal(err)
	}
	if err := r.Promote(ctx, 1); err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
	if c, err := pgx.Connect(sctx, r.URL("")); err == nil {
		_ = c.Close(ctx)
		t.Fatal("connect without connect_timeout got past the silent host; want it stuck there")
	}
	scancel()
	t0 := time.Now()
	c2 := connectTo(t, ctx, r.URL("", "connect_timeout=2"))
	if p := serverPort(t, ctx, c2); p != r.Nodes[1].Port {
		t.Fatalf("reached port %d, want the promoted node's %d", p, r.Nodes[1].Port)
	}
	if el := time.Since(t0); el < 1500*time.Millisecond || el > 30*time.Second {
		t.Fatalf("connect past the silent host took %v; want about connect_timeout (2 s)", el)
	}
	if _, err := c2.Exec(ctx, "INSERT INTO t VALUES (3)"); err != nil {
		t.Fatalf("write on the promoted node: %v", err)
	}
}
