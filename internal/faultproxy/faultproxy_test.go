package faultproxy_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// start returns a proxy in front of the test server and a connection
// string through it; the proxy is closed when the test ends.
func start(t *testing.T) (*faultproxy.Proxy, string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.New(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	u, err := p.ConnString(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	return p, u
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect through proxy: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func backendPID(t *testing.T, c *pgx.Conn) uint32 {
	t.Helper()
	return c.PgConn().PID()
}

// backendAlive reports whether the server still has a backend with pid,
// asked over a direct connection.
func backendAlive(t *testing.T, pid uint32) bool {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int32(pid)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// waitBackendGone waits up to 10 s for the backend to end.
func waitBackendGone(t *testing.T, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for backendAlive(t, pid) {
		if time.Now().After(deadline) {
			t.Fatalf("backend %d still alive 10 s after its proxy connection's server side was closed", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ping(ctx context.Context, c *pgx.Conn) error {
	var one int
	return c.QueryRow(ctx, "SELECT 1").Scan(&one)
}

// mustWork checks that a new connection through the proxy answers a query.
func mustWork(t *testing.T, url string) {
	t.Helper()
	c := connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ping(ctx, c); err != nil {
		t.Fatalf("query through proxy: %v", err)
	}
}

// hangs checks that a query on c does not answer before its deadline d
// and fails with the deadline.
func hangs(t *testing.T, c *pgx.Conn, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	t0 := time.Now()
	err := ping(ctx, c)
	el := time.Since(t0)
	if err == nil {
		t.Fatalf("query answered after %v; want it to hang until its %v deadline", el, d)
	}
	if el < d-10*time.Millisecond {
		t.Fatalf("query failed after %v (%v), before its %v deadline: want a hang", el, err, d)
	}
	if !errors.Is(err, context.DeadlineExceeded) && !pgconnTimeout(err) {
		t.Fatalf("query error = %v, want the deadline", err)
	}
}

func pgconnTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestPass(t *testing.T) {
	t.Parallel()
	p, url := start(t)
	c := connect(t, url)
	if err := ping(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if n := p.Conns(); n != 1 {
		t.Fatalf("Conns = %d, want 1", n)
	}
	// A large result crosses many chunks intact.
	var s string
	if err := c.QueryRow(context.Background(), "SELECT repeat('x', 1000000)").Scan(&s); err != nil || len(s) != 1000000 {
		t.Fatalf("large result: len %d, err %v", len(s), err)
	}
	_ = c.Close(context.Background())
	deadline := time.Now().Add(10 * time.Second)
	for p.Conns() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("Conns = %d 10 s after the client closed, want 0", p.Conns())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if p.Accepted() != 1 {
		t.Fatalf("Accepted = %d, want 1", p.Accepted())
	}
}

func TestDelay(t *testing.T) {
	t.Parallel()
	p, url := start(t)
	c := connect(t, url)
	const lat = 150 * time.Millisecond
	if err := p.SetDelay(lat, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if p.Mode() != faultproxy.Delay {
		t.Fatalf("Mode = %v", p.Mode())
	}
	// One query is one chunk each way (extended protocol: one write, one
	// reply): at least 2×latency on the existing connection.
	t0 := time.Now()
	if err := ping(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(t0); el < 2*lat {
		t.Fatalf("round trip took %v under Delay(%v), want >= %v", el, lat, 2*lat)
	}
	if err := p.Pass(); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	if err := ping(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(t0); el >= 2*lat {
		// Only a lower bound is safe on a busy machine, but a Pass
		// round trip that takes the delayed time means Pass still delays.
		t.Logf("note: Pass round trip took %v", el)
	}
}

func TestBlackhole(t *testing.T) {
	t.Parallel()
	p, url := start(t)
	c := connect(t, url)
	pid := backendPID(t, c)
	if err := p.Blackhole(); err != nil {
		t.Fatal(err)
	}
	hangs(t, c, 500*time.Millisecond)
	if !backendAlive(t, pid) {
		t.Fatal("blackhole closed the server side; want it kept open")
	}
	// pgx sent its cancel request through the proxy too: it is held as well.
	if p.Conns() < 1 {
		t.Fatalf("Conns = %d under blackhole, want the sockets kept", p.Conns())
	}
	// A new connection is accepted but its start-up never answers.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if c2, err := pgx.Connect(ctx, url); err == nil {
		_ = c2.Close(context.Background())
		t.Fatal("connect through a blackhole succeeded")
	}
	if err := p.Pass(); err != nil {
		t.Fatal(err)
	}
	mustWork(t, url)
}

// TestBlackholeHoldsBytes checks that bytes sent during a blackhole are
// delivered, in order, when it ends (raw TCP against an echo server, since
// pgx drops a connection whose query timed out).
func TestBlackholeHoldsBytes(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	p, err := faultproxy.New(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	if _, err := io.ReadFull(c, buf[:1]); err != nil || buf[0] != 'a' {
		t.Fatalf("echo: %q %v", buf[:1], err)
	}
	_ = p.Blackhole()
	if _, err := c.Write([]byte("bcd")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.Read(buf); !pgconnTimeout(err) {
		t.Fatalf("read under blackhole: %d bytes, err %v; want a timeout", n, err)
	}
	_ = p.Pass()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, buf[:3]); err != nil || string(buf[:3]) != "bcd" {
		t.Fatalf("after blackhole: %q %v, want the held bytes", buf[:3], err)
	}
}

func TestCut(t *testing.T) {
	t.Parallel()
	p, url := start(t)
	c := connect(t, url)
	pid := backendPID(t, c)
	if err := p.Cut(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	err := ping(ctx, c)
	if err == nil {
		t.Fatal("query on a cut connection succeeded")
	}
	if el := time.Since(t0); el > 10*time.Second || ctx.Err() != nil {
		t.Fatalf("cut connection failed after %v (%v); want at once, not at the deadline", el, err)
	}
	waitBackendGone(t, pid)
	// While the mode stays Cut, new connections are closed at once.
	t0 = time.Now()
	if c2, err := pgx.Connect(ctx, url); err == nil {
		_ = c2.Close(context.Background())
		t.Fatal("connect under Cut succeeded")
	}
	if el := time.Since(t0); el > 10*time.Second {
		t.Fatalf("connect under Cut failed after %v; want at once", el)
	}
	if p.Conns() != 0 {
		t.Fatalf("Conns = %d under Cut, want 0", p.Conns())
	}
	if err := p.Pass(); err != nil {
		t.Fatal(err)
	}
	mustWork(t, url)
}

func TestDisconnectKeepsMode(t *testing.T) {
	t.Parallel()
	p, url := start(t)
	c := connect(t, url)
	pid := backendPID(t, c)
	if n := p.Disconnect(); n != 1 {
		t.Fatalf("Disconnect closed %d, want 1", n)
	}
	if err := ping(context.Background(), c); err == nil {
		t.Fatal("query on a disconnected connection succeeded")
	}
	waitBackendGone(t, pid)
	if p.Mode() != faultproxy.Pass {
		t.Fatalf("Mode = %v after Disconnect, want pass", p.Mode())
	}
	mustWork(t, url)
}

func TestHalfOpen(t *testing.T) {
	t.Parallel()
	p, url := start(t)
	c := connect(t, url)
	pid := backendPID(t, c)
	if err := p.HalfOpen(); err != nil {
		t.Fatal(err)
	}
	// The server side is closed: the backend ends ...
	waitBackendGone(t, pid)
	// ... while the client hears nothing: its query hangs until its deadline.
	hangs(t, c, 500*time.Millisecond)

	// At the socket level: no EOF, no RST, no data, writes accepted.
	raw, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Write([]byte{0, 0, 0, 8, 4, 210, 22, 47}); err != nil { // SSLRequest
		t.Fatal(err)
	}
	_ = raw.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := raw.Read(make([]byte, 1)); !pgconnTimeout(err) {
		t.Fatalf("half-open read: %d bytes, err %v; want silence (timeout)", n, err)
	}
	if p.Conns() < 1 {
		t.Fatalf("Conns = %d, want the half-open client kept open", p.Conns())
	}
	if err := p.Pass(); err != nil {
		t.Fatal(err)
	}
	mustWork(t, url)
	// The half-open ones stay silent after Pass: their server side is gone.
	_ = raw.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := raw.Read(make([]byte, 1)); !pgconnTimeout(err) {
		t.Fatalf("half-open read after Pass: %d bytes, err %v; want silence", n, err)
	}
}

// TestSwitchingUnderLoad flips modes while clients query, for -race and
// for Close not leaking (pgtest.Main runs goleak after the tests).
func TestSwitchingUnderLoad(t *testing.T) {
	t.Parallel()
	p, url := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var okMu sync.Mutex
	ok := 0
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
				c, err := pgx.Connect(cctx, url)
				if err == nil {
					if ping(cctx, c) == nil {
						okMu.Lock()
						ok++
						okMu.Unlock()
					}
					_ = c.Close(context.Background())
				}
				ccancel()
			}
		}()
	}
	modes := []faultproxy.Mode{faultproxy.Pass, faultproxy.Blackhole, faultproxy.Pass, faultproxy.Cut,
		faultproxy.Pass, faultproxy.HalfOpen, faultproxy.Pass}
	for i := 0; ctx.Err() == nil; i++ {
		m := modes[i%len(modes)]
		if m == faultproxy.Delay {
			_ = p.SetDelay(time.Millisecond, time.Millisecond)
		} else if err := p.Set(m); err != nil {
			t.Fatal(err)
		}
		time.Sleep(40 * time.Millisecond)
		if i%3 == 0 {
			_ = p.SetDelay(2*time.Millisecond, 3*time.Millisecond)
			time.Sleep(20 * time.Millisecond)
		}
	}
	wg.Wait()
	// How many got through depends on the machine's load; that the proxy
	// still works after the storm does not.
	t.Logf("%d queries succeeded while switching", ok)
	if err := p.Pass(); err != nil {
		t.Fatal(err)
	}
	mustWork(t, url)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if p.Conns() != 0 {
		t.Fatalf("Conns = %d after Close", p.Conns())
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("proxy still accepts after Close")
	}
	if err := p.Set(faultproxy.Pass); !errors.Is(err, faultproxy.ErrClosed) {
		t.Fatalf("Set after Close = %v, want ErrClosed", err)
	}
}

func TestCloseWithHeldConnections(t *testing.T) {
	t.Parallel()
	p, url := start(t)
	c := connect(t, url)
	_ = p.Blackhole()
	done := make(chan error, 1)
	go func() { done <- ping(context.Background(), c) }()
	time.Sleep(50 * time.Millisecond)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("query succeeded through a closed blackhole")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("query still hanging 10 s after the proxy closed")
	}
}

func TestConnStringAndValidation(t *testing.T) {
	t.Parallel()
	if _, err := faultproxy.New("nohostport"); err == nil {
		t.Fatal("New accepted a target without a port")
	}
	p, err := faultproxy.New("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	port := strconv.Itoa(p.Port())
	for in, want := range map[string]string{
		"postgres://u@h:5/db?sslmode=disable": "postgres://u@127.0.0.1:" + port + "/db?sslmode=disable",
		"host=h port=5 dbname=db":             "host=h port=5 dbname=db host=127.0.0.1 port=" + port,
	} {
		if got, err := p.ConnString(in); err != nil || got != want {
			t.Errorf("ConnString(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if err := p.Set(faultproxy.Mode(99)); err == nil {
		t.Fatal("Set accepted an invalid mode")
	}
	if err := p.SetDelay(-1, 0); err == nil {
		t.Fatal("SetDelay accepted a negative latency")
	}
	for m := faultproxy.Pass; m <= faultproxy.BlackholeDown; m++ {
		if got, err := faultproxy.ParseMode(m.String()); err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	// A refused target closes the client's connection rather than hanging.
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read through a proxy to a closed port: %v, want EOF", err)
	}
}

// TestOneWay: in BlackholeDown the server runs what the client sends and
// the client hears nothing; in BlackholeUp the server hears nothing.
func TestOneWay(t *testing.T) {
	p, url := start(t)
	ctx := context.Background()
	table := pgx.Identifier{pgtest.RandomName("oneway")}.Sanitize()
	direct, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	if _, err := direct.Exec(ctx, "CREATE TABLE "+table+" (x int)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = direct.Exec(context.Background(), "DROP TABLE "+table) })
	rows := func() int {
		t.Helper()
		var n int
		if err := direct.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, tc := range []struct {
		mode faultproxy.Mode
		want int // rows the server has after the insert
	}{{faultproxy.BlackholeDown, 1}, {faultproxy.BlackholeUp, 1}} {
		c := connect(t, url)
		if err := p.Set(tc.mode); err != nil {
			t.Fatal(err)
		}
		ictx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := c.Exec(ictx, "INSERT INTO "+table+" VALUES (1)")
		cancel()
		if err == nil {
			t.Fatalf("%v: the client heard the insert's answer", tc.mode)
		}
		time.Sleep(200 * time.Millisecond)
		if got := rows(); got != tc.want {
			t.Fatalf("%v: the server has %d rows, want %d", tc.mode, got, tc.want)
		}
		if err := p.Pass(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLossAndCorrupt: lost chunks make round trips late (never wrong), a
// corrupted stream breaks the session, and both stop when set to 0.
func TestLossAndCorrupt(t *testing.T) {
	if testing.Short() {
		t.Skip("10–20 s of retransmission delays")
	}
	p, url := start(t)
	ctx := context.Background()
	c := connect(t, url)
	p.SetLoss(0.5)
	t0 := time.Now()
	for i := range 10 {
		var n int
		if err := c.QueryRow(ctx, "SELECT $1::int", i).Scan(&n); err != nil || n != i {
			t.Fatalf("query %d under loss: %d, %v", i, n, err)
		}
	}
	if d := time.Since(t0); d < 200*time.Millisecond {
		t.Fatalf("10 round trips with half the chunks lost took %v, want at least one retransmission delay (200 ms)", d)
	}
	p.SetLoss(0)
	p.SetCorrupt(1)
	wrong := 0
	for i := range 5 {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		var n int
		if err := c.QueryRow(qctx, "SELECT $1::int", i).Scan(&n); err != nil || n != i {
			wrong++
		}
		cancel()
	}
	if wrong == 0 {
		t.Fatal("every chunk corrupted, yet every query answered right")
	}
	p.SetCorrupt(0)
	var n int
	if err := connect(t, url).QueryRow(ctx, "SELECT 7").Scan(&n); err != nil || n != 7 {
		t.Fatalf("after SetCorrupt(0): %d, %v", n, err)
	}
}
