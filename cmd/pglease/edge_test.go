package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/election"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/advisory"
	"github.com/pglease/pglease/pg/migrate"
)

// withPassword returns url with password pw in it (pgtest's clusters
// use trust authentication: the password is sent and ignored), or the
// URL's own password when it has one (a DATABASE_URL given to the tests).
func withPassword(t *testing.T, raw, pw string) (string, string) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Skip("the test database's connection string is not a URL")
	}
	if p, ok := u.User.Password(); ok {
		if len(p) < 6 {
			t.Skip("the test database's password is too short to look for in the output")
		}
		return raw, p
	}
	u.User = url.UserPassword(u.User.Username(), pw)
	return u.String(), pw
}

// The connection string's password is printed nowhere: not in the
// usage (a flag's default), not in a parse or connect error, not in
// status (text or JSON, with shared holds), inspect, release's audit
// records (revoke, request), version, setup or migrate; nor is a lockId. Every command's usage, success and error path is run
// with a distinctive password in DATABASE_URL (or --database-url).
func TestNoPasswordPrinted(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	c := ctx(t)
	const secret = "Pw-7731zq-DoNotPrint"
	u, pw := withPassword(t, w.url, secret)
	// LockIds are printed nowhere either (every case below is scanned).
	lockIDs := []string{
		w.acquire(t, "secret:1", time.Minute).LockID,
		w.acquire(t, "secret:2", time.Minute).LockID,
		w.acquire(t, "secret:3", time.Minute).LockID,
		w.share(t, "reader[1]@x", "secret:rw", 0).LockID,
		w.share(t, "worker[1]@x", "secret:sem", 2).LockID,
	}
	holder, err := advisory.Open(c, w.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Close(context.Background()) }()
	if _, err := holder.Lock(c, advisory.Int64(77311)); err != nil {
		t.Fatal(err)
	}
	pid := fmt.Sprint(holder.BackendPID())
	closed := strings.Replace(closedPortURL(t), "s3cret", pw, 1)

	type tc struct {
		url, stdin string
		args       []string
	}
	var cases []tc
	for _, cmd := range []string{"status", "inspect", "release", "setup", "migrate", "version", "sql", "help"} {
		cases = append(cases,
			tc{u, "", []string{cmd, "--bogus"}},
			tc{u, "", []string{cmd, "-h"}},
			tc{u, "", []string{"--database-url", u, cmd, "--bogus"}},
			tc{"-", "", []string{"--database-url", u, cmd, "-h"}},
		)
	}
	cases = append(cases,
		tc{u, "", nil},
		tc{u, "", []string{"--bogus"}},
		tc{u, "", []string{"-h"}},
		tc{u, "", []string{"frobnicate"}},
		tc{u, "", []string{"status"}},
		tc{u, "", []string{"status", "--json", "--show-keys"}},
		tc{u, "", []string{"status", "--watch", "100ms", "--count", "2"}},
		tc{u, "", []string{"inspect", "secret:1"}},
		tc{u, "", []string{"inspect", "--json", "--show-keys", "secret:1"}},
		tc{u, "", []string{"inspect", "nosuch"}},
		tc{u, "", []string{"release", "--key", "secret:1"}},
		tc{u, "n\n", []string{"release", "--key", "secret:1", "--force"}},
		tc{u, "", []string{"release", "--key", "secret:1", "--force", "--yes"}}, // the audit record
		tc{u, "", []string{"inspect", "secret:rw"}},
		tc{u, "", []string{"inspect", "--json", "secret:sem"}},
		tc{u, "", []string{"release", "--key", "secret:sem", "--request"}}, // the audit record
		tc{u, "", []string{"release", "--key", "secret:2", "--request"}},
		tc{u, "", []string{"release", "--key", "secret:nobody", "--request"}},
		tc{u, "", []string{"release", "--key", "secret:rw", "--force", "--yes"}}, // shared holds only
		tc{u, "", []string{"release", "--key", "secret:2", "--force", "--yes", "--delay", "1s"}},
		tc{u, "", []string{"release", "--key", "secret:3", "--delay", "1s"}}, // the refusal
		tc{u, "", []string{"release", "--key", "secret:1", "--delay", "-1s"}},
		tc{u, "", []string{"release", "--pid", pid}},
		tc{u, "", []string{"release", "--pid", pid, "--yes"}}, // the audit record
		tc{u, "", []string{"version"}},
		tc{u, "", []string{"setup"}},                // the runtime role may not: a server error
		tc{u, "", []string{"migrate", "--to", "1"}}, // likewise
		tc{u, "", []string{"status", "--limit", "-1"}},
		tc{u, "", []string{"--timeout", "1ns", "status"}},
		tc{closed, "", []string{"status"}},
		tc{closed, "", []string{"--timeout", "2s", "version"}},
		// Connection strings pgx cannot parse, which its errors quote.
		tc{"postgres://u:" + pw + "@[::1", "", []string{"status"}},
		tc{"postgres://u:" + pw + "@host:badport/db", "", []string{"status"}},
		tc{"postgresql://u:" + pw + "@h/db?connect_timeout=x", "", []string{"inspect", "k"}},
		tc{"postgres://u@h/db?password=" + pw + "&sslmode=bogus", "", []string{"status"}},
		tc{"host=h password = " + pw + " port=bad", "", []string{"status"}},
		tc{"host=h password='" + pw + " x' port=bad", "", []string{"status"}},
		tc{"host=h password=" + pw + " nokeyword", "", []string{"status"}},
		tc{"u:" + pw + "@h/db", "", []string{"status"}},
		// An unencoded '@' in the password: the rest of it would be read
		// as the host, and a connect error would print that.
		tc{"postgres://u:" + pw + "@x@127.0.0.1:1/db?connect_timeout=2", "", []string{"status"}},
		tc{"postgres://u:x@" + pw + "@127.0.0.1:1/db?connect_timeout=2", "", []string{"status"}},
	)
	for _, tc := range cases {
		r := run(t, tc.url, tc.stdin, tc.args...)
		out := r.stdout + r.stderr
		if strings.Contains(out, pw) || strings.Contains(out, url.QueryEscape(pw)) {
			t.Errorf("pglease %q printed the password:\n%s", tc.args, r)
		}
		for _, id := range lockIDs {
			if strings.Contains(out, id) {
				t.Errorf("pglease %q printed a lockId:\n%s", tc.args, r)
			}
		}
		// The last two cases' password parts.
		if strings.Contains(tc.url, "@x@") && strings.Contains(out, "x@127") {
			t.Errorf("pglease %q printed a part of the password:\n%s", tc.args, r)
		}
	}
}

// A missing schema is exit 5 with `pglease setup` named, from every
// command that needs it: status (no tables at all), inspect, release
// (no tables; SyncGuard's tables without pglease's functions), version.
func TestMissingSchemaExit5(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false)
	c := ctx(t)
	for _, args := range [][]string{
		{"status"},
		{"status", "--json"},
		{"inspect", "k"},
		{"release", "--key", "k", "--force", "--yes"},
		{"version"},
	} {
		r := run(t, w.url, "", args...)
		want(t, r, exitSchema, "run `pglease setup`")
		if strings.Contains(r.stdout+r.stderr, "SetupSchema") {
			t.Errorf("pglease %q gave library advice to an operator:\n%s", args, r)
		}
	}
	// SyncGuard's tables alone (pglease's functions removed): release of a
	// lease SyncGuard wrote needs pglease's functions.
	want(t, run(t, w.url, "", "setup"), 0)
	want(t, run(t, w.url, "", "migrate", "--to", "0"), 0)
	if _, err := w.pool.Exec(c, `INSERT INTO syncguard_locks (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key)
		VALUES ('sg:1', 'AAAAAAAAAAAAAAAAAAAAAA', floor(extract(epoch FROM now()) * 1000)::bigint + 60000,
		floor(extract(epoch FROM now()) * 1000)::bigint, '000000000000001', 'sg:1')`); err != nil {
		t.Fatal(err)
	}
	r := run(t, w.url, "", "release", "--key", "sg:1", "--force", "--yes")
	want(t, r, exitSchema, "run `pglease setup`")
	r = run(t, w.url, "", "inspect", "sg:1") // reading needs only the tables
	want(t, r, 0, pglease.HashKey("sg:1"))
}

// status without the lease tables (a database that uses advisory locks
// only) shows the advisory locks and says what is missing; with them, it
// says whether the release trigger is installed.
func TestStatusAdvisoryOnly(t *testing.T) {
	t.Parallel()
	w := newWorld(t, false)
	c := ctx(t)
	s, err := advisory.Open(c, w.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(context.Background()) }()
	if _, err := s.Lock(c, advisory.Int64(55001)); err != nil {
		t.Fatal(err)
	}
	r := run(t, w.url, "", "status", "--name", "billing=int64:55001")
	want(t, r, exitSchema, "int64:55001", "billing", fmt.Sprint(s.BackendPID()),
		"MISSING  lock table syncguard_locks, fence counter table syncguard_fence_counters",
		"LEASES  none: no lock table", "run `pglease setup`")
	r = run(t, w.url, "", "status", "--json")
	want(t, r, exitSchema)
	var v struct {
		Schema struct {
			LockTable      *bool    `json:"lock_table"`
			FenceTable     *bool    `json:"fence_table"`
			ReleaseTrigger *bool    `json:"release_trigger"`
			Missing        []string `json:"missing"`
		}
		Leases struct {
			Rows json.RawMessage
		}
		Advisory []struct{ Key string }
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("JSON: %v\n%s", err, r)
	}
	found := false
	for _, a := range v.Advisory {
		found = found || a.Key == "int64:55001"
	}
	if !found || v.Schema.LockTable == nil || v.Schema.FenceTable == nil || v.Schema.ReleaseTrigger == nil ||
		*v.Schema.LockTable || *v.Schema.FenceTable || *v.Schema.ReleaseTrigger ||
		len(v.Schema.Missing) == 0 || string(v.Leases.Rows) != "[]" {
		t.Fatalf("JSON without lease tables: %+v\n%s", v, r)
	}

	// With the schema: the release trigger, not installed, then installed.
	want(t, run(t, w.url, "", "setup"), 0)
	r = run(t, w.url, "", "status")
	want(t, r, 0, "RELEASE TRIGGER  not installed for channel pglease_release (optional")
	if strings.Contains(r.stdout, "MISSING") {
		t.Fatalf("status calls the optional release trigger missing:\n%s", r)
	}
	mg, err := migrate.New(w.pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := mg.SetupReleaseTrigger(c, manager.DefaultNotifyChannel); err != nil {
		t.Fatal(err)
	}
	r = run(t, w.url, "", "status")
	want(t, r, 0, "RELEASE TRIGGER  installed (channel pglease_release)")
	if strings.Contains(r.stdout, "MISSING") {
		t.Fatalf("a complete schema reported missing parts:\n%s", r)
	}
	r = run(t, w.url, "", "status", "--notify-channel", "other_channel")
	want(t, r, 0, "RELEASE TRIGGER  not installed for channel other_channel")
	r = run(t, w.url, "", "status", "--json")
	want(t, r, 0, `"release_trigger":true`, `"lock_table":true`, `"missing":[]`)
}

// Managers waiting for a lease held elsewhere (two election candidates)
// hold its waiter lock: status counts and labels them by the key's hash
// (the raw key only with --show-keys), and counts them as contention;
// inspect shows them too.
func TestStatusWaitingManagers(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	c := ctx(t)
	const key = "elect:billing-cron"
	hash := pglease.HashKey(key)
	w.acquire(t, key, time.Minute) // a leader that is no candidate: both candidates wait
	ectx, cancel := context.WithCancel(c)
	var started atomic.Int32
	for i := range 2 {
		m, err := manager.Open(c, w.url, manager.Config{Config: pg.Config{Holder: fmt.Sprintf("candidate-%d", i)}})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = m.Close(context.Background()) }()
		go func() {
			_ = election.Run(ectx, m, election.Config{Name: key, TTL: 10 * time.Second}, func(ctx context.Context, _ *election.Term) error {
				started.Add(1)
				<-ctx.Done()
				return nil
			})
		}()
	}
	defer cancel() // before the Managers close
	waitFor(t, "both candidates' waiter locks", func() bool {
		var n int
		err := w.pool.QueryRow(c, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::int4::oid "+
			"AND objsubid = 2 AND objid = hashtext($2)::oid AND granted", store.WaiterLockClass, key).Scan(&n)
		return err == nil && n == 2
	})
	r := run(t, w.url, "", "status")
	want(t, r, 0, "WAITING MANAGERS  2 on 1 key(s)", "waiting Manager: lease "+hash)
	if strings.Contains(r.stdout, "CONTENTION  none") || strings.Contains(r.stdout, key) {
		t.Fatalf("status:\n%s", r)
	}
	// The contention line (an attempt of a candidate may be waiting in
	// the database at that instant too), and the lease row's MANAGERS
	// WAITING column.
	if !regexp.MustCompile(`(?m)^  lease ` + regexp.QuoteMeta(hash) + `: (.*; )?2 waiting Manager\(s\)$`).MatchString(r.stdout) {
		t.Fatalf("contention does not count 2 waiting Managers:\n%s", r)
	}
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(hash) + `\s.*\s\d+\s+2$`).MatchString(r.stdout) {
		t.Fatalf("the lease row does not count 2 waiting Managers:\n%s", r)
	}
	r = run(t, w.url, "", "status", "--show-keys")
	want(t, r, 0)
	// Each waiting Manager by backend pid and identity (its holder
	// identity as application_name).
	if !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(key)+`\s+2\s+\d+ candidate-\d, \d+ candidate-\d$`).MatchString(r.stdout) ||
		!strings.Contains(r.stdout, "candidate-0") || !strings.Contains(r.stdout, "candidate-1") {
		t.Fatalf("--show-keys: no WAITING MANAGERS row with the key and both candidates' identities:\n%s", r)
	}

	r = run(t, w.url, "", "status", "--json")
	want(t, r, 0)
	var v struct {
		Leases struct {
			Rows []struct {
				KeyHash         string `json:"key_hash"`
				ManagersWaiting int    `json:"managers_waiting"`
			}
		}
		WaitingManagers []struct {
			KeyHashes []string `json:"key_hashes"`
			Keys      []string `json:"keys"`
			Managers  int
			PIDs      []int32 `json:"pids"`
		} `json:"waiting_managers"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("JSON: %v\n%s", err, r)
	}
	if len(v.WaitingManagers) != 1 || v.WaitingManagers[0].Managers != 2 || len(v.WaitingManagers[0].PIDs) != 2 ||
		len(v.WaitingManagers[0].KeyHashes) != 1 || v.WaitingManagers[0].KeyHashes[0] != hash || v.WaitingManagers[0].Keys != nil {
		t.Fatalf("waiting_managers: %+v\n%s", v.WaitingManagers, r)
	}
	if len(v.Leases.Rows) != 1 || v.Leases.Rows[0].KeyHash != hash || v.Leases.Rows[0].ManagersWaiting != 2 {
		t.Fatalf("lease rows: %+v\n%s", v.Leases.Rows, r)
	}
	r = run(t, w.url, "", "inspect", key)
	want(t, r, 0, "waiting Managers", "2 (listening sessions' pids")
	if started.Load() != 0 {
		t.Fatal("a candidate led while the lease was held")
	}
}

// version needs no database and prints the binary's version (its main
// module's, as the go command recorded it) and the schema version it
// needs; with a database, the schema's too.
func TestVersion(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	out, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*mod\s+github\.com/pglease/pglease\s+(\S+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("go version -m: no main module:\n%s", out)
	}
	r := run(t, "-", "", "version")
	want(t, r, 0, "pglease "+string(m[1])+"\n", fmt.Sprintf("needs schema version %d\n", migrate.Latest))
	r = run(t, w.url, "", "version")
	want(t, r, 0, "pglease "+string(m[1])+"\n", fmt.Sprintf("database schema version %d", migrate.Latest), "status: current")
}

// JSON lists are [] when empty, never null.
func TestJSONEmptyLists(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	r := run(t, w.url, "", "status", "--json")
	want(t, r, 0, `"rows":[]`, `"waiting_managers":[`, `"shared":{"live":0,"keys":0,"rows":[]}`, `"marks":[]`,
		`"watching_managers":[`, `"guarded_tables":[]`) // other tests' watchers may show (advisory locks are the database's)
	r = run(t, w.url, "", "inspect", "--json", "none")
	want(t, r, exitNotFound, `"acquires_in_progress":[]`, `"waiting_manager_pids":[]`, `"holders":[]`, `"marks":[]`,
		`"watching_manager_pids":[]`, `"guarded_tables":[]`)
	if n := strings.Count(r.stdout, "null"); n != 2 { // "lease" and "fence_counter"
		t.Fatalf("%d nulls, want 2 (lease and fence_counter):\n%s", n, r)
	}
}

// inspect's values start in one column (text/tabwriter).
func TestInspectAligned(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	w.acquire(t, "align:1", time.Minute)
	r := run(t, w.url, "", "inspect", "align:1")
	want(t, r, 0)
	labels := []string{"key", "fence counter", "lease", "holder", "fence", "acquired", "expires", "acquires in progress", "waiting Managers"}
	col := -1
	seen := 0
	for _, line := range strings.Split(r.stdout, "\n") {
		for _, l := range labels {
			rest, ok := strings.CutPrefix(line, l+" ")
			if !ok || (l == "fence" && strings.HasPrefix(rest, "counter")) || (l == "lease" && line == "") {
				continue
			}
			c := len(line) - len(strings.TrimLeft(rest, " "))
			if col == -1 {
				col = c
			}
			if c != col {
				t.Fatalf("inspect's value of %q starts at column %d, the first at %d:\n%s", l, c, col, r)
			}
			seen++
			break
		}
	}
	if seen < 8 {
		t.Fatalf("inspect printed %d of the labels %q:\n%s", seen, labels, r)
	}
}

// Every flag is checked before any connection: a bad one is exit 2, and
// the database (here a listener that counts connections) is never
// reached.
func TestBadFlagsNoConnection(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var conns atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			c.Close()
		}
	}()
	u := "postgres://u:pw@" + l.Addr().String() + "/db?connect_timeout=2"
	for _, args := range [][]string{
		{"status", "--limit", "-1"},
		{"status", "--limit", "10001"},
		{"status", "--limit", "0"},
		{"inspect", "--limit", "-1", "k"},
		{"status", "--count", "-1", "--watch", "1s"},
		{"status", "--count", "2"},
		{"status", "--watch", "1ms"},
		{"status", "--notify-channel", "bad-name"},
		{"inspect", "--notify-channel", "bad name", "k"},
		{"--timeout", "0", "status"},
		{"--timeout", "-1s", "version"},
		{"version", "--lock-table", "a.b.c"},
		{"status", "--lock-table", "bad name"},
		{"inspect", "--fence-table", "a.b.c", "k"},
		{"release", "--pid", "-1"},
		{"release", "--key", "k", "--lock-id", "x"},
		{"release", "--key", "k", "--delay", "-1s"},
		{"release", "--key", "k", "--delay", "1500us"},
		{"release", "--key", "k", "--delay", "soon"},
		{"release", "--pid", "5", "--delay", "1s"},
		{"release", "--request"},
		{"release", "--lock-id", "AAAAAAAAAAAAAAAAAAAAAA", "--request"},
		{"release", "--key", "k", "--request", "--delay", "1s"},
		{"release", "--key", "k", "--request", "--force"},
		{"release", "--key", "k", "--notify-channel", "bad-name"},
		{"migrate", "--to", "-1"},
		{"setup", "extra"},
		{"version", "extra"},
	} {
		r := run(t, u, "", args...)
		if r.code != exitUsage {
			t.Errorf("pglease %q: want exit %d, got:\n%s", args, exitUsage, r)
		}
	}
	// A connection the listener accepted would be counted by now: each
	// run above has exited.
	time.Sleep(100 * time.Millisecond)
	if n := conns.Load(); n != 0 {
		t.Fatalf("%d connection(s) made for bad flags", n)
	}
	// The control: a good invocation does connect.
	r := run(t, u, "", "status")
	want(t, r, exitFailed, "cannot connect")
	waitFor(t, "the control's connection", func() bool { return conns.Load() > 0 })
}
