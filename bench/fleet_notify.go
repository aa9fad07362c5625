package main

import (
	"context"
	"encoding/binary"
	"net"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
)

// notifyCounter counts the notifications the server delivers to a
// worker's connections: the NotificationResponse messages ('A') on the
// byte stream each connection dialled through it reads. Only a
// listening session receives them, so the count is what the worker's
// Manager's listener was sent, whatever it did with them. On a TLS
// connection the stream cannot be read: the count is then unknown.
type notifyCounter struct {
	n       atomic.Int64
	unknown atomic.Bool
}

// count returns the notifications received so far, -1 if unknown.
func (c *notifyCounter) count() int64 {
	if c.unknown.Load() {
		return -1
	}
	return c.n.Load()
}

// dial wraps base so that every connection it makes is counted.
func (c *notifyCounter) dial(base pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := base(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: nc, c: c}, nil
	}
}

// The request codes of the 8-byte requests a client may send first; the
// server answers each with one byte ('S' or 'G': encryption follows).
const (
	pgSSLRequest    = 80877103
	pgGSSEncRequest = 80877104
)

// countingConn follows the backend's message framing (a type byte, a
// 4-byte length that counts itself, the body) on what is read. Reads of
// one connection come from one goroutine at a time (pgconn's), so its
// state needs no lock.
type countingConn struct {
	net.Conn
	c        *notifyCounter
	wrote    bool // the first write was seen
	answer   bool // a one-byte answer to an encryption request is due
	off      bool // encrypted: nothing more to count
	hdr      [5]byte
	hdrN     int
	skipBody int
}

func (cc *countingConn) Write(b []byte) (int, error) {
	if !cc.wrote {
		cc.wrote = true
		if len(b) >= 8 && binary.BigEndian.Uint32(b[0:4]) == 8 {
			if code := binary.BigEndian.Uint32(b[4:8]); code == pgSSLRequest || code == pgGSSEncRequest {
				cc.answer = true
			}
		}
	}
	return cc.Conn.Write(b)
}

func (cc *countingConn) Read(b []byte) (int, error) {
	n, err := cc.Conn.Read(b)
	if n > 0 && !cc.off {
		cc.scan(b[:n])
	}
	return n, err
}

func (cc *countingConn) scan(p []byte) {
	if cc.answer {
		cc.answer = false
		if p[0] != 'N' {
			cc.off = true
			cc.c.unknown.Store(true)
			return
		}
		p = p[1:]
	}
	for len(p) > 0 {
		if cc.skipBody > 0 {
			k := min(cc.skipBody, len(p))
			cc.skipBody -= k
			p = p[k:]
			continue
		}
		k := copy(cc.hdr[cc.hdrN:], p)
		cc.hdrN += k
		p = p[k:]
		if cc.hdrN < len(cc.hdr) {
			return
		}
		cc.hdrN = 0
		if cc.hdr[0] == 'A' {
			cc.c.n.Add(1)
		}
		cc.skipBody = int(binary.BigEndian.Uint32(cc.hdr[1:5])) - 4
	}
}
