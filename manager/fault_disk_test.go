package manager

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

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
	// The old pool's connections died with the server.
	pool.Reset()
	srvLog, _ := os.ReadFile(logf.Name())
	t.Logf("server log: %d PANIC, %d 'No space left on device'", bytes.Count(srvLog, []byte("PANIC")), bytes.Count(srvLog, []byte("No space left on device")))
	lost, n := lostGrants(t, ctx, pool, &l.grants)
	if len(lost) > 0 {
		t.Errorf("%d of %d reported grants are not on the server after the restart: %v", len(lost), n, lost[:min(5, len(lost))])
	}
	t.Logf("%d keys' reported grants checked against the server's fence counters", n)
	if !bytes.Contains(srvLog, []byte("No space left on device")) {
		t.Error("the server never ran out of space: the fault was not injected")
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

// slowFsyncC is an LD_PRELOAD shim that sleeps before every fsync and
// fdatasync for the number of microseconds in the file named by
// SLOWFSYNC_FILE (read at each call, so a test changes it at run time).
const slowFsyncC = `#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static void slow(void) {
	const char *p = getenv("SLOWFSYNC_FILE");
	long d = 0;
	FILE *f;
	if (!p || !(f = fopen(p, "r"))) return;
	if (fscanf(f, "%ld", &d) != 1) d = 0;
	fclose(f);
	if (d > 0) {
		struct timespec ts = {d / 1000000, (d % 1000000) * 1000};
		nanosleep(&ts, NULL);
	}
}
int fsync(int fd) {
	static int (*real)(int);
	if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
	slow();
	return real(fd);
}
int fdatasync(int fd) {
	static int (*real)(int);
	if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
	slow();
	return real(fd);
}
`

// TestServerSlowFsync: the server's fsync and fdatasync made slow by an
// LD_PRELOAD shim (compiled here with the C compiler): first 200 ms per
// call, then 2.5 s (longer than the leases' TTL and the Managers'
// StatementTimeout: commits, grants and extends alike, wait that long).
// Every operation succeeds or fails typed (an acquire whose commit is
// still waiting when the client gives up is Ambiguous, and its lockId is
// released), trusted ⇒ live, no stale write; after fsync is fast again
// and the server crashed and started, every reported grant is on the
// server. The negative control: a holder that ignores its loss signal
// through the 2.5 s stalls is caught.
func TestServerSlowFsync(t *testing.T) {
	t.Parallel()
	cc, err := exec.LookPath("cc")
	if err != nil {
		needFacility(t, "no C compiler (cc) to build the slow-fsync shim (Debian: apt-get install gcc)")
	}
	dir, err := os.MkdirTemp("", "pglease-slowfsync-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, lib, delay := dir+"/slowfsync.c", dir+"/slowfsync.so", dir+"/delay"
	if err := os.WriteFile(src, []byte(slowFsyncC), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-o", lib, src, "-ldl").CombinedOutput(); err != nil {
		needFacility(t, "cannot build the slow-fsync shim: "+string(bytes.TrimSpace(out)))
	}
	setDelay := func(d time.Duration) {
		t.Helper()
		tmp := delay + ".tmp"
		if err := os.WriteFile(tmp, []byte(strconv.FormatInt(d.Microseconds(), 10)), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, delay); err != nil {
			t.Fatal(err)
		}
	}
	setDelay(0)
	cl, pool := ownServer(t, pgtest.Options{Durable: true, Env: []string{"LD_PRELOAD=" + lib, "SLOWFSYNC_FILE=" + delay}})
	ctx := ctxT(t)
	// The shim must work, or the test would pass for nothing: a commit
	// that wrote WAL waits for its flush.
	if _, err := pool.Exec(ctx, "CREATE TABLE slow_probe (x int)"); err != nil {
		t.Fatal(err)
	}
	setDelay(500 * time.Millisecond)
	t0 := time.Now()
	if _, err := pool.Exec(ctx, "INSERT INTO slow_probe VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < 400*time.Millisecond {
		needFacility(t, "the slow-fsync shim did not slow the server's commits (a commit took "+d.String()+")")
	}
	setDelay(0)

	res := newFencedResource(t, ctx, pool)
	mcfg := Config{StatementTimeout: 2 * time.Second}
	l := &faultLoad{
		ms:  []*Manager{faultManager(t, serverPool(t, cl.URL, 4), mcfg), faultManager(t, serverPool(t, cl.URL, 4), mcfg)},
		res: res, direct: pool, lockTable: "syncguard_locks",
		ttl: 1500 * time.Millisecond, keys: 3, prefix: "fsync",
	}
	lctx, stop := context.WithCancel(ctx)
	wg := l.run(lctx, 2)
	defer func() { stop(); wg.Wait() }()
	time.Sleep(time.Second)
	before := l.snapshot()
	setDelay(200 * time.Millisecond)
	time.Sleep(3 * time.Second)
	t.Logf("fsync 200 ms: %s", l.since(before))
	broken, err := l.brokenHolder(ctx, l.ms[0], "fsync:broken")
	if err != nil {
		t.Fatal(err)
	}
	before = l.snapshot()
	setDelay(2500 * time.Millisecond)
	time.Sleep(6 * time.Second)
	setDelay(0)
	healed := time.Now()
	t.Logf("fsync 2.5 s: %s", l.since(before))
	t.Logf("fsync fast again: the next acquire succeeded %v later", l.recovery(t, healed, 2*waitTimeout()).Round(time.Millisecond))
	if !broken() {
		t.Error("negative control: a holder that ignores its loss signal trusted its lease through 2.5 s fsync stalls, and the check did not catch it")
	}
	stop()
	wg.Wait()
	if err := cl.StopServer(true); err != nil {
		t.Fatal(err)
	}
	if err := cl.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	pool.Reset() // its connections died with the server
	lost, n := lostGrants(t, ctx, pool, &l.grants)
	if len(lost) > 0 {
		t.Errorf("%d of %d reported grants are not on the server after a crash: %v", len(lost), n, lost[:min(5, len(lost))])
	}
	l.report(t)
	if v, n := fencedLogViolations(t, ctx, pool); len(v) != 0 {
		t.Errorf("resource log: %d writes, violations %v", n, v)
	}
}
