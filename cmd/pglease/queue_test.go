package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/manager"
)

// queuer is one waiting process of the queue tests: a pool of its own,
// a Store with its holder identity, its queue channel.
type queuer struct {
	holder string
	s      *store.Store
	ch     string
}

func newQueuer(t *testing.T, w *world, holder string) *queuer {
	t.Helper()
	pool, err := pgxpool.New(ctx(t), w.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := store.New("pg.New", pool, store.Config{Holder: holder, NotifyChannel: manager.DefaultNotifyChannel})
	if err != nil {
		t.Fatal(err)
	}
	return &queuer{holder: holder, s: s, ch: store.QueueChannel()}
}

// wait enqueues reqs (each with a new lockId) for a minute and wants
// each refused at position pos[i]; it returns the lockIds.
func (q *queuer) wait(t *testing.T, reqs []store.WaitRequest, pos ...int) []string {
	t.Helper()
	ids := make([]string, len(reqs))
	for i := range reqs {
		ids[i] = keys.NewLockID()
		reqs[i].LockID, reqs[i].TTL = ids[i], time.Minute
	}
	res, err := q.s.QueueWait(ctx(t), reqs, q.ch, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.OK || r.Position != pos[i] {
			t.Fatalf("%s's ticket %d: granted %v at position %d, want queued at %d", q.holder, i, r.OK, r.Position, pos[i])
		}
	}
	return ids
}

// status, inspect (text and JSON) and serve's state list each key's fair
// queue in arrival order, tickets enqueued by four processes (pools of
// their own): position, holder identity, mode (exclusive, reader, permit
// of a limit, a set's key), since when, the lockId's hash; keys as
// hashes unless --show-keys, lockIds never. A ticket that expires leaves
// the line at once (its row still in the table: the CLI applies the
// queue's rule), and the tickets behind it move up.
func TestStatusQueue(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	c := ctx(t)
	const mx, other, sem = "queue:mutex-secret-1", "queue:set-secret-2", "queue:sem-secret-3"
	h := pglease.HashKey
	held := w.acquire(t, mx, time.Minute)
	permit := w.share(t, "worker[9]@job-9", sem, 1) // the semaphore of 1 is full
	qa, qb := newQueuer(t, w, "qa[1]@host-a"), newQueuer(t, w, "qb[2]@host-b")
	qc, qd := newQueuer(t, w, "qc[3]@host-c"), newQueuer(t, w, "qd[4]@host-d")
	a := qa.wait(t, []store.WaitRequest{{Key: mx}}, 1)
	cc := qc.wait(t, []store.WaitRequest{{Key: mx}}, 2)
	b := qb.wait(t, []store.WaitRequest{{Key: mx, Shared: true}, {Key: sem, Shared: true, Limit: 1}}, 3, 1)
	// A set of two keys: refused as a whole (mx is held), queued on both.
	d := qd.wait(t, []store.WaitRequest{{Key: other, Set: 1}, {Key: mx, Set: 1}}, 1, 4)
	ids := []string{a[0], cc[0], b[0], b[1], d[0], d[1]}
	secrets := append([]string{mx, other, sem, held.LockID, permit.LockID}, ids...)
	line := func(key, pos, holder, mode string) string {
		return regexp.QuoteMeta(key) + `\s+` + pos + `\s+` + regexp.QuoteMeta(holder) + `\s+` + regexp.QuoteMeta(mode) +
			`\s+\d+\.\ds ago\s+in \S+`
	}

	r := run(t, w.url, "", "status")
	want(t, r, 0, "QUEUE  6 waiting in line for 3 key(s): served in this order",
		"lease "+h(mx)+": 4 in line (fair queue), longest ")
	wantLines(t, r,
		line(h(mx), "1 of 4", "qa[1]@host-a", "exclusive"),
		line(h(mx), "2 of 4", "qc[3]@host-c", "exclusive"),
		line(h(mx), "3 of 4", "qb[2]@host-b", "reader"),
		line(h(mx), "4 of 4", "qd[4]@host-d", "set"),
		line(h(other), "1 of 1", "qd[4]@host-d", "set"),
		line(h(sem), "1 of 1", "qb[2]@host-b", "permit (of 1)"),
	)
	if i, j := strings.Index(r.stdout, "1 of 4"), strings.Index(r.stdout, "4 of 4"); i < 0 || j < i {
		t.Fatalf("the queue of %s is not in order:\n%s", h(mx), r)
	}
	noSecrets(t, r, secrets...)

	r = run(t, w.url, "", "status", "--show-keys")
	want(t, r, 0)
	wantLines(t, r, line(mx, "1 of 4", "qa[1]@host-a", "exclusive"), line(other, "1 of 1", "qd[4]@host-d", "set"),
		line(sem, "1 of 1", "qb[2]@host-b", "permit (of 1)"))
	noSecrets(t, r, append([]string{held.LockID, permit.LockID}, ids...)...)

	// wantQueue checks one key's queue in JSON: holders, modes and
	// lockIds in order, positions 1.., waits that shrink along the line.
	type ticket struct{ holder, mode, id string }
	wantQueue := func(what string, got []queuedView, want ...ticket) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d tickets, want %d: %+v", what, len(got), len(want), got)
		}
		for i, x := range want {
			g := got[i]
			if g.Position != i+1 || g.Holder != x.holder || g.Mode != x.mode || g.LockIDHash != h(x.id) ||
				g.ExpiresInMs <= 0 || g.WaitingMs < 0 || (i > 0 && g.WaitingMs > got[i-1].WaitingMs) ||
				time.Since(g.Since) > time.Minute {
				t.Fatalf("%s: ticket %d = %+v, want position %d, %s, %s, lockId hash %s", what, i, g, i+1, x.holder, x.mode, h(x.id))
			}
		}
	}
	mxQueue := []ticket{{"qa[1]@host-a", "exclusive", a[0]}, {"qc[3]@host-c", "exclusive", cc[0]},
		{"qb[2]@host-b", "reader", b[0]}, {"qd[4]@host-d", "set", d[1]}}
	statusJSON := func() snapshotView {
		t.Helper()
		r := run(t, w.url, "", "status", "--json")
		want(t, r, 0)
		noSecrets(t, r, secrets...)
		var v snapshotView
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
			t.Fatalf("JSON: %v\n%s", err, r)
		}
		if !v.Schema.QueueTable {
			t.Fatalf("queue_table false on a current schema:\n%s", r)
		}
		return v
	}
	queueOf := func(v snapshotView, key string) queueKeyView {
		t.Helper()
		for _, g := range v.Queue.Rows {
			if g.KeyHash == h(key) {
				return g
			}
		}
		t.Fatalf("no queue of %s in %+v", h(key), v.Queue)
		return queueKeyView{}
	}
	v := statusJSON()
	if v.Queue.Tickets != 6 || v.Queue.Keys != 3 {
		t.Fatalf("queue counts %d tickets on %d keys, want 6 on 3", v.Queue.Tickets, v.Queue.Keys)
	}
	wantQueue("status --json, "+mx, queueOf(v, mx).Tickets, mxQueue...)
	wantQueue("status --json, "+other, queueOf(v, other).Tickets, ticket{"qd[4]@host-d", "set", d[0]})
	wantQueue("status --json, "+sem, queueOf(v, sem).Tickets, ticket{"qb[2]@host-b", "permit", b[1]})
	if g := queueOf(v, sem).Tickets[0]; g.Limit != 1 {
		t.Fatalf("the permit's ticket shows limit %d, want 1", g.Limit)
	}
	if len(v.Leases.Rows) != 1 || v.Leases.Rows[0].Queued != 4 {
		t.Fatalf("the lease row of %s: %+v, want 4 queued", h(mx), v.Leases.Rows)
	}
	if len(v.Shared.Rows) != 1 || v.Shared.Rows[0].Queued != 1 {
		t.Fatalf("the shared holds of %s: %+v, want 1 queued", h(sem), v.Shared.Rows)
	}

	r = run(t, w.url, "", "inspect", mx)
	want(t, r, 0)
	wantLines(t, r, `queue\s+4 waiting in line, served in this order`)
	for i, x := range mxQueue {
		wantLines(t, r, fmt.Sprintf(`  %d\s+%s, holder %s, waiting since \S+ ago, id %s, ticket expires in \S+`, i+1,
			regexp.QuoteMeta(x.mode), regexp.QuoteMeta(x.holder), h(x.id)))
	}
	noSecrets(t, r, secrets...)
	// A key that only has a queue (the set's other key is free) is
	// found: exit 0, its line shown.
	r = run(t, w.url, "", "inspect", "--json", other)
	want(t, r, 0)
	noSecrets(t, r, secrets...)
	var kv keyView
	if err := json.Unmarshal([]byte(r.stdout), &kv); err != nil {
		t.Fatalf("JSON: %v\n%s", err, r)
	}
	wantQueue("inspect --json "+other, kv.Queue, ticket{"qd[4]@host-d", "set", d[0]})

	// serve: the page's waiters list the line in order, by holder.
	base, _ := startServe(t, w.url, nil)
	var st serveState
	var body string
	waitFor(t, "serve's state with the queue", func() bool {
		st, body = getState(t, base)
		return st.Counts["queued"] == 6
	})
	for _, x := range st.Holders {
		if x.KeyHash == h(mx) && x.Queued != 4 || x.KeyHash == h(sem) && x.Queued != 1 {
			t.Fatalf("serve's holder %+v: want 4 queued on %s, 1 on %s", x, h(mx), h(sem))
		}
	}
	var got []string
	for _, x := range st.Waiters {
		if x.What == "queued" && x.KeyHash == h(mx) {
			got = append(got, fmt.Sprintf("%d %s %s", x.Position, x.Process, x.Mode))
		}
	}
	if want := "1 qa[1]@host-a exclusive|2 qc[3]@host-c exclusive|3 qb[2]@host-b reader|4 qd[4]@host-d set"; strings.Join(got, "|") != want {
		t.Fatalf("serve's queued waiters of %s:\n got %s\nwant %s", h(mx), strings.Join(got, "|"), want)
	}
	for _, s := range secrets {
		if strings.Contains(body, s) {
			t.Fatalf("/api/state holds the secret %q:\n%s", s, body)
		}
	}
	// The page (a real headless Chromium) shows the line in order.
	br := startBrowser(t)
	br.call("Page.navigate", map[string]any{"url": base + "/"})
	page := br.waitText("the queue on the page", `document.querySelector("#waiters tbody").innerText`,
		func(s string) bool { return strings.Contains(s, "queued #4 (set)") })
	var order []int
	for _, x := range []string{"queued #1 (exclusive)\tqa[1]@host-a", "queued #2 (exclusive)\tqc[3]@host-c",
		"queued #3 (reader)\tqb[2]@host-b", "queued #4 (set)\tqd[4]@host-d"} {
		order = append(order, strings.Index(page, x))
	}
	if order[0] < 0 || order[0] > order[1] || order[1] > order[2] || order[2] > order[3] {
		t.Fatalf("the page's waiters do not show the line in order (%v):\n%s", order, page)
	}
	br.waitText("the line's length with its holder", `document.querySelector("#holders tbody").innerText`,
		func(s string) bool {
			return strings.Contains(s, "0 + 4 in line") && strings.Contains(s, "0 + 1 in line")
		})
	if all := br.eval(`document.body.innerText`); strings.Contains(all, mx) || !strings.Contains(all, h(mx)) {
		t.Fatalf("the page shows the raw key, or not its hash:\n%s", all)
	}
	if p := br.pageProblems(); len(p) > 0 {
		t.Fatalf("the page reported problems:\n%s", strings.Join(p, "\n"))
	}

	// qc's ticket expires (its last refresh gave it 100 ms); its row
	// stays until a statement touches the key.
	if ts, err := qc.s.QueueRefresh(c, cc, store.MinTicketLife); err != nil || ts[0].Position != 2 {
		t.Fatalf("QueueRefresh = %v, %v", ts, err)
	}
	time.Sleep(300 * time.Millisecond)
	v = statusJSON()
	wantQueue("status --json after an expiry, "+mx, queueOf(v, mx).Tickets, mxQueue[0], mxQueue[2], mxQueue[3])
	var rows int
	if err := w.pool.QueryRow(c, "SELECT count(*) FROM "+w.store.Names().Queue+" WHERE lock_id = $1", cc[0]).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("the expired ticket's row: %d, %v; want still there (the CLI, not a clean-up, leaves it out)", rows, err)
	}
	r = run(t, w.url, "", "status")
	want(t, r, 0, "QUEUE  5 waiting in line for 3 key(s)")
	wantLines(t, r, line(h(mx), "2 of 3", "qb[2]@host-b", "reader"), line(h(mx), "3 of 3", "qd[4]@host-d", "set"))
	if strings.Contains(r.stdout, "qc[3]@host-c") {
		t.Fatalf("status shows the expired ticket:\n%s", r)
	}
	noSecrets(t, r, secrets...)
}
