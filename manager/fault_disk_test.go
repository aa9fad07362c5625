package manager

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
)

// Server disk full: the server's whole directory (data and WAL) on a
// small tmpfs the test mounts, filled to the last byte while Managers run
// lease cycles on new keys (the lock and fence tables must grow) and on a
// few old ones, then WAL segment switches (a new segment needs space: the
// server PANICs and restarts, or stops). Afterwards the space is freed,
// the server crashed (immediate stop) and started: every grant a caller
// was told of must be on the server.

// smallFS mounts a tmpfs of size bytes on a new directory (removed, and
// unmounted, when the test ends). It needs root and a kernel that lets
// this process mount.
func smallFS(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		needFacility(t, "mounting a small filesystem needs root")
	}
	dir, err := os.MkdirTemp("", "pglease-diskfull-")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0755", "tmpfs", dir).CombinedOutput(); err != nil {
		_ = os.Remove(dir)
		needFacility(t, "cannot mount a small tmpfs (a container without CAP_SYS_ADMIN?): "+string(bytes.TrimSpace(out)))
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
		_ = os.Remove(dir)
	})
	return dir
}

// fill writes a file in dir until the filesystem is full and returns its
// path.
func fill(t *testing.T, dir string) string {
	t.Helper()
	p := dir + "/filler"
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			t.Fatal(err)
		}
	}
	// The last partial blocks.
	for _, n := range []int{4096, 512, 1} {
		for {
			if _, err := f.Write(buf[:n]); err != nil {
				break
			}
		}
	}
	return p
}

// TestServerDiskFull: see above. Every Acquire, Extend and Release under
// the full disk succeeds or fails with a code (ResourceExhausted for
// "could not extend file", ServiceUnavailable or Ambiguous when the server
// PANICs); no trusted lease is missing on the server; after the crash and
// restart every reported grant's fence is at most the server's counter of
// its key, and the Managers acquire again. The negative control is a
// client that reports a grant whose transaction it never committed (it
// ignores the commit's failure): the same check must find it missing.
func TestServerDiskFull(t *testing.T) {
	t.Parallel()
	dir := smallFS(t, "96m")
	logf, err := os.CreateTemp("", "pglease-diskfull-log-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close(); os.Remove(logf.Name()) })
	cl, pool := ownServer(t, pgtest.Options{ParentDir: dir, Durable: true, Log: logf})
	ctx := ctxT(t)
	res := newFencedResource(t, ctx, pool)
	mcfg := Config{StatementTimeout: 2 * time.Second}
	l := &faultLoad{
		ms:  []*Manager{faultManager(t, serverPool(t, cl.URL, 4), mcfg), faultManager(t, serverPool(t, cl.URL, 4), mcfg)},
		res: res, direct: pool, lockTable: "syncguard_locks",
		ttl: 1500 * time.Millisecond, keys: 3, prefix: "disk", freshKeys: true,
	}
	lctx, stop := context.WithCancel(ctx)
	wg := l.run(lctx, 2)
	defer func() { stop(); wg.Wait() }()
	time.Sleep(time.Second)

	// The negative control's grant, before the disk fills.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := pg.New(tx, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := st.Acquire(ctx, "disk:broken", time.Minute)
	if err != nil || !bad.OK {
		t.Fatal(bad, err)
	}
	_ = tx.Rollback(ctx) // the broken client reports bad as granted anyway
	var broken sync.Map
	broken.Store("disk:broken", int64(bad.Fence))

	filler := fill(t, dir)
	before := l.snapshot()
	time.Sleep(2 * time.Second)
	t.Logf("disk full, data files: %s", l.since(before))
	// New WAL segments need space the disk no longer has.
	before = l.snapshot()
	for range 3 {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := pool.Exec(sctx, "SELECT pg_switch_wal()")
		cancel()
		if err != nil {
			t.Logf("pg_switch_wal: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	t.Logf("disk full, WAL switches: %s", l.since(before))

	stop()
	wg.Wait()
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// Crash and start: what was acknowledged must have been durable.
	if err := cl.StopServer(true); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	if err := cl.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	srvLog, _ := os.ReadFile(logf.Name())
	t.Logf("server log: %d PANIC, %d 'No space left on device'", bytes.Count(srvLog, []byte("PANIC")), bytes.Count(srvLog, []byte("No space left on device")))
	lost, n := lostGrants(t, ctx, pool, &l.grants)
	if len(lost) > 0 {
		t.Errorf("%d of %d reported grants are not on the server after the restart: %v", len(lost), n, lost[:min(5, len(lost))])
	}
	t.Logf("%d keys' reported grants checked against the server's fence counters", n)
	if l.typedCount(pglease.CodeResourceExhausted) == 0 {
		t.Error("no operation failed with ResourceExhausted: the disk was not full where it mattered")
	}
	if lost, _ := lostGrants(t, ctx, pool, &broken); len(lost) != 1 {
		t.Errorf("negative control: a grant reported from an uncommitted transaction was not found missing: %v", lost)
	}
	// And the Managers work again.
	lctx2, stop2 := context.WithCancel(ctx)
	wg2 := l.run(lctx2, 1)
	d := l.recovery(t, healed, waitTimeout())
	t.Logf("space freed, server restarted: the next acquire succeeded %v after the restart began", d.Round(time.Millisecond))
	time.Sleep(500 * time.Millisecond)
	stop2()
	wg2.Wait()
	l.report(t)
	if v, n := fencedLogViolations(t, ctx, pool); len(v) != 0 {
		t.Errorf("resource log: %d writes, violations %v", n, v)
	}
}
