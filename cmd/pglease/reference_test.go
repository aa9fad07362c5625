package main

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/advisory"
	"github.com/pglease/pglease/pg/migrate"
)

// TestSameOutputAsReference runs this binary and a reference one (another
// build of this command, named by $PGLEASE_CLI_REFERENCE, e.g. the last
// release's) on the same database state, command by command, and fails
// when their outputs or exit codes differ, times and durations aside: a
// restructuring of the command must not change what it prints. Skipped
// without a reference binary.
func TestSameOutputAsReference(t *testing.T) {
	ref := os.Getenv("PGLEASE_CLI_REFERENCE")
	if ref == "" {
		t.Skip("set PGLEASE_CLI_REFERENCE to a pglease binary to compare this one with")
	}
	w := newWorld(t, true)
	c := ctx(t)
	const (
		live, rw, sem, revoked, expired, delayed, watched, waited, free = "ref:live", "ref:rw", "ref:sem", "ref:revoked", "ref:expired",
			"ref:delayed", "ref:watched", "ref:waited", "ref:free"
	)
	w.acquire(t, live, 10*time.Minute)
	w.share(t, "reader[101]@web-1", rw, 0)
	w.share(t, "reader[102]@web-2", rw, 0)
	w.share(t, "worker[201]@job-1", sem, 3)
	w.share(t, "worker[202]@job-2", sem, 3)
	w.acquire(t, revoked, time.Minute)
	if res, err := w.store.Revoke(c, []store.RevokeRequest{{Key: revoked, Delay: time.Hour}}); err != nil || res[0].Revoked != 1 {
		t.Fatalf("Revoke = %v, %v", res, err)
	}
	ex, err := w.store.Acquire(c, store.AcquireRequest{Key: expired, TTL: 200 * time.Millisecond, LockDelay: time.Hour})
	if err != nil || !ex.OK {
		t.Fatal(ex, err)
	}
	if dl, err := w.store.Acquire(c, store.AcquireRequest{Key: delayed, TTL: time.Minute, LockDelay: 30 * time.Second}); err != nil || !dl.OK {
		t.Fatal(dl, err)
	}
	wconn, err := w.pool.Acquire(c)
	if err != nil {
		t.Fatal(err)
	}
	defer wconn.Release()
	if ok, err := store.RegisterWatchers(c, wconn.Conn(), []string{watched}); err != nil || !ok[0] {
		t.Fatal(ok, err)
	}
	if ok, err := store.RegisterWaiters(c, wconn.Conn(), []string{waited}); err != nil || !ok[0] {
		t.Fatal(ok, err)
	}
	w.acquire(t, watched, 10*time.Minute)
	w.acquire(t, waited, 10*time.Minute)
	owner, err := pgxpool.New(c, w.ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	if _, err := owner.Exec(c, "CREATE TABLE ref_orders (order_key text PRIMARY KEY, qty int)"); err != nil {
		t.Fatal(err)
	}
	mg, err := migrate.New(owner, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := mg.Guard(c, "ref_orders", "order_key"); err != nil {
		t.Fatal(err)
	}
	// An advisory holder and a waiter behind it.
	s1, err := advisory.Open(c, w.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s1.Close(context.Background()) }()
	if _, err := s1.Lock(c, advisory.Int64(66001)); err != nil {
		t.Fatal(err)
	}
	s2, err := advisory.Open(c, w.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s2.Close(context.Background()) }()
	wctx, cancel := context.WithCancel(c)
	defer cancel()
	go func() { _, _ = s2.Lock(wctx, advisory.Int64(66001)) }()
	waitFor(t, "the advisory waiter", func() bool {
		return strings.Contains(run(t, w.url, "", "status").stdout, ", 1 waiting")
	})
	waitFor(t, "the expired lease past the tolerance", func() bool { return time.Now().After(ex.ExpiresAt.Add(1200 * time.Millisecond)) })

	var cmds [][]string
	for _, a := range [][]string{{}, {"--json"}, {"--show-keys"}, {"--json", "--show-keys"}, {"--limit", "2"}, {"--name", "billing=int64:66001"}} {
		cmds = append(cmds, append([]string{"status"}, a...))
	}
	for _, k := range []string{live, rw, sem, revoked, expired, delayed, watched, waited, free} {
		cmds = append(cmds, []string{"inspect", k}, []string{"inspect", "--json", k}, []string{"inspect", "--show-keys", k},
			[]string{"inspect", "--json", "--show-keys", k})
	}
	cmds = append(cmds,
		[]string{}, []string{"help"}, []string{"nope"}, []string{"--bad"}, []string{"-h"},
		[]string{"status", "--watch", "200ms", "--count", "2"}, []string{"status", "--watch", "200ms", "--count", "2", "--json"},
		[]string{"status", "--limit", "0"}, []string{"status", "x"}, []string{"status", "--watch", "1ms"}, []string{"status", "--count", "2"},
		[]string{"status", "--notify-channel", "bad-channel"}, []string{"status", "--name", "x"}, []string{"status", "--derive", "x"},
		[]string{"inspect"}, []string{"inspect", "a", "b"}, []string{"inspect", ""},
		[]string{"release"}, []string{"release", "--key", live}, []string{"release", "--key", sem}, []string{"release", "--key", expired},
		[]string{"release", "--key", revoked}, []string{"release", "--key", free}, []string{"release", "--key", free, "--request"},
		[]string{"release", "--key", live, "--force"}, []string{"release", "--lock-id", "nope"}, []string{"release", "--pid", "-1"},
		[]string{"release", "--pid", "1", "--delay", "1s"}, []string{"release", "--request", "--lock-id", "x"},
		[]string{"release", "--key", live, "--hold", "zz"}, []string{"release", "--key", live, "--delay", "1500us"},
		[]string{"release", "--key", live, "--notify-channel", "a-b"}, []string{"release", "--pid", "999999", "--yes"},
		[]string{"version"}, []string{"version", "x"}, []string{"setup", "x"}, []string{"migrate", "--to", "99"},
		[]string{"migrate", "--designs", "--to", "3"}, []string{"migrate", "--drop-tables"},
		[]string{"sql"}, []string{"sql", "migrations"}, []string{"sql", "migrations", "--down"}, []string{"sql", "designs"},
		[]string{"sql", "roles"}, []string{"sql", "roles", "--owner", "o", "--runtime", "r", "--schema", "s", "--database", "d"},
		[]string{"sql", "nope"}, []string{"sql", "a", "b"},
		[]string{"doctor"}, []string{"doctor", "--json"}, []string{"doctor", "x"}, []string{"doctor", "--role", "nobody"},
		[]string{"serve", "--json"}, []string{"serve", "--interval", "1ms"}, []string{"serve", "--token-file", "x"},
		[]string{"serve", "--allow-revoke"}, []string{"serve", "--addr", "nope"}, []string{"serve", "x"},
		[]string{"--timeout", "0", "status"}, []string{"--lock-table", "bad name", "status"},
	)
	for _, name := range []string{"status", "inspect", "release", "setup", "migrate", "version", "sql", "doctor", "serve"} {
		cmds = append(cmds, []string{name, "-h"})
	}
	t.Logf("%d invocations compared", len(cmds))
	for _, args := range cmds {
		var got, wantR result
		same := false
		for range 3 { // the state may change between the two runs (an expiry): again
			wantR = runBinary(t, ref, w.url, args...)
			got = run(t, w.url, "", args...)
			if normalizeOutput(got) == normalizeOutput(wantR) {
				same = true
				break
			}
		}
		if !same {
			t.Errorf("pglease %s: output differs from the reference\n--- reference\n%s\n--- this binary\n%s", strings.Join(args, " "), wantR, got)
		}
	}
}

// runBinary runs the binary at path as run runs the one under test.
func runBinary(t *testing.T, path, url string, args ...string) result {
	t.Helper()
	saved := bin
	bin = path
	defer func() { bin = saved }()
	return run(t, url, "", args...)
}

var (
	refTimes     = regexp.MustCompile(`\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?(Z| UTC)`)
	refDurations = regexp.MustCompile(`-?\d+(\.\d+)?(h\d+m\d+s|m\d+s|ms|s)\b`)
	refMs        = regexp.MustCompile(`(_ms"):\s*-?\d+`)
	refClock     = regexp.MustCompile(`ahead of|behind`)
	refAudit     = regexp.MustCompile(`"time":"[^"]*"`)
)

// normalizeOutput is r with its times, durations and millisecond counts
// replaced, which differ between two runs on the same state.
func normalizeOutput(r result) string {
	s := r.String()
	s = refAudit.ReplaceAllString(s, `"time":T`)
	s = refTimes.ReplaceAllString(s, "T")
	s = refDurations.ReplaceAllString(s, "D")
	s = refMs.ReplaceAllString(s, "${1}:N")
	s = refClock.ReplaceAllString(s, "ahead/behind")
	return s
}
