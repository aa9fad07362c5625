package advisory

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/pgtest"
)

// TestProxyPinsPartitionedHoldersLock (issue 16.4) shows why the
// keepalive settings do not free a partitioned holder's locks behind a
// TCP proxy: a connection through a proxy takes a session lock with the
// keepalive and user timeouts a Session sets (here 1 s), then the proxy
// goes silent both ways (blackhole) and the holder never closes (a
// partitioned holder's FIN does not arrive either). The server's TCP peer
// is the proxy, which is alive and answers keepalives, so three times the
// keepalive bound later the server still holds the lock and nobody else
// can take it. The package documentation ("Behind a proxy or pooler")
// says what to do about it.
func TestProxyPinsPartitionedHoldersLock(t *testing.T) {
	t.Parallel()
	through, p := viaProxy(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	through(cfg)
	ctx := ctxT(t, 30*time.Second)
	holder, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	k := randKey()
	id, _ := k.Int64()
	var pid int32
	if err := holder.QueryRow(ctx, `SELECT pg_backend_pid(),
		set_config('tcp_keepalives_idle', '1', false), set_config('tcp_keepalives_interval', '1', false),
		set_config('tcp_keepalives_count', '1', false), set_config('tcp_user_timeout', '1000', false),
		set_config('client_connection_check_interval', '1000', false), pg_advisory_lock($1)`, id).Scan(&pid, nil, nil, nil, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	const keepaliveBound = time.Second // min(tcp_user_timeout, idle + interval × count)
	if err := p.Blackhole(); err != nil {
		t.Fatal(err)
	}
	admin := superConn(t)
	time.Sleep(3 * keepaliveBound) // nothing to wait for: the point is that nothing happens
	if !heldBy(t, admin, pid, k) {
		t.Fatal("the server freed the lock of a holder behind a blackholed proxy; the docs say it pins it")
	}
	var got bool
	if err := admin.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", id).Scan(&got); err != nil || got {
		t.Fatalf("another session took the pinned lock: %v %v", got, err)
	}
	// The proxy lets go of the server connection: now the server frees it.
	if err := p.Cut(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the lock freed after the proxy closed its server connection", func() bool { return !heldBy(t, admin, pid, k) })
	_ = holder.Close(context.Background())
}
