// Package faultproxy is a TCP proxy that injects network faults between a
// client and a server (PostgreSQL, PgBouncer) for tests, the soak driver and
// fault experiments. It is test infrastructure: its API is unstable and not
// for use outside this module.
//
// A Proxy listens on one loopback port and forwards every accepted
// connection to one target address. Its Mode can be switched at any time,
// from any goroutine; a switch applies at once to the connections already
// open and to the ones accepted later:
//
//   - Pass forwards bytes unchanged.
//   - Delay holds each chunk read in either direction for latency plus a
//     uniformly random [0, jitter) before writing it on, keeping order. A
//     round trip therefore takes about 2×latency more.
//   - Blackhole accepts connections but forwards nothing in either direction
//     and keeps every socket open (a connection accepted while blackholed
//     does not reach the target yet). Bytes read meanwhile are held, not
//     dropped, and are delivered if the mode returns to Pass or Delay, as
//     TCP retransmission would deliver them after a partition heals. Being
//     a userspace proxy, it still ACKs at the TCP level (and answers TCP
//     keepalives), so the peers' kernels see a live but silent peer, not a
//     lost one: a keepalive or tcp_user_timeout on either side will not
//     fire. Use a real packet drop (ip netns + veth) for that.
//   - Cut closes both sides of every current connection (each peer reads
//     EOF at once). While the mode stays Cut, new connections are accepted
//     and closed at once; after switching back to Pass or Delay they are
//     forwarded again. Disconnect is the one-shot form: it closes the
//     current connections and keeps the mode, so reconnects go through.
//   - HalfOpen closes the server side of every current connection (the
//     server sees EOF, its backend ends and frees its session locks) and
//     keeps the client side open and silent: the client gets no FIN, no RST
//     and no data, and what it writes is read and discarded. Connections
//     accepted while in HalfOpen never reach the target. A connection made
//     half-open stays so until its client closes it, a Cut/Disconnect, or
//     Close, even after the mode returns to Pass: the server side is gone.
//   - BlackholeUp holds what the client sends (the server hears nothing)
//     and forwards what the server sends; BlackholeDown is the reverse
//     (the server gets every statement, the client hears no answer): a
//     one-way partition. Held bytes are delivered when the mode changes,
//     as with Blackhole.
//
// Independently of the mode, SetLoss and SetCorrupt impair the chunks read
// in either direction: a lost chunk is delivered late, as TCP delivers a
// segment after its retransmission (200 ms, doubling for each loss of the
// same chunk, up to 1.6 s), holding the chunks behind it (head-of-line
// blocking); a corrupted chunk has one bit flipped, as a segment damaged
// in a way TCP's checksum does not catch would. A proxy works on the byte
// stream, so duplicated and reordered segments, which TCP removes and
// reorders before any application sees them, cannot be shown.
//
// Close stops the listener, closes every connection and returns after every
// goroutine the proxy started has exited.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// Mode is what a Proxy does with traffic.
type Mode int

// The modes; see the package documentation for what each does.
const (
	Pass Mode = iota
	Delay
	Blackhole
	Cut
	HalfOpen
	BlackholeUp
	BlackholeDown
)

// String returns the mode's name.
func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Delay:
		return "delay"
	case Blackhole:
		return "blackhole"
	case Cut:
		return "cut"
	case HalfOpen:
		return "half-open"
	case BlackholeUp:
		return "blackhole-up"
	case BlackholeDown:
		return "blackhole-down"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// ParseMode returns the Mode named s (as String prints it).
func ParseMode(s string) (Mode, error) {
	for m := Pass; m <= BlackholeDown; m++ {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("faultproxy: unknown mode %q (pass, delay, blackhole, cut, half-open, blackhole-up, blackhole-down)", s)
}

// ErrClosed is returned by methods called after Close.
var ErrClosed = errors.New("faultproxy: proxy closed")

const (
	chunkSize   = 32 << 10
	queueChunks = 64
	dialTimeout = 10 * time.Second
)

// Proxy is a fault-injecting TCP proxy in front of one target address. All
// its methods are safe for concurrent use.
type Proxy struct {
	target string
	ln     net.Listener
	ctx    context.Context // cancelled by Close: aborts dials and waits
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	mode     Mode
	latency  time.Duration
	jitter   time.Duration
	loss     float64       // SetLoss
	corrupt  float64       // SetCorrupt
	changed  chan struct{} // closed and replaced on every mode change
	conns    map[*pconn]struct{}
	accepted int64
	closed   bool
}

// New starts a proxy listening on a free loopback port (127.0.0.1) that
// forwards to target ("host:port"), in mode Pass.
func New(target string) (*Proxy, error) {
	return Listen("127.0.0.1:0", target)
}

// Listen is New with an explicit listen address (e.g. "127.0.0.1:6000" to
// keep a port across proxies).
func Listen(addr, target string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("faultproxy: target %q: %w", target, err)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("faultproxy: listen address %q: %w", addr, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{target: target, ln: ln, ctx: ctx, cancel: cancel,
		changed: make(chan struct{}), conns: make(map[*pconn]struct{})}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr returns the address the proxy listens on ("127.0.0.1:port").
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port returns the loopback port the proxy listens on.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Target returns the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// ConnString returns the PostgreSQL connection string base (URL or
// keyword/value form) with its host and port replaced by the proxy's.
// A multi-host base is refused.
func (p *Proxy) ConnString(base string) (string, error) {
	host, port, _ := net.SplitHostPort(p.Addr())
	if u, err := url.Parse(base); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Host = net.JoinHostPort(host, port)
		q := u.Query()
		if q.Has("host") || q.Has("port") {
			q.Del("host")
			q.Del("port")
			u.RawQuery = q.Encode()
		}
		return u.String(), nil
	}
	// Keyword/value form: later settings override earlier ones.
	return base + " host=" + host + " port=" + port, nil
}

// Mode returns the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Conns returns the number of client connections currently open through
// the proxy (including silent half-open and blackholed ones).
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Accepted returns how many connections the proxy has accepted in all.
func (p *Proxy) Accepted() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Set switches to mode m (Delay uses the latency and jitter last given to
// SetDelay; zero by default). It applies to current and new connections.
func (p *Proxy) Set(m Mode) error {
	if m < Pass || m > BlackholeDown {
		return fmt.Errorf("faultproxy: invalid mode %d", int(m))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.setLocked(m)
	return nil
}

// setLocked changes the mode and applies it; p.mu is held.
func (p *Proxy) setLocked(m Mode) {
	p.mode = m
	close(p.changed)
	p.changed = make(chan struct{})
	switch m {
	case Cut:
		for c := range p.conns {
			c.closeBoth()
		}
	case HalfOpen:
		for c := range p.conns {
			c.makeHalfOpen()
		}
	}
}

// SetDelay switches to Delay with the given latency and jitter (each chunk,
// each direction, waits latency + rand[0, jitter)).
func (p *Proxy) SetDelay(latency, jitter time.Duration) error {
	if latency < 0 || jitter < 0 {
		return fmt.Errorf("faultproxy: negative latency %v or jitter %v", latency, jitter)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.latency, p.jitter = latency, jitter
	p.setLocked(Delay)
	return nil
}

// SetLoss makes each chunk read in either direction lost with
// probability p (0 ≤ p < 1; 0 turns it off), whatever the mode: see the
// package documentation.
func (p *Proxy) SetLoss(prob float64) { p.mu.Lock(); p.loss = prob; p.mu.Unlock() }

// SetCorrupt flips one random bit of each chunk read in either direction
// with probability prob (0 turns it off), whatever the mode.
func (p *Proxy) SetCorrupt(prob float64) { p.mu.Lock(); p.corrupt = prob; p.mu.Unlock() }

// impair returns the extra delay of a chunk by SetLoss and whether it is
// to be corrupted.
func (p *Proxy) impair() (late time.Duration, corrupt bool) {
	p.mu.Lock()
	loss, cor := p.loss, p.corrupt
	p.mu.Unlock()
	for rto := 200 * time.Millisecond; rto <= 1600*time.Millisecond && loss > 0 && rand.Float64() < loss; rto *= 2 {
		late += rto
	}
	return late, cor > 0 && rand.Float64() < cor
}

// Pass switches to Pass.
func (p *Proxy) Pass() error { return p.Set(Pass) }

// Blackhole switches to Blackhole.
func (p *Proxy) Blackhole() error { return p.Set(Blackhole) }

// Cut switches to Cut: every current connection is closed on both sides,
// and new ones are closed at once until the mode changes.
func (p *Proxy) Cut() error { return p.Set(Cut) }

// HalfOpen switches to HalfOpen.
func (p *Proxy) HalfOpen() error { return p.Set(HalfOpen) }

// Disconnect closes both sides of every current connection without changing
// the mode, and returns how many it closed.
func (p *Proxy) Disconnect() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns)
	for c := range p.conns {
		c.closeBoth()
	}
	return n
}

// Close stops the proxy: the listener and every connection are closed, and
// Close returns once all the proxy's goroutines have exited. Later calls
// return nil.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.cancel()
	err := p.ln.Close()
	for c := range p.conns {
		c.closeBoth()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// state returns the mode, its change channel and a chunk delay, under p.mu.
func (p *Proxy) state() (Mode, <-chan struct{}, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := time.Duration(0)
	if p.mode == Delay {
		d = p.latency
		if p.jitter > 0 {
			d += rand.N(p.jitter)
		}
	}
	return p.mode, p.changed, d
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // listener closed
		}
		c := &pconn{p: p, client: nc, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed || p.mode == Cut {
			p.mu.Unlock()
			_ = nc.Close()
			continue
		}
		p.accepted++
		p.conns[c] = struct{}{}
		if p.mode == HalfOpen {
			c.halfOpen = true
		}
		p.wg.Add(1)
		p.mu.Unlock()
		go c.serve()
	}
}

type chunk struct {
	b   []byte
	due time.Time
}

// pconn is one proxied connection: the client side, and the server side
// once dialled.
type pconn struct {
	p      *Proxy
	client net.Conn

	// guarded by p.mu
	server   net.Conn
	halfOpen bool
	closed   bool
	done     chan struct{} // closed by closeBoth
}

// closeBoth closes both sides; p.mu is held.
func (c *pconn) closeBoth() {
	if c.closed {
		return
	}
	c.closed = true
	close(c.done)
	_ = c.client.Close()
	if c.server != nil {
		_ = c.server.Close()
	}
	delete(c.p.conns, c)
}

// makeHalfOpen closes the server side and silences the client side; p.mu
// is held.
func (c *pconn) makeHalfOpen() {
	if c.closed || c.halfOpen {
		return
	}
	c.halfOpen = true
	if c.server != nil {
		_ = c.server.Close()
	}
}

func (c *pconn) isHalfOpen() bool {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	return c.halfOpen
}

func (c *pconn) shutdown() {
	c.p.mu.Lock()
	c.closeBoth()
	c.p.mu.Unlock()
}

// serve runs the connection: it reads the client at once (so a client that
// goes away is noticed in every mode), dials the target when the mode
// allows, and pumps both directions.
func (c *pconn) serve() {
	p := c.p
	defer p.wg.Done()
	var pumps sync.WaitGroup
	defer pumps.Wait()
	defer c.shutdown()

	up := make(chan chunk, queueChunks)
	pumps.Add(1)
	go func() {
		defer pumps.Done()
		c.read(c.client, up)
		c.shutdown() // the client went away (or was closed): end both sides
	}()

	// Wait until the mode lets the connection reach the target.
	for {
		mode, changed, _ := p.state()
		if c.isHalfOpen() {
			c.discard(up)
			return
		}
		if mode == Pass || mode == Delay || mode == BlackholeUp || mode == BlackholeDown {
			break
		}
		select {
		case <-changed:
		case <-c.done:
			return
		}
	}
	d := net.Dialer{Timeout: dialTimeout}
	server, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		return // the client sees its connection closed, as with a refused port
	}
	p.mu.Lock()
	switch {
	case c.closed:
		p.mu.Unlock()
		_ = server.Close()
		return
	case c.halfOpen:
		p.mu.Unlock()
		_ = server.Close()
		c.discard(up)
		return
	}
	c.server = server
	p.mu.Unlock()

	down := make(chan chunk, queueChunks)
	pumps.Add(2)
	go func() {
		defer pumps.Done()
		c.read(server, down)
		// The server side ended: end the client side too, unless the
		// connection was made half-open (then the client stays silent).
		if !c.isHalfOpen() {
			c.shutdown()
		}
	}()
	go func() {
		defer pumps.Done()
		c.write(down, c.client, BlackholeDown)
	}()
	c.write(up, server, BlackholeUp)
}

// read copies src into q chunk by chunk, stamping each with its due time,
// until src fails; then it closes q.
func (c *pconn) read(src net.Conn, q chan<- chunk) {
	defer close(q)
	// One read buffer; each chunk gets a copy of just what was read (a
	// fresh 32 KiB buffer per read made the soak's proxies a fifth of its
	// CPU, mostly allocation and zeroing for messages of ~100 bytes).
	buf := make([]byte, chunkSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			_, _, d := c.p.state()
			late, corrupt := c.p.impair()
			b := append([]byte(nil), buf[:n]...)
			if corrupt {
				b[rand.N(n)] ^= 1 << rand.N(8)
			}
			select {
			case q <- chunk{b: b, due: time.Now().Add(d + late)}:
			case <-c.done:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// write delivers q's chunks to dst in order, each no earlier than its due
// time (and no earlier than the one before), holding them while the mode is
// Blackhole or oneWay (this direction's one-way mode) and dropping them
// once the connection is half-open.
func (c *pconn) write(q <-chan chunk, dst net.Conn, oneWay Mode) {
	var last time.Time
	for ch := range q {
		due := ch.due
		if due.Before(last) {
			due = last
		}
		last = due
		if wait := time.Until(due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-c.done:
				t.Stop()
				return
			}
		}
		for {
			mode, changed, _ := c.p.state()
			if mode != Blackhole && mode != oneWay {
				break
			}
			select {
			case <-changed:
			case <-c.done:
				return
			}
		}
		if c.isHalfOpen() {
			continue // drain: the server side is gone, the client hears nothing
		}
		if _, err := dst.Write(ch.b); err != nil {
			if c.isHalfOpen() {
				continue
			}
			c.shutdown()
			return
		}
	}
}

// discard drains q (the client's bytes of a half-open connection) until the
// client goes away.
func (c *pconn) discard(q <-chan chunk) {
	for range q {
	}
}
