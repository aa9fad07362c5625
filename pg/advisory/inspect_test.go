package advisory

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/pgtest"
)

func TestInspect(t *testing.T) {
	t.Parallel()
	app := pgtest.RandomName("insp_")
	pool := newPool(t, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app })
	o := testOpts()
	o.waitSlice = 20 * time.Second // one continuous wait, so the waiter row stays
	o.ProbeInterval = o.waitSlice  // a wait slice may not exceed the probe interval
	o.userTimeout, o.keepaliveIdle = 60*time.Second, 60*time.Second
	holder, waiter := openSession(t, pool, o), openSession(t, pool, o)
	ctx := ctxT(t, 20*time.Second)
	reg := NewRegistry()
	k := randKey()
	if err := reg.Fixed("cleanup", k, "test"); err != nil {
		t.Fatal(err)
	}
	pairKey := Pair(-7, int32(time.Now().UnixNano()))
	if _, err := holder.LockAll(ctx, k, pairKey); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	waitDone := make(chan error, 1)
	go func() { _, err := waiter.Lock(wctx, k); waitDone <- err }()
	defer func() { cancel(); <-waitDone }()

	var infos []LockInfo
	mine := func(li LockInfo) bool { return li.Key == k || li.Key == pairKey }
	waitFor(t, "the waiter in pg_locks", func() bool {
		all, err := Inspect(ctx, pool, reg)
		if err != nil {
			t.Fatal(err)
		}
		infos = slices.DeleteFunc(all, func(li LockInfo) bool { return !mine(li) })
		return len(infos) == 3
	})
	h, w, p := infos[0], infos[1], infos[2] // sorted: int64 key (holder, waiter), then the pair
	if h.PID != holder.BackendPID() || !h.Granted || h.Name != "cleanup" || h.ApplicationName != app ||
		h.Mode != "ExclusiveLock" || len(h.BlockingPIDs) != 0 || !h.WaitStart.IsZero() {
		t.Errorf("holder row: %+v", h)
	}
	if w.PID != waiter.BackendPID() || w.Granted || w.Key != k || w.Name != "cleanup" ||
		!slices.Equal(w.BlockingPIDs, []int32{holder.BackendPID()}) || w.WaitStart.IsZero() != (serverMajor(t) < 14) {
		t.Errorf("waiter row: %+v", w)
	}
	if p.Key != pairKey || p.PID != holder.BackendPID() || p.Name != "" || !p.Granted {
		t.Errorf("pair row: %+v", p)
	}
	if h.State == "" {
		t.Errorf("superuser sees no state: %+v", h)
	}

	// A plain role (no superuser, no pg_read_all_stats) can take locks and
	// inspect; it sees every lock with pid and application_name, but not
	// the state of other roles' sessions.
	t.Run("plain role", func(t *testing.T) {
		role := pgtest.RandomName("plain_")
		sc := superConn(t)
		if _, err := sc.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
			t.Fatal(err)
		}
		cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.User = role
		plain, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			plain.Close()
			_, _ = sc.Exec(context.Background(), "DROP ROLE "+role)
		})
		ps, err := Open(ctx, plain, o)
		if err != nil {
			t.Fatalf("plain role Open: %v", err)
		}
		defer ps.Close(ctx)
		own := randKey()
		if _, ok, err := ps.TryLock(ctx, own); !ok || err != nil {
			t.Fatalf("plain role TryLock: %v %v", ok, err)
		}
		all, err := Inspect(ctx, plain, reg)
		if err != nil {
			t.Fatalf("plain role Inspect: %v", err)
		}
		var sawHolder, sawOwn bool
		for _, li := range all {
			switch {
			case li.Key == k && li.PID == holder.BackendPID():
				sawHolder = true
				if li.Name != "cleanup" || li.ApplicationName != app || li.State != "" {
					t.Errorf("plain role's view of another role's lock: %+v", li)
				}
			case li.Key == own:
				sawOwn = true
				if li.PID != ps.BackendPID() || li.State == "" || li.User != role {
					t.Errorf("plain role's view of its own lock: %+v", li)
				}
			}
		}
		if !sawHolder || !sawOwn {
			t.Errorf("plain role missed locks: holder %v own %v", sawHolder, sawOwn)
		}
	})
}
