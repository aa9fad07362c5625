package driver

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/soak/event"
)

// The faults that need something of the machine: libfaketime under the
// server (clock-step), a PgBouncer (pool-*), a filesystem of the driver's
// own under the server's directory (disk-full). Each is set up only when
// its faults are in the mix; when the machine cannot, those faults are
// dropped from the mix and the reason is in Meta.NotRun (and the report).

// libfaketimePaths are where Debian and other distributions put
// libfaketime.
var libfaketimePaths = []string{
	"/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
	"/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
	"/usr/lib/faketime/libfaketime.so.1",
	"/usr/local/lib/faketime/libfaketime.so.1",
}

// poolFaults are the faults of the PgBouncer the pooled workers go through.
var poolFaults = []string{FPoolPause, FPoolReconnect, FPoolRestart}

// diskSize is the tmpfs's size outside a disk-full fault: room for a
// long run's audit tables and WAL (tmpfs takes memory only for what is
// written).
const diskSize = 4 << 30

// dropFault removes ft from the mix and says why.
func (d *driver) dropFault(meta *Meta, ft, why string) {
	if d.o.Mix[ft] == 0 {
		return
	}
	delete(d.o.Mix, ft)
	if meta.NotRun == nil {
		meta.NotRun = map[string]string{}
	}
	meta.NotRun[ft] = why
	d.logf("%s: not run: %s", ft, why)
}

// setupClock prepares the server's libfaketime (its offset file, read at
// every clock read, so a step is immediate) and returns the server's
// extra environment; nil when clock-step is not in the mix or cannot run.
func (d *driver) setupClock(meta *Meta) []string {
	if d.o.Mix[FClockStep] == 0 {
		return nil
	}
	lib := ""
	for _, p := range libfaketimePaths {
		if _, err := os.Stat(p); err == nil {
			lib = p
			break
		}
	}
	if lib == "" {
		d.dropFault(meta, FClockStep, "libfaketime is not installed (Debian/Ubuntu: apt-get install faketime)")
		return nil
	}
	// The server runs unprivileged: the file's directory must be readable.
	dir, err := os.MkdirTemp("", "pglease-soak-clock-")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		d.dropFault(meta, FClockStep, err.Error())
		return nil
	}
	d.clockFile = filepath.Join(dir, "offset")
	if err := d.stepClock(0); err != nil {
		d.dropFault(meta, FClockStep, err.Error())
		return nil
	}
	// NO_FAKE_STAT: libfaketime fakes file times under a semaphore it
	// shares with every child of the postmaster; a backend killed inside
	// fstat (the crash and kill faults) leaves it taken, and every new
	// backend then hangs in authentication (seen: 400 of them, the server
	// full). The clock steps need only the clock.
	return []string{"LD_PRELOAD=" + lib, "FAKETIME_TIMESTAMP_FILE=" + d.clockFile,
		"FAKETIME_NO_CACHE=1", "FAKETIME_DONT_FAKE_MONOTONIC=1", "NO_FAKE_STAT=1"}
}

// checkClock makes sure the server runs on the shifted clock (a missing
// preload would make every step a no-op): a 1 h step must show.
func (d *driver) checkClock(ctx context.Context, meta *Meta) {
	if d.clockFile == "" {
		return
	}
	if err := d.stepClock(time.Hour); err != nil {
		d.dropFault(meta, FClockStep, err.Error())
		return
	}
	var ms int64
	before := time.Now()
	err := d.admin.QueryRow(ctx, "SELECT floor(extract(epoch FROM clock_timestamp())*1000)::bigint").Scan(&ms)
	_ = d.stepClock(0)
	if off := time.UnixMilli(ms).Sub(before); err != nil || off < 50*time.Minute {
		d.dropFault(meta, FClockStep, fmt.Sprintf("libfaketime did not shift the server's clock (offset %v after a 1 h step, %v)", off, err))
		_ = os.RemoveAll(filepath.Dir(d.clockFile))
		d.clockFile = ""
	}
}

// stepClock sets the server's wall clock to true time + off (whole
// seconds are all libfaketime's "+N" takes; the soak steps by whole
// milliseconds with a decimal). The file is replaced atomically.
func (d *driver) stepClock(off time.Duration) error {
	tmp := d.clockFile + ".tmp"
	if err := os.WriteFile(tmp, fmt.Appendf(nil, "%+.3f\n", off.Seconds()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, d.clockFile)
}

// setupDisk mounts a tmpfs for the server's directory and returns its
// path; "" when disk-full is not in the mix or cannot run.
func (d *driver) setupDisk(meta *Meta) string {
	if d.o.Mix[FDiskFull] == 0 {
		return ""
	}
	if os.Geteuid() != 0 {
		d.dropFault(meta, FDiskFull, "mounting a filesystem of its own needs root")
		return ""
	}
	dir, err := os.MkdirTemp("", "pglease-soak-disk-")
	if err != nil {
		d.dropFault(meta, FDiskFull, err.Error())
		return ""
	}
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0755", diskSize), "tmpfs", dir).CombinedOutput()
	if err != nil {
		_ = os.Remove(dir)
		d.dropFault(meta, FDiskFull, "cannot mount a tmpfs (a container without CAP_SYS_ADMIN?): "+strings.TrimSpace(string(out)))
		return ""
	}
	d.diskDir = dir
	return dir
}

func (d *driver) unmountDisk() {
	if d.diskDir == "" {
		return
	}
	if err := syscall.Unmount(d.diskDir, syscall.MNT_DETACH); err != nil {
		d.logf("unmount %s: %v", d.diskDir, err)
	}
	_ = os.Remove(d.diskDir)
}

// resizeDisk remounts the tmpfs with size bytes (a size below what it
// holds is refused: diskFull tries a few pages more each time).
func (d *driver) resizeDisk(size int64) error {
	out, err := exec.Command("mount", "-o", fmt.Sprintf("remount,size=%d", size), d.diskDir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setupPooler starts the PgBouncer (transaction mode) the pooled workers
// go through, when a pool fault is in the mix or Options.Pooled asks.
func (d *driver) setupPooler(ctx context.Context, meta *Meta) error {
	want := false
	for _, ft := range poolFaults {
		want = want || d.o.Mix[ft] > 0
	}
	if d.o.Pooled == 0 && want {
		d.o.Pooled = d.o.Workers / 2
	}
	if d.o.Pooled <= 0 {
		d.o.Pooled = 0
		for _, ft := range poolFaults {
			d.dropFault(meta, ft, "no worker goes through PgBouncer (-pooled -1)")
		}
		return nil
	}
	d.o.Pooled = min(d.o.Pooled, d.o.Workers)
	if _, err := pgtest.FindPgBouncer(); err != nil {
		for _, ft := range poolFaults {
			d.dropFault(meta, ft, err.Error())
		}
		d.o.Pooled = 0
		return nil
	}
	lf, err := os.Create(filepath.Join(d.o.Dir, "pgbouncer.log"))
	if err != nil {
		return err
	}
	d.bouncerLog = lf
	d.bouncer, err = pgtest.StartPgBouncer(ctx, d.dbURL, pgtest.BouncerOptions{PoolMode: pgtest.PoolTransaction,
		PoolSize: 3 * d.o.Pooled, Log: lf})
	if err != nil {
		return fmt.Errorf("pgbouncer: %w", err)
	}
	meta.Pooled = d.o.Pooled
	return nil
}

func (d *driver) pooled(w int) bool { return PooledWorker(w, d.o.Workers, d.o.Pooled) }

// PooledWorker reports whether worker w of workers goes through PgBouncer
// when pooled of them do: the odd ids first, then the even ones.
func PooledWorker(w, workers, pooled int) bool {
	odd := workers / 2
	if w%2 == 1 {
		return w/2 < pooled
	}
	return pooled > odd && w/2 < pooled-odd
}

// withParam adds a query parameter to a URL connection string.
func withParam(s, k, v string) string {
	u, err := url.Parse(s)
	if err != nil {
		return s
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String()
}

// serverFault runs one fault that hits every worker (not crash and
// restart: startFault has those).
func (d *driver) serverFault(ctx context.Context, ft string, id int64, dur time.Duration, param float64) {
	switch ft {
	case FReadOnly:
		d.readOnly(ctx, dur)
	case FTableLock:
		d.lockTables(ctx, dur)
	case FClockStep:
		d.clockStep(ctx, id, dur, param)
	case FPoolPause:
		d.bouncerAdmin(ctx, "PAUSE")
		sleepCtx(ctx, dur)
		d.bouncerAdmin(context.Background(), "RESUME")
	case FPoolReconnect:
		d.bouncerAdmin(ctx, "RECONNECT")
	case FPoolRestart:
		for try := 0; try < 60; try++ {
			rctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err := d.bouncer.Restart(rctx)
			cancel()
			if err == nil {
				break
			}
			d.logf("pool-restart: %v; retrying", err)
			time.Sleep(500 * time.Millisecond)
		}
	case FDiskFull:
		d.diskFull(ctx, id, dur, param)
	case FDeleteRows:
		d.operator(ctx, "delete-rows", "DELETE FROM syncguard_locks")
	case FVacuumFull:
		d.operator(ctx, "vacuum-full", "VACUUM FULL syncguard_locks, syncguard_locks_shared, syncguard_fence_counters")
	case FStmtTimeout:
		if err := d.setSystem(ctx, "ALTER SYSTEM SET statement_timeout = '1ms'"); err != nil {
			d.logf("statement-timeout: %v", err)
		}
		sleepCtx(ctx, dur)
		d.resetSystem("statement-timeout", "ALTER SYSTEM RESET statement_timeout")
	}
}

// faultDuration is how long a server fault of type ft lasts (0: it is
// one action).
func faultDuration(ft string, between func(lo, hi float64) time.Duration) time.Duration {
	switch ft {
	case FTableLock:
		return between(0.5, 1)
	case FReadOnly, FStmtTimeout:
		return between(0.5, 1.5)
	case FClockStep, FDiskFull:
		return between(0.5, 2)
	case FPoolPause:
		return between(0.3, 2.5)
	}
	return 0
}

// OperatorApp is the application_name of the driver's operator faults
// (delete-rows): the lock table's audit tells their deletes by it.
const OperatorApp = "soak-operator"

// operator runs one statement as an operator would, on a session named
// OperatorApp.
func (d *driver) operator(ctx context.Context, name, sql string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := d.admin.Acquire(ctx)
	if err != nil {
		d.logf("%s: %v", name, err)
		return
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET application_name = '"+OperatorApp+"'"); err != nil {
		d.logf("%s: %v", name, err)
		return
	}
	defer func() { _, _ = conn.Exec(context.Background(), "SET application_name = 'soak-driver'") }()
	tag, err := conn.Exec(ctx, sql)
	if err != nil {
		d.logf("%s: %v", name, err)
		return
	}
	d.ev(event.Event{E: name, W: -1, V: tag.RowsAffected()})
}

// clockStep steps the server's wall clock forward or back (param < 0.5:
// back by 0.1–1 TTL; else forward by 0.1–3 TTL) for dur, then back to
// true time (itself a step of the same size the other way).
func (d *driver) clockStep(ctx context.Context, id int64, dur time.Duration, param float64) {
	ttl := float64(d.o.TTL)
	var off time.Duration
	if param < 0.5 {
		off = -time.Duration((0.1 + 0.9*param/0.5) * ttl)
	} else {
		off = time.Duration((0.1 + 2.9*(param-0.5)/0.5) * ttl)
	}
	off = off.Round(time.Millisecond)
	sa := d.auditSeq(ctx)
	if err := d.stepClock(off); err != nil {
		d.logf("clock-step: %v", err)
		return
	}
	d.ev(event.Event{E: event.ClockStep, W: -1, O: id, V: int64(off), SA: sa, SB: d.auditSeq(ctx)})
	sleepCtx(ctx, dur)
	sa = d.auditSeq(context.Background())
	for d.stepClock(0) != nil {
		time.Sleep(100 * time.Millisecond)
	}
	d.ev(event.Event{E: event.ClockStep, W: -1, O: id, V: 0, SA: sa, SB: d.auditSeq(context.Background())})
}

// auditSeq draws a number from the audits' sequence, so that the check
// can tell on which side of a clock step an audit row read the clock: a
// server time shown twice after a backward step is otherwise ambiguous
// when rows are sparse. 0 when the server did not answer within a second.
func (d *driver) auditSeq(ctx context.Context) int64 {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var n int64
	if d.admin.QueryRow(ctx, "SELECT nextval('soak_audit_seq')").Scan(&n) != nil {
		return 0
	}
	return n
}

// bouncerAdmin runs a PgBouncer admin command, retried until it is made
// (a RESUME must never be lost) or, for other commands, for 10 s.
func (d *driver) bouncerAdmin(ctx context.Context, cmd string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := d.bouncer.Admin(actx, cmd)
		cancel()
		if err == nil {
			return
		}
		if cmd != "RESUME" && (time.Now().After(deadline) || ctx.Err() != nil) {
			d.logf("pgbouncer %s: %v", cmd, err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// diskFull shrinks the server's filesystem to what it holds (every
// further block it needs fails ENOSPC: a table that must grow, the next
// WAL segment), forces a WAL segment switch half of the times (what makes
// a server PANIC), waits dur, gives the space back, and makes sure the
// server is up (a PANIC restarts it, or stops it when its recovery found
// no space either: then the driver starts it). The whole fault is logged
// as server downtime: the server can fail any write meanwhile.
func (d *driver) diskFull(ctx context.Context, id int64, dur time.Duration, param float64) {
	d.ev(event.Event{E: event.ServerDown, W: -1, O: id})
	var st syscall.Statfs_t
	full := false
	if err := syscall.Statfs(d.diskDir, &st); err == nil {
		used := int64(st.Blocks-st.Bfree) * st.Bsize
		for try := int64(0); try < 20 && !full; try++ {
			full = d.resizeDisk(used+try*int64(st.Bsize)*4) == nil
		}
	}
	if !full {
		d.logf("disk-full: could not shrink the filesystem")
	}
	if full && param < 0.5 {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := d.admin.Exec(sctx, "SELECT pg_switch_wal()")
		cancel()
		d.ev(event.Event{E: "wal_switch", W: -1, O: id, C: errCode(err)})
	}
	sleepCtx(ctx, dur)
	for d.resizeDisk(diskSize) != nil {
		time.Sleep(100 * time.Millisecond)
	}
	// Up? A server that PANICked restarts by itself within seconds.
	up := false
	for deadline := time.Now().Add(8 * time.Second); time.Now().Before(deadline); {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := d.admin.Exec(pctx, "SELECT 1")
		cancel()
		if err == nil {
			up = true
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !up {
		d.ev(event.Event{E: "disk_restart", W: -1, O: id})
		_ = d.cluster.StopServer(true)
		for {
			err := d.cluster.StartServer(context.Background())
			if err == nil {
				break
			}
			d.logf("server start failed (%v); retrying", err)
			time.Sleep(time.Second)
		}
	}
	d.ev(event.Event{E: event.ServerUp, W: -1, O: id})
}

// errCode is a short form of a statement's error for the driver's log.
func errCode(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}

// setSystem runs alter (ALTER SYSTEM, a statement of its own) and
// reloads the configuration, on one admin session that keeps its own
// settings (a session-level SET outranks the file).
func (d *driver) setSystem(ctx context.Context, alter string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := d.admin.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	for _, q := range []string{"SET default_transaction_read_only = off", "SET statement_timeout = 0", alter, "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// resetSystem runs reset with setSystem until it is made, so the server
// never keeps an operator fault's setting.
func (d *driver) resetSystem(name, reset string) {
	for {
		err := d.setSystem(context.Background(), reset)
		if err == nil {
			return
		}
		d.logf("%s: reset: %v; retrying", name, err)
		time.Sleep(200 * time.Millisecond)
	}
}
