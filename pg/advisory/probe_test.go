package advisory

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgtest"
)

const probeSQL = "SELECT pg_backend_pid()"

// probeTracer watches one connection (set with watch, after Open) with a
// statement recorder: it records when each probe statement was sent, and
// signals each probe answered on answered (capacity 1, latest only).
type probeTracer struct {
	rec      pgtest.Recorder
	mu       sync.Mutex
	conn     *pgx.Conn
	starts   []time.Time
	answered chan time.Time
}

func newProbeTracer() *probeTracer {
	p := &probeTracer{answered: make(chan time.Time, 1)}
	p.rec.OnStart = func(st pgtest.Statement) {
		if p.isProbe(st.Conn, st.SQL) {
			p.mu.Lock()
			p.starts = append(p.starts, st.Start)
			p.mu.Unlock()
		}
	}
	p.rec.OnEnd = func(st pgtest.Statement, err error) {
		if err != nil || !p.isProbe(st.Conn, st.SQL) {
			return
		}
		// One writer (the session's connection is used by one goroutine at
		// a time): drop a stale signal, then send.
		select {
		case <-p.answered:
		default:
		}
		p.answered <- time.Now()
	}
	return p
}

func (p *probeTracer) watch(c *pgx.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conn = c
}

func (p *probeTracer) isProbe(c *pgx.Conn, sql string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return c == p.conn && sql == probeSQL
}

func (p *probeTracer) probeStarts() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.starts)
}

// tracedSession opens a Session with o on a pool whose connections carry
// a probeTracer watching the Session's connection.
func tracedSession(t *testing.T, o *Options, configure ...func(*pgxpool.Config)) (*Session, *probeTracer) {
	t.Helper()
	tr := newProbeTracer()
	pool := newPool(t, append(configure, func(c *pgxpool.Config) { c.ConnConfig.Tracer = &tr.rec })...)
	s := openSession(t, pool, o)
	tr.watch(s.conn)
	return s, tr
}

// TestProbeRunsEveryInterval: an idle session that holds a
// lock is probed every ProbeInterval, not every other one. Before the
// fix, the probe's own reply counted as "talked to the server within the
// interval" at the next tick, so every second tick was skipped and the
// probes were 2 × ProbeInterval apart.
func TestProbeRunsEveryInterval(t *testing.T) {
	t.Parallel()
	const interval = 300 * time.Millisecond
	s, tr := tracedSession(t, &Options{ProbeInterval: interval, ProbeTimeout: time.Second})
	ctx := ctxT(t, 20*time.Second)
	l, ok, err := s.TryLock(ctx, randKey())
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	defer l.Release(ctx)
	const want = 9
	deadline := time.Now().Add(want * 4 * interval)
	for len(tr.probeStarts()) < want && time.Now().Before(deadline) {
		time.Sleep(interval / 4)
	}
	starts := tr.probeStarts()
	if len(starts) < 3 {
		t.Fatalf("%d probes in %v", len(starts), want*4*interval)
	}
	var gaps []time.Duration
	for i := 1; i < len(starts); i++ {
		gaps = append(gaps, starts[i].Sub(starts[i-1]))
	}
	slices.Sort(gaps)
	median := gaps[len(gaps)/2]
	t.Logf("%d probes, gaps %v (median %v)", len(starts), gaps, median)
	if median > interval*3/2 {
		t.Fatalf("probes every %v (median), want every %v", median, interval)
	}
}

// noticeOpts make a probe schedule of 2 × ProbeInterval (the old
// behaviour) and the documented bound ProbeInterval + ProbeTimeout far
// apart (4.6 s against 2.6 s), with a ProbeTimeout that a loaded machine
// does not exceed by accident.
func noticeOpts() *Options {
	return &Options{ProbeInterval: 2 * time.Second, ProbeTimeout: 600 * time.Millisecond}
}

// noticeSlack is what the loss-notice tests allow on top of the
// documented bound, for scheduling on a loaded machine (6 CPU burners on
// 2 cores delayed the notice by up to 0.7 s): half the ProbeInterval by
// which the old probe schedule missed it.
const noticeSlack = time.Second

// lossAfterProbe waits until a probe of the session has been answered,
// then injects a fault at once (the worst moment: the session is next
// checked a whole ProbeInterval later) and returns how long after the
// injection l reported the loss. It fails the test unless the cause
// matches ErrLockLost.
func lossAfterProbe(t *testing.T, tr *probeTracer, l *Lock, inject func()) time.Duration {
	t.Helper()
	select {
	case <-tr.answered:
	default:
	}
	select {
	case <-tr.answered:
	case <-time.After(10 * time.Second):
		t.Fatal("no probe answered in 10 s")
	}
	start := time.Now()
	inject()
	select {
	case <-l.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("holder not told of the loss in 30 s")
	}
	took := time.Since(start)
	if c := context.Cause(l.Context()); !errors.Is(c, pglease.ErrLockLost) {
		t.Fatalf("cause = %v, want LockLost", c)
	}
	return took
}

// checkNoticeBound fails the test when took exceeds the documented
// loss-notice bound (plus noticeSlack).
func checkNoticeBound(t *testing.T, fault string, o *Options, took time.Duration) {
	t.Helper()
	bound := o.ProbeInterval + o.ProbeTimeout
	t.Logf("%s: holder told %v after the fault (bound ProbeInterval + ProbeTimeout = %v)", fault, took, bound)
	if took > bound+noticeSlack {
		t.Errorf("%s: holder told %v after the fault, documented bound %v", fault, took, bound)
	}
}

// TestLossNoticeBoundTerminate: the backend is terminated
// just after a probe was answered; the holder is told within
// ProbeInterval + ProbeTimeout (about ProbeInterval, 2 s). With the old
// every-other-tick probe it took 2 × ProbeInterval (4 s).
func TestLossNoticeBoundTerminate(t *testing.T) {
	t.Parallel()
	o := noticeOpts()
	s, tr := tracedSession(t, o)
	ctx := ctxT(t, 30*time.Second)
	l, ok, err := s.TryLock(ctx, randKey())
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	admin := superConn(t)
	took := lossAfterProbe(t, tr, l, func() {
		if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", s.BackendPID()); err != nil {
			t.Error(err)
		}
	})
	checkNoticeBound(t, "terminate", o, took)
}

// viaProxy returns a pool option that connects through a new fault
// proxy in front of the test server, and the proxy (closed when the test
// ends).
func viaProxy(t *testing.T) (func(*pgxpool.Config), *faultproxy.Proxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	target := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	p, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return func(c *pgxpool.Config) {
		c.ConnConfig.Host, c.ConnConfig.Port = "127.0.0.1", uint16(p.Port())
		// Every fallback too (not none: with sslmode=prefer, the plain
		// connection a server without TLS accepts is a fallback).
		for _, fb := range c.ConnConfig.Fallbacks {
			fb.Host, fb.Port = "127.0.0.1", uint16(p.Port())
		}
	}, p
}

// TestLossNoticeBoundProxyFaults: the connection is cut,
// left half-open (server side closed, client side silent) or blackholed
// just after a probe was answered; the holder is told within
// ProbeInterval + ProbeTimeout. The old probe schedule took 2 ×
// ProbeInterval (+ ProbeTimeout for the silent faults).
func TestLossNoticeBoundProxyFaults(t *testing.T) {
	t.Parallel()
	for _, fault := range []faultproxy.Mode{faultproxy.Cut, faultproxy.HalfOpen, faultproxy.Blackhole} {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			o := noticeOpts()
			through, p := viaProxy(t)
			s, tr := tracedSession(t, o, through)
			ctx := ctxT(t, 30*time.Second)
			l, ok, err := s.TryLock(ctx, randKey())
			if !ok || err != nil {
				t.Fatal(ok, err)
			}
			took := lossAfterProbe(t, tr, l, func() {
				if err := p.Set(fault); err != nil {
					t.Error(err)
				}
			})
			checkNoticeBound(t, fault.String(), o, took)
		})
	}
}

// TestLossNoticeBoundDuringWait: a blocking Lock starts its
// wait slice on an idle session shortly before the probe is due, just
// after the connection went half-open. The wait slice would keep the
// probe off the connection for WaitSlice + ProbeTimeout, past the bound;
// the session probes before such a slice, so the holder of another lock
// on the session is still told within ProbeInterval + ProbeTimeout.
func TestLossNoticeBoundDuringWait(t *testing.T) {
	t.Parallel()
	o := noticeOpts() // WaitSlice defaults to ProbeInterval
	through, p := viaProxy(t)
	s, tr := tracedSession(t, o, through)
	other := openSession(t, newPool(t), o)
	ctx := ctxT(t, 30*time.Second)
	held, busy := randKey(), randKey()
	l, ok, err := s.TryLock(ctx, held)
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	lb, ok, err := other.TryLock(ctx, busy)
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	defer lb.Release(ctx)
	waited := make(chan error, 1)
	took := lossAfterProbe(t, tr, l, func() {
		if err := p.HalfOpen(); err != nil {
			t.Error(err)
		}
		// Wait on a busy key, starting 500 ms before the next probe is
		// due: a wait slice started then would end at about ProbeInterval
		// − 500 ms + WaitSlice + ProbeTimeout (4.1 s), past the bound.
		time.AfterFunc(o.ProbeInterval-500*time.Millisecond, func() {
			_, err := s.Lock(ctx, busy)
			waited <- err
		})
	})
	checkNoticeBound(t, "half-open during a wait", o, took)
	if err := <-waited; err == nil {
		t.Error("Lock on a half-open session succeeded")
	}
}

// TestMeasureLossNotice measures the loss-notice delay of a Session with
// the default Options per fault, over PGLEASE_MEASURE_LOSS trials each
// (skipped when unset), with the fault at a random moment of the probe
// cycle. The delay is counted from when a contender on a direct
// connection got the lock (the server freed it), or from the fault for
// a blackhole (the server keeps the lock: its peer is the proxy).
//
//	PGLEASE_MEASURE_LOSS=20 go run ./internal/cmd/withpg -- go test -run TestMeasureLossNotice -v ./pg/advisory/
func TestMeasureLossNotice(t *testing.T) {
	trials, _ := strconv.Atoi(os.Getenv("PGLEASE_MEASURE_LOSS"))
	if trials <= 0 {
		t.Skip("set PGLEASE_MEASURE_LOSS=<trials> to measure")
	}
	faults := []string{"terminate", "cut", "half-open", "blackhole"}
	var report strings.Builder
	for _, fault := range faults {
		var delays []time.Duration
		for range trials {
			delays = append(delays, measureLossOnce(t, fault))
		}
		slices.Sort(delays)
		fmt.Fprintf(&report, "%-10s n=%d p50=%v max=%v\n", fault, len(delays),
			delays[len(delays)/2].Round(time.Millisecond), delays[len(delays)-1].Round(time.Millisecond))
	}
	t.Logf("loss-notice delay, default Options (ProbeInterval 1s, ProbeTimeout 1s):\n%s", report.String())
}

// measureLossOnce runs one trial of TestMeasureLossNotice.
func measureLossOnce(t *testing.T, fault string) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	through, p := viaProxy(t)
	pool := newPool(t, through)
	s := openSession(t, pool, nil)
	k := randKey()
	l, ok, err := s.TryLock(ctx, k)
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	contender, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(ctx)
	freed := make(chan time.Time, 1)
	go func() {
		id, _ := k.Int64()
		if _, err := contender.Exec(cctx, "SELECT pg_advisory_lock($1)", id); err == nil {
			freed <- time.Now()
		}
		close(freed)
	}()
	defer func() {
		ccancel()
		<-freed
		_ = contender.Close(context.Background())
		_ = s.Close(context.Background())
		_ = p.Close()
		pool.Close()
	}()
	time.Sleep(time.Duration(rand.Int64N(int64(2 * time.Second)))) // a random phase of the probe cycle
	injected := time.Now()
	switch fault {
	case "terminate":
		if _, err := superConn(t).Exec(ctx, "SELECT pg_terminate_backend($1)", s.BackendPID()); err != nil {
			t.Fatal(err)
		}
	case "cut":
		err = p.Cut()
	case "half-open":
		err = p.HalfOpen()
	case "blackhole":
		err = p.Blackhole()
	}
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatalf("%s: holder not told", fault)
	}
	told := time.Now()
	if fault == "blackhole" {
		return told.Sub(injected)
	}
	select {
	case at, ok := <-freed:
		if !ok {
			t.Fatalf("%s: contender failed", fault)
		}
		return told.Sub(at)
	case <-ctx.Done():
		t.Fatalf("%s: the server did not free the lock", fault)
	}
	return 0
}
