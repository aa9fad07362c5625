package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg/advisory"
	"github.com/pglease/pglease/pg/migrate"
)

// bin is the pglease binary the tests run, built once by TestMain.
var bin string

func TestMain(m *testing.M) {
	// One fixed place per user and checkout, overwritten by each run
	// (pgtest.Main exits, so a fresh temporary directory could not be
	// removed); two checkouts tested at once do not run each other's
	// binary.
	wd, _ := os.Getwd()
	sum := sha256.Sum256([]byte(wd))
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("pglease-cli-test-%d-%x", os.Getuid(), sum[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	bin = filepath.Join(dir, "pglease")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(2)
	}
	pgtest.Main(m)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// result is one run of the binary.
type result struct {
	code           int
	stdout, stderr string
}

// run runs the binary with env DATABASE_URL=url (unless url is "-") and stdin.
func run(t *testing.T, url, stdin string, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin, args...)
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	if url != "-" {
		env = append(env, "DATABASE_URL="+url)
	}
	cmd.Env = env
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{code, out.String(), errb.String()}
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", r.code, r.stdout, r.stderr)
}

func want(t *testing.T, r result, code int, in ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d, got:\n%s", code, r)
	}
	for _, s := range in {
		if !strings.Contains(r.stdout+r.stderr, s) {
			t.Fatalf("output lacks %q:\n%s", s, r)
		}
	}
}

// wantLines fails unless each regexp matches a whole line of stdout.
func wantLines(t *testing.T, r result, res ...string) {
	t.Helper()
	for _, re := range res {
		if !regexp.MustCompile(`(?m)^` + re + `$`).MatchString(r.stdout) {
			t.Fatalf("no line of stdout matches %q:\n%s", re, r)
		}
	}
}

// world is a schema with the pglease schema, a URL for the binary, and a
// pool on it.
type world struct {
	url   string
	pool  *pgxpool.Pool
	store *store.Store
	// ownerURL connects as the schema's owner role (with setup only): it
	// may create tables and guard them.
	ownerURL string
}

// With setup, the schema was set up by an owner role and everything else
// (the binary and the test's own lock operations) runs as the runtime
// role of roles.sql (migrate.RolesSQL), as in production. Without it, the
// harness's superuser runs the schema commands (setup and migrate are
// the owner's, never the runtime role's).
func newWorld(t *testing.T, setup bool) *world {
	t.Helper()
	var url, owner string
	if setup {
		rs := pgtest.RoleSchemaForTest(t)
		url, owner = rs.RuntimeURL, rs.OwnerURL
	} else {
		url = pgtest.SchemaURL(t)
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := store.New("pg.New", pool, store.Config{Holder: "billing[42]@web-1"})
	if err != nil {
		t.Fatal(err)
	}
	return &world{url: url, pool: pool, store: s, ownerURL: owner}
}

func (w *world) acquire(t *testing.T, key string, ttl time.Duration) store.AcquireResult {
	t.Helper()
	r, err := w.store.Acquire(ctx(t), store.AcquireRequest{Key: key, TTL: ttl})
	if err != nil || !r.OK {
		t.Fatalf("Acquire(%s) = %v, %v", key, r, err)
	}
	return r
}

// waitFor polls f until it is true (bounded).
func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A status with live and expired leases, an acquire in progress on a held
// key, an advisory holder and a waiter behind it: text and JSON.
func TestStatus(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	c := ctx(t)
	job := w.acquire(t, "job:1", time.Minute)
	old := w.acquire(t, "job:old", 300*time.Millisecond)
	_ = old
	// An acquire of job:1 in progress: a SyncGuard-style transaction holds
	// the key's advisory lock, a SyncGuard acquire waits behind it (a
	// pglease acquire answers "held" after a bounded wait instead).
	tx, err := w.pool.Begin(c)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(c) }()
	if _, err := tx.Exec(c, "SELECT pg_advisory_xact_lock(hashtext('job:1'))"); err != nil {
		t.Fatal(err)
	}
	acqDone := make(chan error, 1)
	go func() {
		tx2, err := w.pool.Begin(c)
		if err == nil {
			_, err = tx2.Exec(c, "SELECT pg_advisory_xact_lock(hashtext('job:1'))")
			_ = tx2.Rollback(c)
		}
		acqDone <- err
	}()
	// An advisory holder and a waiter.
	key := advisory.Int64(42424242)
	holder, err := advisory.Open(c, w.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Close(context.Background()) }()
	if _, err := holder.Lock(c, key); err != nil {
		t.Fatal(err)
	}
	waiter, err := advisory.Open(c, w.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = waiter.Close(context.Background()) }()
	wctx, wcancel := context.WithCancel(c)
	defer wcancel()
	go func() { _, _ = waiter.Lock(wctx, key) }()
	waitFor(t, "two waiters in pg_locks", func() bool {
		locks, err := advisory.Inspect(c, w.pool, nil)
		n := 0
		for _, l := range locks {
			if !l.Granted {
				n++
			}
		}
		return err == nil && n == 2
	})
	time.Sleep(time.Second + 400*time.Millisecond) // job:old expires past the tolerance

	// A session lock waiter waits in slices (of its ProbeInterval)
	// and is briefly absent between two: retry until a snapshot has it.
	var r result
	waitFor(t, "a status that shows the advisory waiter", func() bool {
		r = run(t, w.url, "", "status", "--name", "scheduler=int64:42424242")
		return strings.Contains(r.stdout, "int64:42424242 (scheduler): 1 waiting")
	})
	want(t, r, 0, fmt.Sprintf("schema v%d (current)", migrate.Latest), "LEASES  1 live, 1 expired", pglease.HashKey("job:1"), "billing[42]@web-1",
		"ADVISORY LOCKS", "scheduler", fmt.Sprint(holder.BackendPID()), "waiting", "lease acquire "+pglease.HashKey("job:1"),
		"CONTENTION", "lease "+pglease.HashKey("job:1")+": 1 waiting", "int64:42424242 (scheduler): 1 waiting")
	if strings.Contains(r.stdout, "job:1") || strings.Contains(r.stdout, job.LockID) {
		t.Fatalf("status printed a raw key or lockId without --show-keys:\n%s", r)
	}
	r = run(t, w.url, "", "status", "--show-keys")
	want(t, r, 0, "job:1", "job:old")
	if strings.Contains(r.stdout, job.LockID) {
		t.Fatal("lockId printed")
	}

	var v snapshotView
	waitFor(t, "a JSON status that shows the advisory waiter", func() bool {
		r = run(t, w.url, "", "status", "--json", "--name", "scheduler=int64:42424242")
		want(t, r, 0)
		v = snapshotView{}
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
			t.Fatalf("JSON: %v\n%s", err, r)
		}
		return len(v.Advisory) == 4
	})
	if v.Leases.Total != 2 || v.Leases.Live != 1 || !v.Schema.Current || len(v.Leases.Rows) != 2 {
		t.Fatalf("JSON: %+v", v)
	}
	l := v.Leases.Rows[0]
	if l.KeyHash != pglease.HashKey("job:1") || l.Holder != "billing[42]@web-1" || l.Fence != job.Fence.String() || !l.Live ||
		l.AcquiresWaiting != 1 || l.ExpiresInMs <= 0 || l.Key != "" {
		t.Fatalf("lease row: %+v", l)
	}
	var sawWaiter bool
	for _, a := range v.Advisory {
		if a.Name == "scheduler" && !a.Granted {
			sawWaiter = len(a.BlockedBy) == 1 && a.BlockedBy[0] == holder.BackendPID()
		}
	}
	if !sawWaiter {
		t.Fatalf("advisory waiter not reported blocked by the holder: %+v", v.Advisory)
	}

	// --watch refreshes (bounded by --count); the second shows the grant.
	if err := tx.Rollback(c); err != nil {
		t.Fatal(err)
	}
	if err := <-acqDone; err != nil {
		t.Fatal(err)
	}
	r = run(t, w.url, "", "status", "--watch", "200ms", "--count", "2")
	want(t, r, 0)
	if n := strings.Count(r.stdout, "pglease status"); n != 2 {
		t.Fatalf("--watch --count 2 printed %d snapshots:\n%s", n, r)
	}
}

// inspect shows one key's lease, holder, fence counter; a free key is
// exit 3 with its fence counter.
func TestInspect(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	g := w.acquire(t, "order:7", time.Minute)
	r := run(t, w.url, "", "inspect", "order:7")
	want(t, r, 0, pglease.HashKey("order:7"), "live, expires in")
	wantLines(t, r, `holder\s+billing\[42\]@web-1`, `fence\s+1`, `fence counter\s+1 .*`)
	if ok, err := w.store.Release(ctx(t), g.LockID); err != nil || !ok {
		t.Fatal(ok, err)
	}
	r = run(t, w.url, "", "inspect", "order:7")
	want(t, r, exitNotFound)
	wantLines(t, r, `lease\s+none: free`, `fence counter\s+1 .*`)
	r = run(t, w.url, "", "inspect", "--json", "--show-keys", "never")
	want(t, r, exitNotFound, `"key":"never"`, `"lease":null`, `"fence_counter":null`)
}

// release: refused without --force (saying what the holder will see),
// not done without confirmation, done with it (a revocation: one audit
// line, no raw key, fence counter untouched, the holder's extend fails,
// the next grant fences it out); by lockId; an advisory holder's backend
// terminated.
func TestRelease(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	c := ctx(t)
	g := w.acquire(t, "stuck:1", time.Minute)

	r := run(t, w.url, "", "release", "--key", "stuck:1")
	want(t, r, exitRefused, "refusing", "billing[42]@web-1", "ErrRevoked", "ErrLockLost", "--force", "fence counter is not touched")
	r = run(t, w.url, "n\n", "release", "--key", "stuck:1", "--force")
	want(t, r, exitRefused, "not confirmed")
	r = run(t, w.url, "", "release", "--key", "stuck:1", "--force") // EOF is no
	want(t, r, exitRefused, "not confirmed")
	if info, err := w.store.LookupByKey(c, "stuck:1"); err != nil || info == nil {
		t.Fatalf("refused release released: %v %v", info, err)
	}

	r = run(t, w.url, "y\n", "release", "--key", "stuck:1", "--force")
	want(t, r, 0, "revoked lease "+pglease.HashKey("stuck:1"))
	var audit []map[string]any
	for _, line := range strings.Split(r.stderr, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "pglease release" {
			audit = append(audit, m)
		}
	}
	if len(audit) != 1 || audit[0]["key_hash"] != pglease.HashKey("stuck:1") || audit[0]["result"] != "revoked" ||
		audit[0]["action"] != "revoke_lease" || audit[0]["fence"] != g.Fence.String() {
		t.Fatalf("audit records: %v\n%s", audit, r)
	}
	if strings.Contains(r.stderr, "stuck:1") || strings.Contains(r.stderr, g.LockID) {
		t.Fatalf("raw key or lockId in the output:\n%s", r)
	}
	if e, err := w.store.Extend(c, g.LockID, time.Minute); err != nil || e.OK {
		t.Fatalf("the old holder's Extend after release = %+v, %v; want not OK", e, err)
	}
	if f, ok, err := w.store.FenceCounter(c, "stuck:1"); err != nil || !ok || f != g.Fence {
		t.Fatalf("fence counter %v %v %v, want untouched %v", f, ok, err, g.Fence)
	}
	if n := w.acquire(t, "stuck:1", time.Minute); n.Fence != g.Fence+1 {
		t.Fatalf("next grant fence %v, want %v", n.Fence, g.Fence+1)
	}

	g2 := w.acquire(t, "stuck:2", time.Minute)
	r = run(t, w.url, "", "release", "--lock-id", g2.LockID, "--force", "--yes")
	want(t, r, 0, "revoked lease "+pglease.HashKey("stuck:2"))
	r = run(t, w.url, "", "release", "--lock-id", g2.LockID, "--force", "--yes")
	want(t, r, exitNotFound, "no such lease")
	exp := w.acquire(t, "short", 300*time.Millisecond)
	waitFor(t, "expiry", func() bool { return time.Now().After(exp.ExpiresAt.Add(100 * time.Millisecond)) })
	r = run(t, w.url, "", "release", "--key", "short", "--force", "--yes")
	want(t, r, exitNotFound, "lease "+pglease.HashKey("short")+" expired", "nothing to revoke")

	// An advisory holder's session, terminated; the waiter then gets it.
	holder, err := advisory.Open(c, w.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Close(context.Background()) }()
	lk, err := holder.Lock(c, advisory.Int64(7))
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := advisory.Open(c, w.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = waiter.Close(context.Background()) }()
	got := make(chan error, 1)
	go func() {
		l, err := waiter.Lock(c, advisory.Int64(7))
		if err == nil {
			err = l.Release(c)
		}
		got <- err
	}()
	pid := fmt.Sprint(holder.BackendPID())
	r = run(t, w.url, "", "release", "--pid", pid)
	want(t, r, exitRefused, "holds 1 advisory lock(s): int64:7", "not confirmed")
	r = run(t, w.url, "yes\n", "release", "--pid", pid)
	want(t, r, 0, "terminated backend "+pid, `"action":"terminate_backend"`)
	if err := <-got; err != nil {
		t.Fatalf("waiter after the holder's termination: %v", err)
	}
	select {
	case <-lk.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the terminated holder never saw its lock lost")
	}
	r = run(t, w.url, "", "release", "--pid", pid, "--yes")
	want(t, r, exitNotFound, "holds no advisory lock")
}

// setup, migrate, version and sql, on an empty schema and back.
func TestSchemaCommands(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false)
	r := run(t, w.url, "", "version")
	want(t, r, exitSchema, "database schema version 0", "run `pglease setup`")
	r = run(t, w.url, "", "status")
	want(t, r, exitSchema, "LEASES  none: no lock table", "run `pglease setup`") // no tables at all yet
	r = run(t, w.url, "", "setup")
	want(t, r, 0, fmt.Sprint("schema migrated from version 0 to ", migrate.Latest))
	r = run(t, w.url, "", "setup")
	want(t, r, 0, fmt.Sprint("already at version ", migrate.Latest))
	r = run(t, w.url, "", "version")
	want(t, r, 0, "status: current")
	w.acquire(t, "keep", time.Minute)
	r = run(t, w.url, "", "migrate", "--to", "0")
	want(t, r, 0, fmt.Sprintf("from version %d to 0", migrate.Latest), "tables and fence counters kept")
	r = run(t, w.url, "", "status")
	want(t, r, exitSchema, fmt.Sprint("schema v0, this pglease needs v", migrate.Latest), "1 live") // SyncGuard's tables still show their leases
	r = run(t, w.url, "", "migrate")
	want(t, r, 0, fmt.Sprint("from version 0 to ", migrate.Latest))
	r = run(t, w.url, "", "migrate", "--designs", "--to", "1")
	want(t, r, 0, "design functions installed")
	var id int64
	if err := w.pool.QueryRow(ctx(t), "SELECT email_to_lock_id('a@b.c')").Scan(&id); err != nil {
		t.Fatal(err)
	}
	r = run(t, w.url, "", "migrate", "--designs", "--to", "0")
	want(t, r, 0, "design functions removed")
	// Down to 0 with --drop-tables drops SyncGuard's tables too.
	r = run(t, w.url, "", "migrate", "--to", "0", "--drop-tables")
	want(t, r, 0, fmt.Sprintf("from version %d to 0", migrate.Latest))
	var tables int
	if err := w.pool.QueryRow(ctx(t), "SELECT count(*) FROM pg_class WHERE relnamespace = current_schema()::regnamespace AND relkind = 'r'").Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("%d tables left after migrate --to 0 --drop-tables (%v)", tables, err)
	}
	r = run(t, w.url, "", "setup")
	want(t, r, 0, fmt.Sprint("schema migrated from version 0 to ", migrate.Latest))

	// sql needs no database.
	r = run(t, "-", "", "sql")
	want(t, r, 0, `CREATE TABLE IF NOT EXISTS "syncguard_locks"`, "pglease_schema_")
	r = run(t, "-", "", "sql", "--lock-table", "app.locks", "--fence-table", "app.fences", "migrations", "--down")
	want(t, r, 0, "0002_pglease_functions.down.sql", `"app"."locks_holders"`, "pglease.drop_tables")
	if strings.Index(r.stdout, "0002_") > strings.Index(r.stdout, "0001_") {
		t.Fatal("down migrations not newest first")
	}
	r = run(t, "-", "", "sql", "designs")
	want(t, r, 0, "CREATE OR REPLACE FUNCTION email_to_lock_id")
	r = run(t, "-", "", "sql", "roles")
	want(t, r, 0, `:"runtime_role"`)
	r = run(t, "-", "", "sql", "roles", "--owner", "o", "--runtime", "r", "--schema", "public", "--database", "d")
	want(t, r, 0, `GRANT SELECT, INSERT, UPDATE ON TABLE "public".syncguard_fence_counters TO "r"`)
}

// Bad flags, arguments and connection strings: exit 2 or 1 with a message
// on stderr and nothing on stdout; a password never printed.
func TestBadInvocations(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	for _, tc := range []struct {
		url  string
		args []string
		code int
		msg  string
	}{
		{w.url, nil, exitUsage, "usage: pglease"},
		{w.url, []string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{w.url, []string{"status", "--no-such-flag"}, exitUsage, "flag provided but not defined"},
		{w.url, []string{"--timeout", "x", "status"}, exitUsage, "invalid value"},
		{w.url, []string{"status", "extra"}, exitUsage, "no arguments"},
		{w.url, []string{"status", "--name", "bad"}, exitUsage, "NAME=KEY"},
		{w.url, []string{"status", "--registry", "/nonexistent/reg.json"}, exitUsage, "--registry"},
		{w.url, []string{"status", "--lock-table", "bad name"}, exitUsage, "LockTable"},
		{w.url, []string{"inspect"}, exitUsage, "one KEY"},
		{w.url, []string{"inspect", ""}, exitUsage, "InvalidArgument"},
		{w.url, []string{"release"}, exitUsage, "exactly one of"},
		{w.url, []string{"release", "--key", "a", "--pid", "1"}, exitUsage, "exactly one of"},
		{w.url, []string{"release", "--lock-id", "short"}, exitUsage, "InvalidArgument"},
		{w.url, []string{"migrate", "--to", "9"}, exitUsage, "--to must be"},
		{w.url, []string{"migrate", "--drop-tables"}, exitUsage, "only with --to 0"},
		{w.url, []string{"sql", "tables"}, exitUsage, "unknown"},
		{"-", []string{"status"}, exitUsage, "set DATABASE_URL or --database-url"},
		{"postgres://u:s3cret@[::1", []string{"status"}, exitUsage, "bad connection string"},
		{closedPortURL(t), []string{"status"}, exitFailed, "cannot connect"},
		{closedPortURL(t), []string{"--timeout", "2s", "release", "--key", "k", "--force", "--yes"}, exitFailed, "cannot connect"},
	} {
		r := run(t, tc.url, "", tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.msg) || (tc.code != exitOK && r.stdout != "") {
			t.Errorf("pglease %q: want exit %d and %q on stderr, got:\n%s", tc.args, tc.code, tc.msg, r)
		}
		if strings.Contains(r.stdout+r.stderr, "s3cret") {
			t.Errorf("pglease %q printed the password:\n%s", tc.args, r)
		}
	}
	// --database-url wins over the environment.
	r := run(t, closedPortURL(t), "", "--database-url", w.url, "version")
	want(t, r, 0, "status: current")
	r = run(t, "-", "", "help")
	want(t, r, 0, "exit codes")
}

// closedPortURL is a connection string to a local port nobody listens on,
// with a password.
func closedPortURL(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "postgres://u:s3cret@" + addr + "/db?connect_timeout=2"
}

// --derive and --derive-stdin name the advisory locks a registry pattern
// derives: multi-placeholder patterns from the input as the template
// joins the parts (booking=t1:2025-01-15) or split on --derive-sep, and
// inputs read from stdin, one per line, so they stay out of argv. No
// input is ever printed, in the output or in an error.
func TestDerive(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	c := ctx(t)
	file := filepath.Join(t.TempDir(), "locks.json")
	const registryJSON = `{"locks": [
  {"name": "booking", "pattern": "{tenantId}:{date}", "hash": "fnv1a32"},
  {"name": "balance", "pattern": "{tenantId}:balance:{bookingId}", "hash": "fnv1a32"},
  {"name": "cleanup", "pattern": "{email}", "hash": "sha256"},
  {"name": "scheduler", "key": 42424242}
]}`
	if err := os.WriteFile(file, []byte(registryJSON), 0o600); err != nil {
		t.Fatal(err)
	}
	reg, err := advisory.LoadRegistry(strings.NewReader(registryJSON))
	if err != nil {
		t.Fatal(err)
	}
	keyOf := func(name string, parts ...string) advisory.Key {
		k, err := reg.Derive(name, parts...)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	held := map[string]advisory.Key{ // what each held key must be named
		"booking": keyOf("booking", "tenant-7", "2025-01-15"),
		"balance": keyOf("balance", "tenant-7", "bk:99"), // a part with ':' in it
		"alice":   keyOf("cleanup", "alice@example.com"),
		"bob":     keyOf("cleanup", "bob@example.com"),
	}
	s, err := advisory.Open(c, w.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(context.Background()) }()
	for _, k := range held {
		if _, err := s.Lock(c, k); err != nil {
			t.Fatal(err)
		}
	}
	secrets := []string{"tenant-7", "2025-01-15", "bk:99", "alice", "bob", "example.com"}
	// names runs status --json and returns the name shown for each held key.
	names := func(stdin string, args ...string) map[string]string {
		t.Helper()
		r := run(t, w.url, stdin, append([]string{"status", "--json", "--registry", file}, args...)...)
		want(t, r, 0)
		for _, sec := range secrets {
			if strings.Contains(r.stdout+r.stderr, sec) {
				t.Fatalf("output contains the input %q:\n%s", sec, r)
			}
		}
		var v snapshotView
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
			t.Fatalf("JSON: %v\n%s", err, r)
		}
		byKey := map[string]string{}
		for _, a := range v.Advisory {
			byKey[a.Key] = a.Name
		}
		out := map[string]string{}
		for what, k := range held {
			n, ok := byKey[k.String()]
			if !ok {
				t.Fatalf("status lacks the held key of %s:\n%s", what, r)
			}
			out[what] = n
		}
		return out
	}
	check := func(got map[string]string, wantNames map[string]string) {
		t.Helper()
		for what := range held {
			if got[what] != wantNames[what] {
				t.Fatalf("%s's lock named %q, want %q (all: %v)", what, got[what], wantNames[what], got)
			}
		}
	}

	// Without inputs, the patterns' keys are unnamed (the control).
	check(names(""), map[string]string{})
	// Two placeholders: the input as the template joins the parts; one
	// input from argv, the e-mail addresses from stdin (CRLF, blank lines).
	check(names("alice@example.com\r\n\nbob@example.com\n",
		"--derive", "booking=tenant-7:2025-01-15", "--derive", "balance=tenant-7:balance:bk:99", "--derive-stdin", "cleanup"),
		map[string]string{"booking": "booking", "balance": "balance", "alice": "cleanup", "bob": "cleanup"})
	// --derive-sep: parts split on a separator, from stdin too.
	check(names("tenant-7|2025-01-15\n", "--derive-sep", "|", "--derive", "balance=tenant-7|bk:99", "--derive-stdin", "booking"),
		map[string]string{"booking": "booking", "balance": "balance"})

	// Bad inputs: usage errors that name the line but never the input.
	for _, c := range []struct {
		stdin string
		args  []string
		msg   string
	}{
		{"", []string{"--derive", "booking=tenant-7"}, "does not read as {tenantId}:{date}"},
		{"tenant-7\n", []string{"--derive-stdin", "booking"}, "line 1"},
		{"tenant-7:2025-01-15\n\ntenant-7\n", []string{"--derive-stdin", "booking"}, "line 3"},
		{"", []string{"--derive-sep", ",", "--derive", "booking=tenant-7,2025-01-15,bob"}, "3 parts"},
		{"", []string{"--derive-stdin", "cleanup"}, "no input on stdin"},
		{"alice@example.com\n", []string{"--derive-stdin", "nosuch"}, "no such name"},
		{"", []string{"--derive", "scheduler=alice"}, "fixed key"},
	} {
		r := run(t, w.url, c.stdin, append([]string{"status", "--registry", file}, c.args...)...)
		want(t, r, exitUsage, c.msg)
		for _, sec := range secrets {
			if strings.Contains(r.stdout+r.stderr, sec) {
				t.Fatalf("%v: error output contains the input %q:\n%s", c.args, sec, r)
			}
		}
	}
}
