package store_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/store"
)

// qproc is one process of the queue tests: a pool of its own (as the
// runtime role), a Store on it, its queue channel and a connection of its
// own LISTENing on that channel, whose notifications a reader goroutine
// routes by lockId hash and counts.
type qproc struct {
	id    int
	s     *store.Store
	pool  *pgxpool.Pool
	ch    string
	mu    sync.Mutex
	turns map[string]chan store.Turn // by lock hash
	got   []store.Turn               // every notification, in order
	bad   []string                   // payloads that were not turns
	n     atomic.Int64
}

// newQProcs returns n processes on one fresh schema, and a superuser pool
// on it (for checks).
func newQProcs(t *testing.T, n int) ([]*qproc, *pgxpool.Pool) {
	t.Helper()
	_, rs := pgtest.RuntimePool(t)
	procs := make([]*qproc, n)
	for i := range procs {
		pool := rs.RuntimePool(t)
		s, err := store.New("pg.New", pool, store.Config{NotifyChannel: "pglease_release"})
		if err != nil {
			t.Fatal(err)
		}
		p := &qproc{id: i, s: s, pool: pool, ch: store.QueueChannel(), turns: map[string]chan store.Turn{}}
		procs[i] = p
		p.listen(t)
	}
	return procs, rs.AdminPool(t)
}

func (p *qproc) listen(t *testing.T) {
	t.Helper()
	lctx, cancel := context.WithCancel(context.Background())
	conn, err := p.pool.Acquire(lctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(lctx, "LISTEN "+p.ch); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nt, err := conn.Conn().WaitForNotification(lctx)
			if err != nil {
				return
			}
			p.n.Add(1)
			tr, ok := store.ParseTurn(nt.Payload)
			p.mu.Lock()
			if !ok || nt.Channel != p.ch {
				p.bad = append(p.bad, nt.Channel+" "+nt.Payload)
			} else {
				p.got = append(p.got, tr)
				if c := p.turns[tr.LockHash]; c != nil {
					select {
					case c <- tr:
					default:
					}
				}
			}
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		conn.Release()
	})
}

// expect registers lockID for routing and returns its channel of turns.
func (p *qproc) expect(lockID string) chan store.Turn {
	c := make(chan store.Turn, 4)
	p.mu.Lock()
	p.turns[pglease.HashKey(lockID)] = c
	p.mu.Unlock()
	return c
}

func (p *qproc) turnsSeen() []store.Turn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]store.Turn(nil), p.got...)
}

// settle waits until no process received a notification for a while (the
// notifications of committed statements arrive within it on any machine).
func settle(procs []*qproc) { settleAt(procs, 0) }

// settleAt is settle after the processes received want notifications in
// all (or 30 s passed: then the test's own count check fails).
func settleAt(procs []*qproc, want int64) {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var sum int64
		for _, p := range procs {
			sum += p.n.Load()
		}
		if sum >= want {
			break
		}
	}
	last := int64(-1)
	for {
		var sum int64
		for _, p := range procs {
			sum += p.n.Load()
		}
		if sum == last {
			return
		}
		last = sum
		time.Sleep(500 * time.Millisecond)
	}
}

const qlife = 30 * time.Second

// TestQueueServesArrivalOrder: waiters of three processes queue on a held
// key in a known order; each release serves exactly the head, in the
// release's own transaction (the grant is live when the release returns,
// with a fence above every earlier one), and only the head's process is
// notified, once.
func TestQueueServesArrivalOrder(t *testing.T) {
	procs, _ := newQProcs(t, 4)
	c := ctx(t)
	const key = "fair:order"
	h, err := procs[0].s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
	if err != nil || !h.OK {
		t.Fatal(h, err)
	}
	owners := []int{1, 2, 3, 1, 2, 3, 3, 1, 2}
	ids := make([]string, len(owners))
	turns := make([]chan store.Turn, len(owners))
	for i, o := range owners {
		ids[i] = keys.NewLockID()
		turns[i] = procs[o].expect(ids[i])
		res, err := procs[o].s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: ids[i]}}, procs[o].ch, qlife)
		if err != nil {
			t.Fatal(err)
		}
		if res[0].OK || res[0].Position != i+1 {
			t.Fatalf("waiter %d: OK %v position %d, want queued at %d", i, res[0].OK, res[0].Position, i+1)
		}
	}
	// The waiters view shows the queue in order, without lockIds.
	rows, err := procs[0].pool.Query(c, "SELECT position, mode, lock_id_hash, holder FROM syncguard_locks_waiters WHERE key = $1 AND kind = 'queued' ORDER BY position", key)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var pos int64
		var mode, hash, holder string
		if err := rows.Scan(&pos, &mode, &hash, &holder); err != nil {
			t.Fatal(err)
		}
		if n >= len(ids) || pos != int64(n+1) || mode != "exclusive" || hash != pglease.HashKey(ids[n]) || holder == "" {
			t.Fatalf("waiters view row %d: %d %s %s %q", n, pos, mode, hash, holder)
		}
		n++
	}
	if err := rows.Err(); err != nil || n != len(ids) {
		t.Fatalf("waiters view: %d queued rows (%v), want %d", n, err, len(ids))
	}
	// A second attempt of a queued waiter keeps its place.
	if res, err := procs[2].s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: ids[4]}}, procs[2].ch, qlife); err != nil || res[0].Position != 5 {
		t.Fatalf("retry of waiter 4: %+v %v, want position 5", res, err)
	}
	holder, holderProc, fence := h.LockID, 0, h.Fence
	for i, o := range owners {
		rel, err := procs[holderProc].s.QueueRelease(c, []store.ReleaseRequest{{LockID: holder, Key: key}}, true, "")
		if err != nil {
			t.Fatal(err)
		}
		if !rel[0].Released || rel[0].Served != 1 {
			t.Fatalf("release %d: %+v, want released and 1 served", i, rel[0])
		}
		// Granted by the release's commit: live now, before any notification is read.
		info, err := procs[o].s.LookupByID(c, ids[i])
		if err != nil || info == nil {
			t.Fatalf("waiter %d not holding after the release: %v %v", i, info, err)
		}
		if info.Fence <= fence {
			t.Fatalf("waiter %d: fence %d not above the previous %d", i, info.Fence, fence)
		}
		select {
		case tr := <-turns[i]:
			if !tr.Granted || tr.Fence != info.Fence || tr.KeyHash != pglease.HashKey(key) {
				t.Fatalf("waiter %d: turn %+v, lease fence %d", i, tr, info.Fence)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("waiter %d: no notification", i)
		}
		holder, holderProc, fence = ids[i], o, info.Fence
	}
	rel, err := procs[holderProc].s.QueueRelease(c, []store.ReleaseRequest{{LockID: holder, Key: key}}, true, "")
	if err != nil || !rel[0].Released || rel[0].Served != 0 {
		t.Fatalf("last release: %+v %v", rel, err)
	}
	settleAt(procs, int64(len(owners)))
	for _, p := range procs {
		want := 0
		for _, o := range owners {
			if o == p.id {
				want++
			}
		}
		if got := int(p.n.Load()); got != want || len(p.bad) > 0 {
			t.Errorf("process %d received %d notifications (%d not its turns), want %d: one per grant of its own tickets", p.id, got, len(p.bad), want)
		}
	}
}

// TestQueueConcurrentFIFO: 4 processes × 4 callers loop on one key through
// the queue (attempt, wait for the notification, hold, release serving the
// head). One holder at a time, every fence above the one before, grants in
// ticket arrival order (a trigger logs every ticket's seq), and each
// process notified only of grants of its own tickets, once each.
func TestQueueConcurrentFIFO(t *testing.T) {
	procs, admin := newQProcs(t, 4)
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err := admin.Exec(c, `CREATE TABLE qlog (seq bigint, lock_id text);
CREATE FUNCTION qlog_f() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$ BEGIN INSERT INTO qlog VALUES (NEW.seq, NEW.lock_id); RETURN NULL; END $$;
CREATE TRIGGER qlog_t AFTER INSERT ON syncguard_locks_queue FOR EACH ROW EXECUTE FUNCTION qlog_f();`)
	if err != nil {
		t.Fatal(err)
	}
	const key, callers, cycles = "fair:concurrent", 4, 6
	type grant struct {
		id       string
		fence    pglease.Fence
		proc     int
		notified bool
	}
	var mu sync.Mutex
	var grants []grant
	var holders atomic.Int32
	var served, overlap atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, len(procs)*callers)
	for _, p := range procs {
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range cycles {
					id := keys.NewLockID()
					turn := p.expect(id)
					var fence pglease.Fence
					notified := false
					for fence == 0 {
						res, err := p.s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: id}}, p.ch, qlife)
						if err != nil {
							errc <- err
							return
						}
						if res[0].OK {
							fence = res[0].Fence
							break
						}
						select {
						case tr := <-turn:
							if tr.Granted {
								fence, notified = tr.Fence, true
							}
						case <-time.After(5 * time.Second):
							// A missed turn would show here as a slow test, not a hang:
							// the attempt again keeps the ticket's place.
						case <-c.Done():
							errc <- c.Err()
							return
						}
					}
					if holders.Add(1) != 1 {
						overlap.Add(1)
					}
					mu.Lock()
					grants = append(grants, grant{id, fence, p.id, notified})
					mu.Unlock()
					time.Sleep(time.Millisecond)
					holders.Add(-1)
					rel, err := p.s.QueueRelease(c, []store.ReleaseRequest{{LockID: id, Key: key}}, true, "")
					if err != nil || !rel[0].Released {
						errc <- fmt.Errorf("release: %+v %v", rel, err)
						return
					}
					served.Add(int64(rel[0].Served))
				}
			}()
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if overlap.Load() != 0 {
		t.Fatalf("%d grants overlapped another holder", overlap.Load())
	}
	total := len(procs) * callers * cycles
	if len(grants) != total {
		t.Fatalf("%d grants, want %d", len(grants), total)
	}
	sort.Slice(grants, func(i, j int) bool { return grants[i].fence < grants[j].fence })
	seqOf := map[string]int64{}
	rows, err := admin.Query(c, "SELECT seq, lock_id FROM qlog")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var seq int64
		var id string
		if err := rows.Scan(&seq, &id); err != nil {
			t.Fatal(err)
		}
		if _, dup := seqOf[id]; dup {
			t.Fatalf("a ticket enqueued twice (it expired or was dropped)")
		}
		seqOf[id] = seq
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	inversions, notified := 0, 0
	for i, g := range grants {
		if i > 0 && g.fence == grants[i-1].fence {
			t.Fatalf("fence %d granted twice", g.fence)
		}
		if i > 0 && seqOf[g.id] < seqOf[grants[i-1].id] {
			inversions++
		}
		if g.notified {
			notified++
		}
	}
	if inversions > 0 {
		t.Errorf("%d grants out of ticket arrival order", inversions)
	}
	settleAt(procs, served.Load())
	var notes int64
	for _, p := range procs {
		notes += p.n.Load()
		if len(p.bad) > 0 {
			t.Errorf("process %d received notifications that are not its turns: %q", p.id, p.bad)
		}
		mine := map[string]bool{}
		for _, g := range grants {
			if g.proc == p.id {
				mine[pglease.HashKey(g.id)] = true
			}
		}
		for _, tr := range p.turnsSeen() {
			if !mine[tr.LockHash] {
				t.Errorf("process %d was told of a ticket of another process", p.id)
			}
		}
	}
	if notes != served.Load() {
		t.Errorf("%d notifications for %d grants made by releases: want one each", notes, served.Load())
	}
	t.Logf("%d grants, %d by releases (%d waiters woke by their notification), %d notifications", total, served.Load(), notified, notes)
}

// TestQueueDeadTicketExpires: a waiter that stops refreshing (a dead
// process) holds the head of the queue until its ticket's life ends, no
// longer: the waiter behind it is refused while the dead ticket is live
// and granted once it has expired; a release after that serves the live
// waiter, not the dead one.
func TestQueueDeadTicketExpires(t *testing.T) {
	procs, admin := newQProcs(t, 3)
	c := ctx(t)
	const key = "fair:dead"
	const deadLife = time.Second
	h, err := procs[0].s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
	if err != nil || !h.OK {
		t.Fatal(h, err)
	}
	dead, live := keys.NewLockID(), keys.NewLockID()
	res, err := procs[1].s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: dead}}, procs[1].ch, deadLife)
	if err != nil || res[0].Position != 1 {
		t.Fatal(res, err)
	}
	var deadExp int64
	if err := admin.QueryRow(c, "SELECT expires_at_ms FROM syncguard_locks_queue WHERE lock_id = $1", dead).Scan(&deadExp); err != nil {
		t.Fatal(err)
	}
	res, err = procs[2].s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: live}}, procs[2].ch, qlife)
	if err != nil || res[0].Position != 2 {
		t.Fatal(res, err)
	}
	// A plain release (no serving): the key is free, the dead ticket is the head.
	if ok, err := procs[0].s.Release(c, h.LockID); err != nil || !ok {
		t.Fatal(ok, err)
	}
	res, err = procs[2].s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: live}}, procs[2].ch, qlife)
	if err != nil {
		t.Fatal(err)
	}
	if now := serverNow(t, admin); now < deadExp && (res[0].OK || res[0].Position != 2) {
		t.Fatalf("behind a live ticket: %+v, want refused at position 2", res[0])
	}
	waitServer(t, admin, deadExp)
	res, err = procs[2].s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: live}}, procs[2].ch, qlife)
	if err != nil || !res[0].OK {
		t.Fatalf("after the dead ticket's life: %+v %v, want granted", res, err)
	}
	// The same through a release that serves: a dead head is skipped.
	dead2, live2 := keys.NewLockID(), keys.NewLockID()
	if res, err := procs[1].s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: dead2}}, procs[1].ch, deadLife); err != nil || res[0].Position != 1 {
		t.Fatal(res, err)
	}
	if err := admin.QueryRow(c, "SELECT expires_at_ms FROM syncguard_locks_queue WHERE lock_id = $1", dead2).Scan(&deadExp); err != nil {
		t.Fatal(err)
	}
	if res, err := procs[0].s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: live2}}, procs[0].ch, qlife); err != nil || res[0].Position != 2 {
		t.Fatal(res, err)
	}
	waitServer(t, admin, deadExp)
	rel, err := procs[2].s.QueueRelease(c, []store.ReleaseRequest{{LockID: live, Key: key}}, true, "")
	if err != nil || !rel[0].Released || rel[0].Served != 1 {
		t.Fatalf("release: %+v %v", rel, err)
	}
	if info, err := procs[0].s.LookupByID(c, live2); err != nil || info == nil {
		t.Fatalf("the live waiter was not served: %v %v", info, err)
	}
	settle(procs)
	if n := procs[1].n.Load(); n != 0 {
		t.Errorf("the dead waiter's process was notified %d times", n)
	}
}

// TestQueueRefresh: a refresh tells a ticket's position, a grant whose
// notification nobody read (fence and expiry), and a ticket that expired;
// an expired ticket is not revived.
func TestQueueRefresh(t *testing.T) {
	procs, admin := newQProcs(t, 2)
	c := ctx(t)
	const key = "fair:refresh"
	h, err := procs[0].s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
	if err != nil || !h.OK {
		t.Fatal(h, err)
	}
	a, b, gone := keys.NewLockID(), keys.NewLockID(), keys.NewLockID()
	for _, id := range []string{a, b} {
		if _, err := procs[1].s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: id}}, procs[1].ch, qlife); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := procs[1].s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: gone}}, procs[1].ch, store.MinTicketLife); err != nil {
		t.Fatal(err)
	}
	var exp int64
	if err := admin.QueryRow(c, "SELECT expires_at_ms FROM syncguard_locks_queue WHERE lock_id = $1", gone).Scan(&exp); err != nil {
		t.Fatal(err)
	}
	waitServer(t, admin, exp)
	st, err := procs[1].s.QueueRefresh(c, []string{a, b, gone}, qlife)
	if err != nil {
		t.Fatal(err)
	}
	if st[0].Position != 1 || st[1].Position != 2 || st[2] != (store.TicketState{}) {
		t.Fatalf("refresh: %+v, want positions 1, 2 and an expired ticket", st)
	}
	// The refresh deleted the expired ticket (its key may never be used again).
	var left int
	if err := admin.QueryRow(c, "SELECT count(*) FROM syncguard_locks_queue WHERE lock_id = $1", gone).Scan(&left); err != nil || left != 0 {
		t.Fatalf("the expired ticket is still there: %d %v", left, err)
	}
	if _, err := procs[0].s.QueueRelease(c, []store.ReleaseRequest{{LockID: h.LockID, Key: key}}, true, ""); err != nil {
		t.Fatal(err)
	}
	st, err = procs[1].s.QueueRefresh(c, []string{a, b, gone}, qlife)
	if err != nil {
		t.Fatal(err)
	}
	info, err := procs[1].s.LookupByID(c, a)
	if err != nil || info == nil {
		t.Fatal(info, err)
	}
	if !st[0].Granted || st[0].Fence != info.Fence || !st[0].ExpiresAt.Equal(info.ExpiresAt) || st[1].Position != 1 || st[2] != (store.TicketState{}) {
		t.Fatalf("refresh after the release: %+v (lease fence %d expires %v)", st, info.Fence, info.ExpiresAt)
	}
	// Leaving: b's ticket goes; a's lease (granted) is released by a leave of a.
	lv, err := procs[1].s.QueueLeave(c, []string{b, a})
	if err != nil || !lv[0].Left || lv[0].Released || lv[1].Left || !lv[1].Released {
		t.Fatalf("leave: %+v %v", lv, err)
	}
	var n int
	if err := admin.QueryRow(c, "SELECT count(*) FROM syncguard_locks_queue").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d tickets left (%v)", n, err)
	}
}

// TestQueueSharedKinds: readers in a row are served together by one
// release, a writer queued ahead of a reader holds it off (even while
// readers hold the key), and a semaphore's release serves its permits in
// order while there is room.
func TestQueueSharedKinds(t *testing.T) {
	procs, _ := newQProcs(t, 4)
	c := ctx(t)
	const key = "fair:rw"
	h, err := procs[0].s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
	if err != nil || !h.OK {
		t.Fatal(h, err)
	}
	wait := func(p *qproc, id string, shared bool, limit int) store.WaitResult {
		t.Helper()
		res, err := p.s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: id, Shared: shared, Limit: limit}}, p.ch, qlife)
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	r1, r2, w, r3 := keys.NewLockID(), keys.NewLockID(), keys.NewLockID(), keys.NewLockID()
	wait(procs[1], r1, true, 0)
	wait(procs[2], r2, true, 0)
	wait(procs[3], w, false, 0)
	if res := wait(procs[1], r3, true, 0); res.Position != 4 {
		t.Fatalf("r3: %+v", res)
	}
	rel, err := procs[0].s.QueueRelease(c, []store.ReleaseRequest{{LockID: h.LockID, Key: key}}, true, "")
	if err != nil || rel[0].Served != 2 {
		t.Fatalf("release of the writer: %+v %v, want the 2 readers at the head served", rel, err)
	}
	if res := wait(procs[1], r3, true, 0); res.OK || res.Position != 2 {
		t.Fatalf("a reader behind a queued writer: %+v, want refused at 2", res)
	}
	if rel, err := procs[1].s.QueueRelease(c, []store.ReleaseRequest{{LockID: r1, Key: key}}, true, ""); err != nil || rel[0].Served != 0 {
		t.Fatalf("first reader's release: %+v %v (the other reader still holds)", rel, err)
	}
	if rel, err := procs[2].s.QueueRelease(c, []store.ReleaseRequest{{LockID: r2, Key: key}}, true, ""); err != nil || rel[0].Served != 1 {
		t.Fatalf("last reader's release: %+v %v, want the writer served", rel, err)
	}
	if info, err := procs[3].s.LookupByID(c, w); err != nil || info == nil {
		t.Fatal("writer not served", err)
	}
	if rel, err := procs[3].s.QueueRelease(c, []store.ReleaseRequest{{LockID: w, Key: key}}, true, ""); err != nil || rel[0].Served != 1 {
		t.Fatalf("writer's release: %+v %v, want r3 served", rel, err)
	}
	if _, err := procs[1].s.Release(c, r3); err != nil {
		t.Fatal(err)
	}

	const sem = "fair:sem"
	p := make([]string, 5)
	for i := range p {
		p[i] = keys.NewLockID()
	}
	sw := func(pr *qproc, id string) store.WaitResult {
		t.Helper()
		res, err := pr.s.QueueWait(c, []store.WaitRequest{{Key: sem, TTL: time.Minute, LockID: id, Shared: true, Limit: 2}}, pr.ch, qlife)
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	if !sw(procs[0], p[0]).OK || !sw(procs[1], p[1]).OK {
		t.Fatal("the first two permits were refused")
	}
	for i := 2; i < 5; i++ {
		if res := sw(procs[i%4], p[i]); res.OK || res.Position != i-1 {
			t.Fatalf("permit %d: %+v", i, res)
		}
	}
	rel, err = procs[0].s.QueueRelease(c, []store.ReleaseRequest{{LockID: p[0], Key: sem}, {LockID: p[1], Key: sem}}, true, "")
	if err != nil || rel[0].Served+rel[1].Served != 2 {
		t.Fatalf("release of both permits: %+v %v, want 2 served", rel, err)
	}
	for i, want := range []bool{true, true, false} {
		info, err := procs[0].s.LookupByID(c, p[i+2])
		_ = info
		if err != nil {
			t.Fatal(err)
		}
		st, err := procs[(i+2)%4].s.QueueRefresh(c, []string{p[i+2]}, qlife)
		if err != nil || st[0].Granted != want {
			t.Fatalf("permit %d: %+v %v, granted want %v", i+2, st, err, want)
		}
	}
}

// TestQueueSetInOrder: a set queued before a single-key caller gets its
// turn: a release of one of its keys leaves that key free for it (the
// caller behind it is refused, and only the set's process is told), and
// the set is granted whole once every key is free.
func TestQueueSetInOrder(t *testing.T) {
	procs, _ := newQProcs(t, 3)
	c := ctx(t)
	ha, err := procs[0].s.Acquire(c, store.AcquireRequest{Key: "fair:a", TTL: time.Minute})
	if err != nil || !ha.OK {
		t.Fatal(ha, err)
	}
	hb, err := procs[0].s.Acquire(c, store.AcquireRequest{Key: "fair:b", TTL: time.Minute})
	if err != nil || !hb.OK {
		t.Fatal(hb, err)
	}
	sa, sb, single := keys.NewLockID(), keys.NewLockID(), keys.NewLockID()
	turnA := procs[1].expect(sa)
	set := []store.WaitRequest{{Key: "fair:a", TTL: time.Minute, LockID: sa, Set: 1}, {Key: "fair:b", TTL: time.Minute, LockID: sb, Set: 1}}
	res, err := procs[1].s.QueueWait(c, set, procs[1].ch, qlife)
	if err != nil || res[0].OK || res[1].OK || res[0].Position != 1 || res[1].Position != 1 {
		t.Fatalf("set: %+v %v", res, err)
	}
	one := []store.WaitRequest{{Key: "fair:a", TTL: time.Minute, LockID: single}}
	if res, err := procs[2].s.QueueWait(c, one, procs[2].ch, qlife); err != nil || res[0].Position != 2 {
		t.Fatalf("single: %+v %v", res, err)
	}
	rel, err := procs[0].s.QueueRelease(c, []store.ReleaseRequest{{LockID: ha.LockID, Key: "fair:a"}}, true, "")
	if err != nil || rel[0].Served != 0 {
		t.Fatalf("release of a: %+v %v, want nothing served (the head is a set)", rel, err)
	}
	select {
	case tr := <-turnA:
		if tr.Granted {
			t.Fatalf("the set's ticket was granted alone: %+v", tr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the set's process was not told its turn")
	}
	if res, err := procs[2].s.QueueWait(c, one, procs[2].ch, qlife); err != nil || res[0].OK {
		t.Fatalf("the single-key caller behind the set took the free key: %+v %v", res, err)
	}
	if _, err := procs[0].s.QueueRelease(c, []store.ReleaseRequest{{LockID: hb.LockID, Key: "fair:b"}}, true, ""); err != nil {
		t.Fatal(err)
	}
	res, err = procs[1].s.QueueWait(c, set, procs[1].ch, qlife)
	if err != nil || !res[0].OK || !res[1].OK {
		t.Fatalf("the set at the head of both free keys: %+v %v", res, err)
	}
	rel, err = procs[1].s.QueueRelease(c, []store.ReleaseRequest{{LockID: sa, Key: "fair:a"}, {LockID: sb, Key: "fair:b"}}, true, "")
	if err != nil || rel[0].Served+rel[1].Served != 1 {
		t.Fatalf("release of the set: %+v %v, want the single-key caller served", rel, err)
	}
	settle(procs)
	if n := procs[2].n.Load(); n != 1 {
		t.Errorf("the single-key caller's process got %d notifications, want 1", n)
	}
}

// TestQueueBadInput: a mistake is InvalidArgument before any I/O.
func TestQueueBadInput(t *testing.T) {
	procs, _ := newQProcs(t, 1)
	s, c, ch := procs[0].s, ctx(t), procs[0].ch
	id := keys.NewLockID()
	for name, call := range map[string]func() error{
		"no lockId": func() error {
			_, err := s.QueueWait(c, []store.WaitRequest{{Key: "k", TTL: time.Second}}, ch, qlife)
			return err
		},
		"bad channel": func() error {
			_, err := s.QueueWait(c, []store.WaitRequest{{Key: "k", TTL: time.Second, LockID: id}}, "pglease_release", qlife)
			return err
		},
		"short life": func() error {
			_, err := s.QueueWait(c, []store.WaitRequest{{Key: "k", TTL: time.Second, LockID: id}}, ch, time.Millisecond)
			return err
		},
		"shared set": func() error {
			_, err := s.QueueWait(c, []store.WaitRequest{{Key: "k", TTL: time.Second, LockID: id, Shared: true, Set: 1}}, ch, qlife)
			return err
		},
		"key twice": func() error {
			_, err := s.QueueWait(c, []store.WaitRequest{{Key: "k", TTL: time.Second, LockID: id, Set: 1}, {Key: "k", TTL: time.Second, LockID: keys.NewLockID(), Set: 1}}, ch, qlife)
			return err
		},
		"bad refresh": func() error { _, err := s.QueueRefresh(c, []string{"x"}, qlife); return err },
		"bad leave":   func() error { _, err := s.QueueLeave(c, []string{"x"}); return err },
		"bad release": func() error {
			_, err := s.QueueRelease(c, []store.ReleaseRequest{{LockID: "x", Key: "k"}}, true, "")
			return err
		},
		"refresh life": func() error { _, err := s.QueueRefresh(c, []string{id}, 2*time.Minute); return err },
	} {
		if err := call(); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if _, ok := store.ParseTurn("q:abc"); ok {
		t.Error("ParseTurn accepted a bad payload")
	}
	const h = "0123456789abcdef01234567"
	for payload, want := range map[string]*store.Turn{
		"q:" + h + ":" + h + ":7:1700000000000":     {Granted: true, Fence: 7},
		"q:" + h + ":" + h + ":7:1700000000000:s":   {Granted: true, Fence: 7, Unconfirmed: true},
		"q:" + h + ":" + h + ":0:0":                 {},
		"q:" + h + ":" + h + ":7:1700000000000:x":   nil,
		"q:" + h + ":" + h + ":7:1700000000000:s:s": nil,
	} {
		got, ok := store.ParseTurn(payload)
		switch {
		case want == nil && ok:
			t.Errorf("ParseTurn(%q) accepted a bad payload: %+v", payload, got)
		case want != nil && (!ok || got.Granted != want.Granted || got.Fence != want.Fence || got.Unconfirmed != want.Unconfirmed):
			t.Errorf("ParseTurn(%q) = %+v, %v; want %+v", payload, got, ok, *want)
		}
	}
}

// TestQueueWaitAfterMissedGrant: a waiter that missed its grant's
// notification and attempts again with its ticket's lockId is answered
// granted (the lease the release gave it), not queued behind its own
// lease.
func TestQueueWaitAfterMissedGrant(t *testing.T) {
	procs, admin := newQProcs(t, 2)
	c := ctx(t)
	const key = "fair:missed"
	for _, shared := range []bool{false, true} {
		h, err := procs[0].s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
		if err != nil || !h.OK {
			t.Fatal(h, err)
		}
		id := keys.NewLockID()
		req := []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: id, Shared: shared}}
		if res, err := procs[1].s.QueueWait(c, req, procs[1].ch, qlife); err != nil || res[0].Position != 1 {
			t.Fatal(res, err)
		}
		if rel, err := procs[0].s.QueueRelease(c, []store.ReleaseRequest{{LockID: h.LockID, Key: key}}, true, ""); err != nil || rel[0].Served != 1 {
			t.Fatal(rel, err)
		}
		res, err := procs[1].s.QueueWait(c, req, procs[1].ch, qlife)
		if err != nil || !res[0].OK || res[0].Fence == 0 && !shared {
			t.Fatalf("shared %v: attempt after a missed grant: %+v %v, want granted", shared, res, err)
		}
		var n int
		if err := admin.QueryRow(c, "SELECT count(*) FROM syncguard_locks_queue").Scan(&n); err != nil || n != 0 {
			t.Fatalf("shared %v: %d tickets (%v), want none", shared, n, err)
		}
		if ok, err := procs[1].s.Release(c, id); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
}

// TestQueueLeaveServesNext: a head that gives up while the key is free
// (released without serving, as in a foreign window) lets the next ticket
// go at once: the leave grants it and notifies its process only.
func TestQueueLeaveServesNext(t *testing.T) {
	procs, _ := newQProcs(t, 3)
	c := ctx(t)
	const key = "fair:leave"
	h, err := procs[0].s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
	if err != nil || !h.OK {
		t.Fatal(h, err)
	}
	a, b := keys.NewLockID(), keys.NewLockID()
	turnB := procs[2].expect(b)
	for i, id := range []string{a, b} {
		if res, err := procs[i+1].s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: id}}, procs[i+1].ch, qlife); err != nil || res[0].Position != i+1 {
			t.Fatal(res, err)
		}
	}
	if rel, err := procs[0].s.QueueRelease(c, []store.ReleaseRequest{{LockID: h.LockID, Key: key}}, false, ""); err != nil || !rel[0].Released || rel[0].Served != 0 {
		t.Fatalf("release without serving: %+v %v", rel, err)
	}
	if lv, err := procs[1].s.QueueLeave(c, []string{a}); err != nil || !lv[0].Left || lv[0].Released {
		t.Fatalf("leave: %+v %v", lv, err)
	}
	if info, err := procs[2].s.LookupByID(c, b); err != nil || info == nil {
		t.Fatalf("the next ticket was not served by the leave: %v %v", info, err)
	}
	select {
	case tr := <-turnB:
		if !tr.Granted {
			t.Fatalf("turn %+v", tr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no notification")
	}
	settle(procs)
	if n := procs[1].n.Load() + procs[0].n.Load(); n != 0 {
		t.Errorf("%d notifications to the other processes", n)
	}
}

// TestQueueForeignWindow: SyncGuard does not queue. A release without
// serving (the foreign window of docs/fairness.md) leaves a queued key
// free, and SyncGuard's own acquire takes it; the queue's head is then
// refused while SyncGuard holds it, keeps its place, and is granted
// after SyncGuard's release (by its next attempt: SyncGuard's release
// serves no queue).
func TestQueueForeignWindow(t *testing.T) {
	procs, _ := newQProcs(t, 2)
	c := ctx(t)
	const key = "fair:foreign"
	h, err := procs[0].s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
	if err != nil || !h.OK {
		t.Fatal(h, err)
	}
	id := keys.NewLockID()
	req := []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: id}}
	if res, err := procs[1].s.QueueWait(c, req, procs[1].ch, qlife); err != nil || res[0].Position != 1 {
		t.Fatal(res, err)
	}
	if rel, err := procs[0].s.QueueRelease(c, []store.ReleaseRequest{{LockID: h.LockID, Key: key}}, false, ""); err != nil || rel[0].Served != 0 {
		t.Fatal(rel, err)
	}
	sg := pgtest.NewSyncGuard(t, procs[0].pool)
	sgID, ok, err := sg.Acquire(key, time.Minute)
	if err != nil || !ok {
		t.Fatalf("SyncGuard's acquire of the key left free: %v %v", ok, err)
	}
	if res, err := procs[1].s.QueueWait(c, req, procs[1].ch, qlife); err != nil || res[0].OK || res[0].Position != 1 || res[0].Holder != "" {
		t.Fatalf("the head while SyncGuard holds the key: %+v %v", res, err)
	}
	if ok, err := sg.ExtendOrRelease(sgID, 0); err != nil || !ok {
		t.Fatalf("SyncGuard's release: %v %v", ok, err)
	}
	if res, err := procs[1].s.QueueWait(c, req, procs[1].ch, qlife); err != nil || !res[0].OK {
		t.Fatalf("the head after SyncGuard's release: %+v %v", res, err)
	}
}

// TestQueueRefreshDuringServe: a process refreshing its tickets (in any
// order) while a release serves them (in seq order) never deadlocks with
// it: each release serves both readers, each refresh succeeds.
func TestQueueRefreshDuringServe(t *testing.T) {
	procs, _ := newQProcs(t, 2)
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const key = "fair:refresh-serve"
	var stop atomic.Bool
	var ids atomic.Value // []string, the current tickets, newest first
	ids.Store([]string{})
	errc := make(chan error, 4)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				if cur := ids.Load().([]string); len(cur) > 0 {
					if _, err := procs[1].s.QueueRefresh(c, cur, qlife); err != nil {
						errc <- fmt.Errorf("refresh: %w", err)
						return
					}
				}
			}
		}()
	}
	for i := 0; i < 40 && len(errc) == 0; i++ {
		h, err := procs[0].s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
		if err != nil || !h.OK {
			t.Fatal(h, err)
		}
		r1, r2 := keys.NewLockID(), keys.NewLockID()
		for _, id := range []string{r1, r2} {
			if _, err := procs[1].s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: id, Shared: true}}, procs[1].ch, qlife); err != nil {
				t.Fatal(err)
			}
		}
		ids.Store([]string{r2, r1})
		rel, err := procs[0].s.QueueRelease(c, []store.ReleaseRequest{{LockID: h.LockID, Key: key}}, true, "")
		if err != nil || rel[0].Served != 2 {
			t.Fatalf("round %d: release %+v %v, want both readers served", i, rel, err)
		}
		ids.Store([]string{})
		if _, err := procs[1].s.ReleaseMany(c, []string{r1, r2}); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
}

// TestQueueYieldingTry: an acquire item with Yield (a fair Manager's try,
// which takes no ticket) is answered held while a live ticket waits for
// its key, even with the key free (here a set's ticket, its other key
// held), for every kind: exclusive, reader, permit and set; the same
// items without Yield (pg.Store, a Manager without the queue) take the
// key as before; the SQL API's acquire yields too; a ticket past its
// expiry holds nothing.
func TestQueueYieldingTry(t *testing.T) {
	procs, admin := newQProcs(t, 2)
	c := ctx(t)
	const free, held, other = "fair:yield:free", "fair:yield:held", "fair:yield:other"
	h, err := procs[0].s.Acquire(c, store.AcquireRequest{Key: held, TTL: time.Minute})
	if err != nil || !h.OK {
		t.Fatal(h, err)
	}
	set := []store.WaitRequest{{Key: free, TTL: time.Minute, LockID: keys.NewLockID(), Set: 1},
		{Key: held, TTL: time.Minute, LockID: keys.NewLockID(), Set: 1}}
	if res, err := procs[1].s.QueueWait(c, set, procs[1].ch, qlife); err != nil || res[0].OK || res[0].Position != 1 {
		t.Fatalf("set: %+v %v, want queued at the head of the free key", res, err)
	} else if res[0].Queued {
		t.Errorf("the set's head ticket at the free key answered Queued; it waits for its other key")
	}
	// A ticket behind it, at the free key, waits for the queue alone.
	if res, err := procs[0].s.QueueWait(c, []store.WaitRequest{{Key: free, TTL: time.Minute, LockID: keys.NewLockID()}}, procs[0].ch, qlife); err != nil ||
		res[0].OK || res[0].Position != 2 || !res[0].Queued {
		t.Fatalf("second ticket: %+v %v, want queued second, Queued", res, err)
	}
	s := procs[0].s
	try := func(yield bool) (kinds []string) {
		t.Helper()
		note := func(name string, rs []store.AcquireResult, err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rs {
				if r.OK {
					if ok, err := s.Release(c, r.LockID); err != nil || !ok {
						t.Fatal(ok, err)
					}
				} else if r.Holder != "" || !r.ExpiresAt.IsZero() {
					t.Errorf("%s refused by the queue: %+v, want no holder or expiry", name, r)
				}
			}
			if !rs[0].OK && rs[0].Queued != yield {
				t.Errorf("%s refused, yield %v: Queued %v, want %v (refused for the queue alone)", name, yield, rs[0].Queued, yield)
			}
			if len(rs) > 1 && rs[1].Queued {
				t.Errorf("%s: the set's other key (free, its set refused) answered Queued", name)
			}
			if rs[0].OK {
				kinds = append(kinds, name)
			}
		}
		r, err := s.AcquireMany(c, []store.AcquireRequest{{Key: free, TTL: time.Minute, Yield: yield}})
		note("exclusive", r, err)
		r, err = s.AcquireSharedMany(c, []store.SharedRequest{{Key: free, TTL: time.Minute, Yield: yield}})
		note("reader", r, err)
		r, err = s.AcquireSharedMany(c, []store.SharedRequest{{Key: free, TTL: time.Minute, Limit: 3, Yield: yield}})
		note("permit", r, err)
		sr, err := s.AcquireSets(c, [][]store.AcquireRequest{{{Key: free, TTL: time.Minute, Yield: yield}, {Key: other, TTL: time.Minute, Yield: yield}}})
		if err == nil {
			r = sr[0]
		}
		note("set", r, err)
		return kinds
	}
	// The SQL API's acquire never queues, and always yields.
	sqlTry := func() bool {
		t.Helper()
		var id *string
		if err := procs[0].pool.QueryRow(c, "SELECT lock_id FROM syncguard_locks_acquire($1, 60000)", free).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if id != nil {
			if ok, err := s.Release(c, *id); err != nil || !ok {
				t.Fatal(ok, err)
			}
		}
		return id != nil
	}
	if sqlTry() {
		t.Error("the SQL API's acquire took the key a live ticket waits for")
	}
	if got := try(true); len(got) != 0 {
		t.Errorf("yielding tries took the key a live ticket waits for: %v", got)
	}
	// A yielding try of a key a lease holds is refused for the lease, not
	// the queue.
	if r, err := procs[1].s.AcquireMany(c, []store.AcquireRequest{{Key: held, TTL: time.Minute, Yield: true}}); err != nil || r[0].OK || r[0].Queued || r[0].ExpiresAt.IsZero() {
		t.Errorf("yielding try of a held key = %+v, %v; want refused by its holder, not Queued", r, err)
	}
	if got := try(false); len(got) != 4 {
		t.Errorf("tries that do not yield took %v, want every kind (they ignore the queue)", got)
	}
	if _, err := admin.Exec(c, "UPDATE syncguard_locks_queue SET expires_at_ms = 0"); err != nil {
		t.Fatal(err)
	}
	if got := try(true); len(got) != 4 {
		t.Errorf("yielding tries with only expired tickets took %v, want every kind", got)
	}
	if !sqlTry() {
		t.Error("the SQL API's acquire did not take a key with only expired tickets")
	}
}

// TestQueueWaitRefreshOnly: an item that only refreshes its ticket
// (WaitRequest.Refresh) keeps its place while queued and is answered its
// grant while it holds one, like any item; once that grant has ended, or
// its ticket expired, it is answered Gone: neither queued again nor
// granted anew. Without Refresh the same statement queues the lockId
// again and, the key free, grants it anew: a lease nobody waits for
// (what an attempt in flight when its waiter's grant came and went used
// to make).
func TestQueueWaitRefreshOnly(t *testing.T) {
	procs, admin := newQProcs(t, 2)
	c := ctx(t)
	tickets := func() int {
		t.Helper()
		var n int
		if err := admin.QueryRow(c, "SELECT count(*) FROM syncguard_locks_queue").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, shared := range []bool{false, true} {
		key := fmt.Sprintf("fair:refresh:%v", shared)
		h, err := procs[0].s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
		if err != nil || !h.OK {
			t.Fatal(h, err)
		}
		id := keys.NewLockID()
		item := store.WaitRequest{Key: key, TTL: time.Minute, LockID: id, Shared: shared}
		if res, err := procs[1].s.QueueWait(c, []store.WaitRequest{item}, procs[1].ch, qlife); err != nil || res[0].Position != 1 {
			t.Fatal(res, err)
		}
		refresh := item
		refresh.Refresh = true
		if res, err := procs[1].s.QueueWait(c, []store.WaitRequest{refresh}, procs[1].ch, qlife); err != nil || res[0].Position != 1 || res[0].Gone {
			t.Fatalf("shared %v: refresh of a queued ticket: %+v %v, want position 1", shared, res, err)
		}
		if rel, err := procs[0].s.QueueRelease(c, []store.ReleaseRequest{{LockID: h.LockID, Key: key}}, true, ""); err != nil || rel[0].Served != 1 {
			t.Fatal(rel, err)
		}
		res, err := procs[1].s.QueueWait(c, []store.WaitRequest{refresh}, procs[1].ch, qlife)
		if err != nil || !res[0].OK || res[0].Gone {
			t.Fatalf("shared %v: refresh of a granted ticket: %+v %v, want its grant", shared, res, err)
		}
		fence := res[0].Fence
		if ok, err := procs[1].s.Release(c, id); err != nil || !ok {
			t.Fatal(ok, err)
		}
		res, err = procs[1].s.QueueWait(c, []store.WaitRequest{refresh}, procs[1].ch, qlife)
		if err != nil || res[0].OK || !res[0].Gone || res[0].Position != 0 {
			t.Fatalf("shared %v: refresh after the grant ended: %+v %v, want gone", shared, res, err)
		}
		if n := tickets(); n != 0 {
			t.Fatalf("shared %v: %d tickets after a gone answer, want none", shared, n)
		}
		if info, err := procs[1].s.LookupByID(c, id); err != nil || info != nil {
			t.Fatalf("shared %v: the lockId holds %+v (%v) after a gone answer, want nothing", shared, info, err)
		}
		// Without Refresh: queued again and, the key free, granted anew.
		res, err = procs[1].s.QueueWait(c, []store.WaitRequest{item}, procs[1].ch, qlife)
		if err != nil || !res[0].OK {
			t.Fatalf("shared %v: the same item without Refresh: %+v %v, want granted anew", shared, res, err)
		}
		if !shared && res[0].Fence <= fence {
			t.Fatalf("granted anew with fence %d, want above %d", res[0].Fence, fence)
		}
		if ok, err := procs[1].s.Release(c, id); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	// An expired ticket: gone too, not revived.
	const key = "fair:refresh:expired"
	h, err := procs[0].s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
	if err != nil || !h.OK {
		t.Fatal(h, err)
	}
	id := keys.NewLockID()
	item := store.WaitRequest{Key: key, TTL: time.Minute, LockID: id, Refresh: false}
	if res, err := procs[1].s.QueueWait(c, []store.WaitRequest{item}, procs[1].ch, time.Second); err != nil || res[0].Position != 1 {
		t.Fatal(res, err)
	}
	var exp int64
	if err := admin.QueryRow(c, "SELECT expires_at_ms FROM syncguard_locks_queue WHERE lock_id = $1", id).Scan(&exp); err != nil {
		t.Fatal(err)
	}
	waitServer(t, admin, exp)
	item.Refresh = true
	if res, err := procs[1].s.QueueWait(c, []store.WaitRequest{item}, procs[1].ch, qlife); err != nil || !res[0].Gone || res[0].OK {
		t.Fatalf("refresh of an expired ticket: %+v %v, want gone", res, err)
	}
	if n := tickets(); n != 0 {
		t.Fatalf("%d tickets after the expired ticket's refresh, want none", n)
	}
	// Refresh is for single-key items.
	_, err = procs[1].s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: keys.NewLockID(), Set: 1, Refresh: true}}, procs[1].ch, qlife)
	if pglease.CodeOf(err) != pglease.CodeInvalidArgument {
		t.Fatalf("Refresh on a set's item: %v, want InvalidArgument", err)
	}
	if ok, err := procs[0].s.Release(c, h.LockID); err != nil || !ok {
		t.Fatal(ok, err)
	}
}

// TestQueueReleaseSelfTurns: a release that names its process's own queue
// channel (self) returns the notices for that process's tickets in its
// answer, on the first item, and does not send them; notices for other
// processes' tickets go out as before. A process is notified only for
// grants another process made.
func TestQueueReleaseSelfTurns(t *testing.T) {
	procs, _ := newQProcs(t, 2)
	c := ctx(t)
	const key = "fair:self"
	h, err := procs[0].s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute})
	if err != nil || !h.OK {
		t.Fatal(h, err)
	}
	owners := []int{0, 1, 0}
	ids := make([]string, len(owners))
	for i, o := range owners {
		ids[i] = keys.NewLockID()
		if res, err := procs[o].s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: ids[i]}}, procs[o].ch, qlife); err != nil || res[0].OK {
			t.Fatalf("waiter %d: %+v %v, want queued", i, res, err)
		}
	}
	holder, holderProc := h.LockID, 0
	for i, o := range owners {
		p := procs[holderProc]
		rel, err := p.s.QueueRelease(c, []store.ReleaseRequest{{LockID: holder, Key: key}}, true, p.ch)
		if err != nil || !rel[0].Released || rel[0].Served != 1 {
			t.Fatalf("release %d: %+v %v, want released and 1 served", i, rel, err)
		}
		info, err := procs[o].s.LookupByID(c, ids[i])
		if err != nil || info == nil {
			t.Fatalf("waiter %d not holding after the release: %v %v", i, info, err)
		}
		if o == holderProc {
			if len(rel[0].Turns) != 1 {
				t.Fatalf("release %d served its own process's waiter: turns %+v, want 1", i, rel[0].Turns)
			}
			tr := rel[0].Turns[0]
			if !tr.Granted || tr.Fence != info.Fence || tr.LockHash != pglease.HashKey(ids[i]) || tr.KeyHash != pglease.HashKey(key) {
				t.Fatalf("release %d: turn %+v, lease fence %d", i, tr, info.Fence)
			}
			if ms := tr.ExpiresAt.UnixMilli(); ms != info.ExpiresAt.UnixMilli() {
				t.Fatalf("release %d: turn expiry %d, lease %d", i, ms, info.ExpiresAt.UnixMilli())
			}
		} else if len(rel[0].Turns) != 0 {
			t.Fatalf("release %d served another process's waiter: turns %+v, want none", i, rel[0].Turns)
		}
		holder, holderProc = ids[i], o
	}
	if rel, err := procs[holderProc].s.QueueRelease(c, []store.ReleaseRequest{{LockID: holder, Key: key}}, true, procs[holderProc].ch); err != nil || rel[0].Served != 0 || len(rel[0].Turns) != 0 {
		t.Fatalf("last release: %+v %v", rel, err)
	}

	// Two keys in one release: both self turns on the first item.
	var rels []store.ReleaseRequest
	var waiting []string
	for _, k := range []string{"fair:self:a", "fair:self:b"} {
		h, err := procs[0].s.Acquire(c, store.AcquireRequest{Key: k, TTL: time.Minute})
		if err != nil || !h.OK {
			t.Fatal(h, err)
		}
		rels = append(rels, store.ReleaseRequest{LockID: h.LockID, Key: k})
		id := keys.NewLockID()
		waiting = append(waiting, pglease.HashKey(id))
		if res, err := procs[0].s.QueueWait(c, []store.WaitRequest{{Key: k, TTL: time.Minute, LockID: id}}, procs[0].ch, qlife); err != nil || res[0].OK {
			t.Fatalf("waiter on %s: %+v %v, want queued", k, res, err)
		}
	}
	rel, err := procs[0].s.QueueRelease(c, rels, true, procs[0].ch)
	if err != nil || len(rel) != 2 || len(rel[0].Turns) != 2 || len(rel[1].Turns) != 0 {
		t.Fatalf("release of two keys: %+v %v, want both turns on the first item", rel, err)
	}
	got := []string{rel[0].Turns[0].LockHash, rel[0].Turns[1].LockHash}
	sort.Strings(got)
	sort.Strings(waiting)
	if fmt.Sprint(got) != fmt.Sprint(waiting) {
		t.Fatalf("turns for %v, want %v", got, waiting)
	}

	settleAt(procs, 2)
	// Process 0 was notified for the grant process 1's release made (waiter
	// 2) only; process 1 for the grant process 0 made (waiter 1).
	for i, want := range []int64{1, 1} {
		if n := procs[i].n.Load(); n != want {
			t.Errorf("process %d received %d notifications, want %d: %+v", i, n, want, procs[i].turnsSeen())
		}
	}
}

// TestQueueWaitOneItemAnswersAsABatch: a wait of one key's exclusive
// items (the lighter function) answers what the same items answer in a
// batch with another key (the batch function), in every case the lighter
// function meets, with one item and with two: behind other tickets, its own ticket refreshed in place, expired
// tickets ahead, at the head of a held key, a free key, a lockId already
// granted (alone, or with others queued), and the key's advisory lock
// kept by another transaction.
func TestQueueWaitOneItemAnswersAsABatch(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{NotifyChannel: "pglease_qwait_one"})
	c := ctx(t)
	qch := store.QueueChannel()
	wait := func(key, id string, life time.Duration) store.WaitResult {
		t.Helper()
		res, err := s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: id}}, qch, life)
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	type outcome struct {
		ok, queued, holder, retry bool
		position                  int
	}
	cases := []struct {
		name string
		// setup prepares key and returns the items' lockIds and a cleanup.
		setup func(t *testing.T, key string) ([]string, func())
		want  []outcome
	}{
		{"behind two tickets", func(t *testing.T, key string) ([]string, func()) {
			acquireOne(t, s, key, time.Minute)
			wait(key, keys.NewLockID(), time.Minute)
			wait(key, keys.NewLockID(), time.Minute)
			return []string{keys.NewLockID()}, func() {}
		}, []outcome{{queued: true, position: 3}}},
		{"its own ticket refreshed", func(t *testing.T, key string) ([]string, func()) {
			acquireOne(t, s, key, time.Minute)
			wait(key, keys.NewLockID(), time.Minute)
			id := keys.NewLockID()
			wait(key, id, time.Minute)
			wait(key, keys.NewLockID(), time.Minute)
			return []string{id}, func() {}
		}, []outcome{{queued: true, position: 2}}},
		{"expired tickets ahead", func(t *testing.T, key string) ([]string, func()) {
			acquireOne(t, s, key, time.Minute)
			wait(key, keys.NewLockID(), time.Minute)
			wait(key, keys.NewLockID(), 100*time.Millisecond)
			wait(key, keys.NewLockID(), 100*time.Millisecond)
			time.Sleep(250 * time.Millisecond)
			return []string{keys.NewLockID()}, func() {}
		}, []outcome{{queued: true, position: 2}}},
		{"head of a held key", func(t *testing.T, key string) ([]string, func()) {
			acquireOne(t, s, key, time.Minute)
			return []string{keys.NewLockID()}, func() {}
		}, []outcome{{holder: true, retry: true, position: 1}}},
		{"free key", func(t *testing.T, key string) ([]string, func()) {
			return []string{keys.NewLockID()}, func() {}
		}, []outcome{{ok: true}}},
		{"lockId already granted", func(t *testing.T, key string) ([]string, func()) {
			id := keys.NewLockID()
			if r, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute, LockID: id}); err != nil || !r.OK {
				t.Fatalf("acquire = %+v, %v", r, err)
			}
			return []string{id}, func() {}
		}, []outcome{{ok: true}}},
		{"lockId already granted, others queued", func(t *testing.T, key string) ([]string, func()) {
			id := keys.NewLockID()
			if r, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute, LockID: id}); err != nil || !r.OK {
				t.Fatalf("acquire = %+v, %v", r, err)
			}
			wait(key, keys.NewLockID(), time.Minute)
			wait(key, keys.NewLockID(), time.Minute)
			return []string{id}, func() {}
		}, []outcome{{ok: true}}},
		{"advisory lock kept by another transaction", func(t *testing.T, key string) ([]string, func()) {
			acquireOne(t, s, key, time.Minute)
			wait(key, keys.NewLockID(), time.Minute)
			tx, err := pool.Begin(c)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(c, "SELECT pg_advisory_xact_lock(hashtext($1))", key); err != nil {
				t.Fatal(err)
			}
			return []string{keys.NewLockID()}, func() { _ = tx.Rollback(c) }
		}, []outcome{{retry: true}}},
	}
	cases = append(cases, []struct {
		name  string
		setup func(t *testing.T, key string) ([]string, func())
		want  []outcome
	}{
		{"two behind two tickets", func(t *testing.T, key string) ([]string, func()) {
			acquireOne(t, s, key, time.Minute)
			wait(key, keys.NewLockID(), time.Minute)
			wait(key, keys.NewLockID(), time.Minute)
			return []string{keys.NewLockID(), keys.NewLockID()}, func() {}
		}, []outcome{{queued: true, position: 3}, {queued: true, position: 4}}},
		{"one queued ahead, one new", func(t *testing.T, key string) ([]string, func()) {
			acquireOne(t, s, key, time.Minute)
			wait(key, keys.NewLockID(), time.Minute)
			id := keys.NewLockID()
			wait(key, id, time.Minute)
			wait(key, keys.NewLockID(), time.Minute)
			return []string{keys.NewLockID(), id}, func() {}
		}, []outcome{{queued: true, position: 4}, {queued: true, position: 2}}},
		{"the first at the head", func(t *testing.T, key string) ([]string, func()) {
			acquireOne(t, s, key, time.Minute)
			id := keys.NewLockID()
			wait(key, id, time.Minute)
			return []string{id, keys.NewLockID()}, func() {}
		}, []outcome{{holder: true, retry: true, position: 1}, {queued: true, position: 2}}},
		{"the first at the head, another behind it", func(t *testing.T, key string) ([]string, func()) {
			acquireOne(t, s, key, time.Minute)
			id := keys.NewLockID()
			wait(key, id, time.Minute)
			wait(key, keys.NewLockID(), time.Minute)
			return []string{id, keys.NewLockID()}, func() {}
		}, []outcome{{holder: true, retry: true, position: 1}, {queued: true, position: 3}}},
		{"two at a free key", func(t *testing.T, key string) ([]string, func()) {
			return []string{keys.NewLockID(), keys.NewLockID()}, func() {}
		}, []outcome{{ok: true}, {holder: true, retry: true, position: 1}}},
		{"one of two already granted", func(t *testing.T, key string) ([]string, func()) {
			id := keys.NewLockID()
			if r, err := s.Acquire(c, store.AcquireRequest{Key: key, TTL: time.Minute, LockID: id}); err != nil || !r.OK {
				t.Fatalf("acquire = %+v, %v", r, err)
			}
			wait(key, keys.NewLockID(), time.Minute)
			return []string{keys.NewLockID(), id}, func() {}
		}, []outcome{{queued: true, position: 2}, {ok: true}}},
	}...)
	for _, tc := range cases {
		for _, batch := range []bool{false, true} {
			key := fmt.Sprintf("qwait-one-%s-%v", tc.name, batch)
			ids, done := tc.setup(t, key)
			var reqs []store.WaitRequest
			for _, id := range ids {
				reqs = append(reqs, store.WaitRequest{Key: key, TTL: time.Minute, LockID: id})
			}
			if batch {
				reqs = append(reqs, store.WaitRequest{Key: key + "-other", TTL: time.Minute, LockID: keys.NewLockID()})
			}
			res, err := s.QueueWait(c, reqs, qch, time.Minute)
			done()
			if err != nil {
				t.Fatalf("%s (batch %v): %v", tc.name, batch, err)
			}
			for i, id := range ids {
				r := res[i]
				got := outcome{ok: r.OK, queued: r.Queued, holder: r.Holder != "", retry: r.RetryAfter > 0, position: r.Position}
				if got != tc.want[i] {
					t.Errorf("%s (batch %v) item %d = %+v (%+v), want %+v", tc.name, batch, i, got, r, tc.want[i])
				}
				if tc.want[i].ok && (r.LockID != id || r.Fence == 0) {
					t.Errorf("%s (batch %v) item %d: granted %+v, want its lockId and a fence", tc.name, batch, i, r)
				}
			}
			if batch && !res[len(ids)].OK {
				t.Errorf("%s: the batch's other item = %+v", tc.name, res[len(ids)])
			}
		}
	}
}

// TestQueueReleaseOneItemAnswersAsABatch: the release of one lease (the
// lighter function of plain arguments) answers, and leaves the tables,
// as the same release in a batch does (the batch function), in every case
// the lighter function meets: an exclusive head of another process or of
// the releasing one, a reader at the head, no ticket, an expired lease, a
// revoke's delay in force, the fence counter at FENCE MAX, and the key's
// advisory lock kept by another transaction.
func TestQueueReleaseOneItemAnswersAsABatch(t *testing.T) {
	t.Parallel()
	s, pool, _ := newStore(t, store.Config{NotifyChannel: "pglease_qrelease_one"})
	c := ctx(t)
	self, other := store.QueueChannel(), store.QueueChannel()
	enqueue := func(key string, ch string, shared bool) string {
		t.Helper()
		id := keys.NewLockID()
		res, err := s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: id, Shared: shared}}, ch, time.Minute)
		if err != nil || res[0].OK {
			t.Fatalf("enqueue = %+v, %v", res, err)
		}
		return id
	}
	type outcome struct {
		released bool
		served   int
		turns    string // each turn: "g" granted with the next fence, "t" a turn with no grant
		holder   string // the key's lock row: "head" (the head ticket's lockId), "old", "none"
	}
	cases := []struct {
		name string
		// setup prepares key: the lease to release, its ticket at the
		// head (if any) and a cleanup.
		setup func(t *testing.T, key string) (lease store.AcquireResult, head string, done func())
		want  outcome
	}{
		{"exclusive head of another process", func(t *testing.T, key string) (store.AcquireResult, string, func()) {
			r := acquireOne(t, s, key, time.Minute)
			head := enqueue(key, other, false)
			enqueue(key, self, false)
			return r, head, func() {}
		}, outcome{released: true, served: 1, holder: "head"}},
		{"exclusive head of the releasing process", func(t *testing.T, key string) (store.AcquireResult, string, func()) {
			r := acquireOne(t, s, key, time.Minute)
			head := enqueue(key, self, false)
			enqueue(key, other, false)
			return r, head, func() {}
		}, outcome{released: true, served: 1, turns: "g", holder: "head"}},
		{"expired tickets before the head", func(t *testing.T, key string) (store.AcquireResult, string, func()) {
			r := acquireOne(t, s, key, time.Minute)
			if _, err := s.QueueWait(c, []store.WaitRequest{{Key: key, TTL: time.Minute, LockID: keys.NewLockID()}}, other, 100*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			time.Sleep(250 * time.Millisecond)
			head := enqueue(key, self, false)
			return r, head, func() {}
		}, outcome{released: true, served: 1, turns: "g", holder: "head"}},
		{"reader at the head", func(t *testing.T, key string) (store.AcquireResult, string, func()) {
			r := acquireOne(t, s, key, time.Minute)
			head := enqueue(key, self, true)
			return r, head, func() {}
		}, outcome{released: true, served: 1, turns: "g", holder: "none"}},
		{"no ticket", func(t *testing.T, key string) (store.AcquireResult, string, func()) {
			return acquireOne(t, s, key, time.Minute), "", func() {}
		}, outcome{released: true, holder: "none"}},
		{"lease expired", func(t *testing.T, key string) (store.AcquireResult, string, func()) {
			r := acquireOne(t, s, key, time.Minute)
			head := enqueue(key, self, false)
			if _, err := pool.Exec(c, "UPDATE syncguard_locks SET expires_at_ms = expires_at_ms - 120000 WHERE key = $1", key); err != nil {
				t.Fatal(err)
			}
			return r, head, func() {}
		}, outcome{served: 1, turns: "g", holder: "head"}},
		{"revoke's delay in force", func(t *testing.T, key string) (store.AcquireResult, string, func()) {
			r := acquireOne(t, s, key, time.Minute)
			head := enqueue(key, self, false)
			if _, err := pool.Exec(c, `INSERT INTO syncguard_locks_holders AS h (key, lock_id, holder, delay_until_ms)
				VALUES ($1, '', '', floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + 60000)
				ON CONFLICT (key) DO UPDATE SET delay_until_ms = EXCLUDED.delay_until_ms`, key); err != nil {
				t.Fatal(err)
			}
			return r, head, func() {}
		}, outcome{released: true, holder: "none"}},
		{"fence at MAX", func(t *testing.T, key string) (store.AcquireResult, string, func()) {
			r := acquireOne(t, s, key, time.Minute)
			head := enqueue(key, self, false)
			if _, err := pool.Exec(c, "UPDATE syncguard_fence_counters SET fence = $2 WHERE fence_key = $1", "fence:"+key, int64(keys.FenceMax)); err != nil {
				t.Fatal(err)
			}
			return r, head, func() {}
		}, outcome{released: true, turns: "t", holder: "none"}},
		{"advisory lock kept by another transaction", func(t *testing.T, key string) (store.AcquireResult, string, func()) {
			r := acquireOne(t, s, key, time.Minute)
			head := enqueue(key, self, false)
			tx, err := pool.Begin(c)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(c, "SELECT pg_advisory_xact_lock(hashtext($1))", key); err != nil {
				t.Fatal(err)
			}
			return r, head, func() { _ = tx.Rollback(c) }
		}, outcome{released: true, holder: "none"}}, // the head is told its turn by a notification
	}
	for _, tc := range cases {
		for _, batch := range []bool{false, true} {
			key := fmt.Sprintf("qrel-one-%s-%v", tc.name, batch)
			lease, head, done := tc.setup(t, key)
			reqs := []store.ReleaseRequest{{LockID: lease.LockID, Key: key}}
			if batch {
				o := acquireOne(t, s, key+"-other", time.Minute)
				reqs = append(reqs, store.ReleaseRequest{LockID: o.LockID, Key: key + "-other"})
			}
			res, err := s.QueueRelease(c, reqs, true, self)
			done()
			if err != nil {
				t.Fatalf("%s (batch %v): %v", tc.name, batch, err)
			}
			r := res[0]
			got := outcome{released: r.Released, served: r.Served, holder: "none"}
			for _, tu := range r.Turns {
				switch {
				case tu.LockHash != pglease.HashKey(head):
					t.Errorf("%s (batch %v): a turn for another lockId", tc.name, batch)
				case tu.Granted && tu.Fence >= lease.Fence: // a reader's fence repeats the counter
					got.turns += "g"
				case !tu.Granted:
					got.turns += "t"
				default:
					t.Errorf("%s (batch %v): turn %+v, want a fence from %d", tc.name, batch, tu, lease.Fence)
				}
			}
			var id, fence, holder string
			var wait *int64
			err = pool.QueryRow(c, `SELECT l.lock_id, l.fence, coalesce(h.holder, ''), h.excl_wait_until_ms FROM syncguard_locks AS l
				LEFT JOIN syncguard_locks_holders AS h ON h.key = l.key AND h.lock_id = l.lock_id WHERE l.key = $1`, key).Scan(&id, &fence, &holder, &wait)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
			case err != nil:
				t.Fatal(err)
			case id == head:
				got.holder = "head"
				if want := fmt.Sprintf("%015d", lease.Fence+1); fence != want || holder != store.DefaultHolder() || (wait != nil && *wait != 0) {
					t.Errorf("%s (batch %v): the head's row: fence %s (want %s), holder %q, mark %v", tc.name, batch, fence, want, holder, wait)
				}
			case id == lease.LockID:
				got.holder = "old"
			default:
				got.holder = "other"
			}
			if got != tc.want {
				t.Errorf("%s (batch %v) = %+v (%+v), want %+v", tc.name, batch, got, r, tc.want)
			}
			if batch && !res[1].Released {
				t.Errorf("%s: the batch's other item = %+v", tc.name, res[1])
			}
			var tickets int
			if err := pool.QueryRow(c, "SELECT count(*) FROM syncguard_locks_queue WHERE lock_id = $1", head).Scan(&tickets); err != nil {
				t.Fatal(err)
			}
			if served := got.holder == "head" || strings.Contains(got.turns, "g"); served && tickets != 0 {
				t.Errorf("%s (batch %v): the served ticket is still queued", tc.name, batch)
			}
		}
	}
}
