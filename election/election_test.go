package election

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/retry"
)

const (
	electionChildEnv = "PGLEASE_ELECTION_CHILD" // the candidate's holder identity
	electionTTL      = 1500 * time.Millisecond
	electionName     = "leader:test"
)

// fencedWrite records one write of a term: accepted only while no higher
// fence wrote (the fencing a leader's work uses).
const fencedWrite = `WITH u AS (UPDATE election_log SET fence = $1 WHERE fence <= $1 RETURNING fence)
INSERT INTO election_writes (fence) SELECT fence FROM u RETURNING fence`

// electionChild is a candidate process: it campaigns, and while it leads
// makes a fenced write every 50 ms, printing events on stdout.
func electionChild() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	pool, err := childPool(ctx)
	if err != nil {
		say("error %v", err)
		return 1
	}
	defer pool.Close()
	m, err := manager.New(pool, manager.Config{Config: pg.Config{Holder: os.Getenv(electionChildEnv)}, Retry: retry.Policy{Multiplier: 1, Base: 100 * time.Millisecond}})
	if err != nil {
		say("error %v", err)
		return 1
	}
	defer m.Close(context.Background())
	say("ready")
	err = Run(ctx, m, Config{
		Name: electionName, TTL: electionTTL,
		OnNewLeader: func(id string, self bool) { say("leader %s %t", id, self) },
		OnStoppedLeading: func(term *Term, cause error) {
			say("stopped %d %v", term.Fence(), errors.Is(cause, pglease.ErrLockLost))
		},
	}, func(ctx context.Context, term *Term) error {
		say("lead %d", term.Fence())
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			var f int64
			err := pool.QueryRow(ctx, fencedWrite, int64(term.Fence())).Scan(&f)
			switch {
			case err == nil:
				say("wrote %d", f)
			case ctx.Err() == nil:
				say("refused %d %v", term.Fence(), err)
			}
			select {
			case <-ctx.Done():
				say("lost %d", term.Fence())
				return ctx.Err()
			case <-t.C:
			}
		}
	})
	say("end %v", err)
	return 0
}

// candidate is a running child process and the events it printed.
type candidate struct {
	id  string
	cmd *exec.Cmd

	mu     sync.Mutex
	log    []string // "lead 3", "lost 3", "leader cand-1 false", …
	cursor int      // events before it were consumed by next
	exited bool
}

func startCandidate(t *testing.T, schema, id string) *candidate {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), electionChildEnv+"="+id, childURLEnv+"="+pgtest.URL(t), childSchemaEnv+"="+schema)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &candidate{id: id, cmd: cmd}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.mu.Lock()
			c.log = append(c.log, sc.Text())
			c.mu.Unlock()
		}
		c.mu.Lock()
		c.exited = true
		c.mu.Unlock()
	}()
	if ev := c.next(t, "ready", 30*time.Second); ev != "ready" {
		t.Fatalf("%s: %s", id, ev)
	}
	return c
}

// take consumes events up to and including the next one starting with
// prefix; ok is false (nothing consumed) when there is none yet.
func (c *candidate) take(prefix string) (ev string, ok, exited bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := c.cursor; i < len(c.log); i++ {
		if strings.HasPrefix(c.log[i], prefix) {
			c.cursor = i + 1
			return c.log[i], true, false
		}
	}
	return "", false, c.exited
}

// next returns the next event starting with prefix, failing after d.
func (c *candidate) next(t *testing.T, prefix string, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ev, ok, exited := c.take(prefix)
		switch {
		case ok:
			return ev
		case exited:
			t.Fatalf("%s exited while waiting for %q", c.id, prefix)
		case time.Now().After(deadline):
			t.Fatalf("%s: no %q within %v", c.id, prefix, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// firstLead waits for the first "lead" among cands, returning who and the fence.
func firstLead(t *testing.T, cands []*candidate, d time.Duration) (*candidate, int64) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		for _, c := range cands {
			if ev, ok, _ := c.take("lead "); ok {
				n, _ := strconv.ParseInt(strings.TrimPrefix(ev, "lead "), 10, 64)
				return c, n
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no candidate led within %v", d)
	return nil, 0
}

// TestElectionProcesses: three candidate processes. The leader is killed
// with SIGKILL, then the next one is stopped with SIGSTOP: each time
// another leads within TTL + tolerance (+ slack for a busy machine) with
// a higher fence; the stopped leader, resumed, learns it lost and none of
// its writes lands after the new leader's (the fenced writes form one
// block per term, in fence order).
func TestElectionProcesses(t *testing.T) {
	t.Parallel()
	pool, schema := pgtest.Pool(t)
	ctx := ctxT(t)
	m, err := manager.New(pool, manager.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(ctx)
	if err := m.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE election_log (fence bigint NOT NULL); INSERT INTO election_log VALUES (0);
		CREATE TABLE election_writes (id bigserial PRIMARY KEY, fence bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var cands []*candidate
	for i := range 3 {
		cands = append(cands, startCandidate(t, schema, fmt.Sprint("cand-", i)))
	}
	bound := electionTTL + keys.TimeTolerance + 3*time.Second // + retry delay and a busy machine
	a, fa := firstLead(t, cands, 30*time.Second)
	a.next(t, "wrote", bound)
	others := func(not ...*candidate) []*candidate {
		var out []*candidate
		for _, c := range cands {
			skip := false
			for _, n := range not {
				skip = skip || c == n
			}
			if !skip {
				out = append(out, c)
			}
		}
		return out
	}
	// The others learn who leads.
	for _, c := range others(a) {
		if ev := c.next(t, "leader ", bound); ev != "leader "+a.id+" false" {
			t.Fatalf("%s saw %q, want leader %s", c.id, ev, a.id)
		}
	}

	// SIGKILL the leader.
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	b, fb := firstLead(t, others(a), bound+time.Second)
	took := time.Since(killed)
	t.Logf("after SIGKILL: %s leads with fence %d after %v (bound %v)", b.id, fb, took, bound)
	if took > bound {
		t.Fatalf("new leader after %v, bound %v", took, bound)
	}
	if fb <= fa {
		t.Fatalf("fence %d after %d", fb, fa)
	}
	b.next(t, "wrote", bound)

	// SIGSTOP the new leader: the third leads; resumed, b learns it lost.
	if err := b.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	c, fc := firstLead(t, others(a, b), bound+time.Second)
	took = time.Since(stopped)
	t.Logf("after SIGSTOP: %s leads with fence %d after %v", c.id, fc, took)
	if took > bound || fc <= fb {
		t.Fatalf("new leader after %v (bound %v), fence %d after %d", took, bound, fc, fb)
	}
	c.next(t, "wrote", bound)
	if err := b.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	b.next(t, fmt.Sprint("lost ", fb), bound)
	t.Logf("the resumed leader learned its loss after %v", time.Since(resumed))
	if ev := b.next(t, "stopped ", bound); ev != fmt.Sprintf("stopped %d true", fb) {
		t.Fatalf("%s: %q, want a stop by loss", b.id, ev)
	}
	// It campaigns again and sees c lead.
	if ev := b.next(t, "leader ", bound); ev != "leader "+c.id+" false" {
		t.Fatalf("%s saw %q after its loss", b.id, ev)
	}

	// The writes: one block per term, fences increasing.
	rows, err := pool.Query(ctx, "SELECT fence FROM election_writes ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	var seq []int64
	for rows.Next() {
		var f int64
		if err := rows.Scan(&f); err != nil {
			t.Fatal(err)
		}
		seq = append(seq, f)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	terms := map[int64]bool{}
	for i, f := range seq {
		if i > 0 && f < seq[i-1] {
			t.Fatalf("a write of fence %d landed after one of fence %d: %v", f, seq[i-1], seq)
		}
		terms[f] = true
	}
	if !terms[fa] || !terms[fb] || !terms[fc] {
		t.Fatalf("terms that wrote: %v, want %d, %d, %d", terms, fa, fb, fc)
	}
}

// In one process: several candidates; a leader that returns resigns and
// the next term starts with a higher fence; callbacks in order; a bad
// configuration fails before any I/O.
func TestElectionResignAndCallbacks(t *testing.T) {
	t.Parallel()
	b := setup(t, manager.Config{Retry: retry.Policy{Multiplier: 1, Base: 50 * time.Millisecond}})
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var mu sync.Mutex
	var leading int
	var fences []pglease.Fence
	var events []string
	var wg sync.WaitGroup
	terms := make(chan struct{}, 100)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprint("c", i)
			err := Run(ctx, b.m, Config{
				Name: "leader:resign", TTL: time.Second,
				OnStoppedLeading: func(term *Term, cause error) {
					mu.Lock()
					events = append(events, fmt.Sprintf("%s stopped %v", name, cause))
					mu.Unlock()
				},
			}, func(fctx context.Context, term *Term) error {
				mu.Lock()
				events = append(events, name+" started")
				leading++
				n := leading
				fences = append(fences, term.Fence())
				mu.Unlock()
				if n != 1 {
					t.Errorf("%d leaders at once", n)
				}
				time.Sleep(20 * time.Millisecond) // work
				mu.Lock()
				leading--
				mu.Unlock()
				terms <- struct{}{}
				return nil // resign
			})
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run = %v", err)
			}
		}()
	}
	for range 6 {
		select {
		case <-terms:
		case <-time.After(waitTimeout()):
			t.Fatal("terms stopped coming")
		}
	}
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fences %v not increasing", fences)
		}
	}
	// Per candidate, started and stopped alternate (across candidates the
	// callbacks may interleave: a release hands the lease to the next
	// candidate before the resigning one's OnStoppedLeading runs; fn
	// never overlapped, checked above).
	open := map[string]bool{}
	for _, ev := range events {
		name, what, _ := strings.Cut(ev, " ")
		if strings.HasPrefix(what, "started") == open[name] {
			t.Fatalf("events out of order for %s: %v", name, events)
		}
		open[name] = what == "started"
		if strings.HasPrefix(what, "stopped") && what != "stopped <nil>" && !strings.Contains(what, "context canceled") {
			t.Fatalf("a resignation reported %q", ev)
		}
	}

	// Bad configuration: InvalidArgument, no I/O needed.
	for _, e := range []Config{{Name: ""}, {Name: "x", TTL: time.Millisecond}, {Name: "x", TTL: 299 * time.Millisecond}} {
		if err := Run(ctxT(t), b.m, e, func(context.Context, *Term) error { return nil }); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Fatalf("Run(%+v) = %v", e, err)
		}
	}
	if err := Run(ctxT(t), b.m, Config{Name: "x"}, nil); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatal(err)
	}
	if err := Run(ctxT(t), nil, Config{Name: "x"}, func(context.Context, *Term) error { return nil }); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Fatalf("Run with a nil Manager = %v", err)
	}
}

// termSeen is what a test's fn saw of its term.
type termSeen struct {
	term     *Term
	whileErr error // Err while leading
	sameCtx  bool  // fn's ctx is the term's Context
}

// TestElectionTermHandle: a term is a pglease.Handle whose Context is
// fn's context and whose Err is nil while leading, then a *pglease.Error:
// ErrReleased after term.Release (fn resigning early; a second Release is
// a no-op), ErrReleased wrapping context.Canceled when the election's
// context ends, ErrLockLost when the lease is taken away, ErrClosed when
// the Manager closes. A nil *Term answers InvalidArgument.
func TestElectionTermHandle(t *testing.T) {
	t.Parallel()
	b := setup(t, manager.Config{})
	ctx := ctxT(t)
	const ttl = time.Second

	// run starts an election on name; fn reports its term and then does
	// what act says, returning when the term's context ends.
	type run struct {
		seen    chan termSeen
		stopped chan error
		done    chan error
		cancel  context.CancelFunc
	}
	start := func(m *manager.Manager, name string, act func(*Term)) *run {
		r := &run{seen: make(chan termSeen, 1), stopped: make(chan error, 1), done: make(chan error, 1)}
		ectx, cancel := context.WithCancel(ctx)
		r.cancel = cancel
		first := true
		go func() {
			r.done <- Run(ectx, m, Config{Name: name, TTL: ttl,
				OnStoppedLeading: func(term *Term, cause error) {
					select {
					case r.stopped <- cause:
					default:
					}
				},
			}, func(fctx context.Context, term *Term) error {
				if first {
					first = false
					var h pglease.Handle = term
					r.seen <- termSeen{term: term, whileErr: h.Err(), sameCtx: fctx == h.Context()}
					act(term)
				}
				<-fctx.Done()
				return nil
			})
		}()
		return r
	}
	get := func(r *run) termSeen {
		t.Helper()
		select {
		case s := <-r.seen:
			if s.whileErr != nil || !s.sameCtx {
				t.Fatalf("while leading: Err = %v, fn's ctx is the term's: %v", s.whileErr, s.sameCtx)
			}
			if s.term.Fence() == 0 || s.term.Lock() == nil || s.term.Lock().Key() == "" || s.term.Lock().Fence() != s.term.Fence() {
				t.Fatalf("term accessors: fence %d, lock %v", s.term.Fence(), s.term.Lock())
			}
			return s
		case <-time.After(waitTimeout()):
			t.Fatal("no term")
			panic("unreachable")
		}
	}
	ended := func(name string, term *Term, want *pglease.Error) {
		t.Helper()
		select {
		case <-term.Done():
		case <-time.After(waitTimeout()):
			t.Fatalf("%s: the term's context did not end", name)
		}
		var e *pglease.Error
		if err := term.Err(); !errors.As(err, &e) || !errors.Is(err, want) {
			t.Fatalf("%s: Err = %v (%T), want a *pglease.Error matching %v", name, err, err, want.Code)
		}
		if c := context.Cause(term.Context()); c != term.Err() {
			t.Fatalf("%s: context.Cause %v != Err %v", name, c, term.Err())
		}
	}

	// Release inside fn resigns at once.
	relErr := make(chan error, 2)
	r := start(b.m, "leader:term-release", func(term *Term) {
		relErr <- term.Release(term.Context()) // fn's own ctx: not aborted by the term's end
		relErr <- term.Release(ctx)
	})
	s := get(r)
	ended("release", s.term, pglease.ErrReleased)
	if e1, e2 := <-relErr, <-relErr; e1 != nil || e2 != nil {
		t.Fatalf("Release = %v, again = %v", e1, e2)
	}
	if c := <-r.stopped; c != nil {
		t.Fatalf("OnStoppedLeading after Release: cause %v, want nil (a resignation)", c)
	}
	r.cancel()
	if err := <-r.done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v", err)
	}

	// The election's context ends: ErrReleased wrapping context.Canceled,
	// and the lease is released once fn returned.
	r = start(b.m, "leader:term-cancel", func(*Term) {})
	s = get(r)
	r.cancel()
	ended("cancel", s.term, pglease.ErrReleased)
	if !errors.Is(s.term.Err(), context.Canceled) || errors.Is(s.term.Err(), pglease.ErrLockLost) {
		t.Fatalf("cancel: Err = %v, want ErrReleased wrapping context.Canceled", s.term.Err())
	}
	if err := <-r.done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v", err)
	}
	if c := <-r.stopped; !errors.Is(c, context.Canceled) {
		t.Fatalf("OnStoppedLeading after cancel: cause %v", c)
	}
	if _, ok := lockRow(t, b.pool, "leader:term-cancel"); ok {
		t.Fatal("the lease is still held after Run returned")
	}

	// The lease is taken away on the server: ErrLockLost.
	r = start(b.m, "leader:term-lost", func(*Term) {})
	s = get(r)
	if _, err := b.pool.Exec(ctx, "DELETE FROM syncguard_locks WHERE key = $1", "leader:term-lost"); err != nil {
		t.Fatal(err)
	}
	ended("lost", s.term, pglease.ErrLockLost)
	if c := <-r.stopped; !errors.Is(c, pglease.ErrLockLost) {
		t.Fatalf("OnStoppedLeading after the loss: cause %v", c)
	}
	r.cancel()
	<-r.done

	// The Manager closes: ErrClosed.
	peer := b.newPeer(t, manager.Config{})
	r = start(peer, "leader:term-closed", func(*Term) {})
	s = get(r)
	if err := peer.Close(ctx); err != nil {
		t.Fatal(err)
	}
	ended("closed", s.term, pglease.ErrClosed)
	if err := <-r.done; !errors.Is(err, pglease.ErrClosed) {
		t.Fatalf("Run after Close = %v", err)
	}

	// A nil *Term.
	var none *Term
	var h pglease.Handle = none
	if err := h.Release(ctx); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("nil Term Release = %v", err)
	}
	if err := h.Err(); !errors.Is(err, pglease.ErrInvalidArgument) {
		t.Errorf("nil Term Err = %v", err)
	}
	select {
	case <-h.Done():
	default:
		t.Error("nil Term Done not closed")
	}
	if none.Fence() != 0 || none.Lock() != nil {
		t.Error("nil Term accessors are not zero")
	}
}
