package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
)

// chunkConn is a net.Conn whose reads return at most chunk bytes of in;
// writes are discarded.
type chunkConn struct {
	net.Conn
	in    *bytes.Reader
	chunk int
}

func (c *chunkConn) Read(b []byte) (int, error) {
	if len(b) > c.chunk {
		b = b[:c.chunk]
	}
	return c.in.Read(b)
}

func (c *chunkConn) Write(b []byte) (int, error) { return len(b), nil }

// backendMsg frames one backend message.
func backendMsg(typ byte, body []byte) []byte {
	m := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(m[1:], uint32(4+len(body)))
	return append(m, body...)
}

// TestNotifyCounter: the counter finds the NotificationResponse messages
// of a backend stream however its reads cut it, after an answered SSL
// request too, and gives up (unknown) on an encrypted stream.
func TestNotifyCounter(t *testing.T) {
	t.Parallel()
	notify := append([]byte{0, 0, 0, 42}, []byte("chan\x00A payload, with an A in it\x00")...)
	var stream []byte
	stream = append(stream, backendMsg('R', []byte{0, 0, 0, 0})...)
	stream = append(stream, backendMsg('Z', []byte{'I'})...)
	stream = append(stream, backendMsg('A', notify)...)
	stream = append(stream, backendMsg('C', []byte("SELECT 1\x00"))...)
	stream = append(stream, backendMsg('A', notify)...)
	stream = append(stream, backendMsg('D', bytes.Repeat([]byte{'A'}, 300))...) // an 'A' inside a body is no message
	stream = append(stream, backendMsg('A', notify)...)
	sslRequest := []byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}
	for _, tc := range []struct {
		name    string
		request []byte // the client's first write
		prefix  []byte // the server's answer to it
		want    int64
	}{
		{"plain", []byte("startup"), nil, 3},
		{"ssl refused", sslRequest, []byte{'N'}, 3},
		{"ssl accepted", sslRequest, []byte{'S'}, -1},
	} {
		for chunk := 1; chunk <= len(stream)+1; chunk += 7 {
			nc := &notifyCounter{}
			in := append(append([]byte(nil), tc.prefix...), stream...)
			dial := nc.dial(func(context.Context, string, string) (net.Conn, error) {
				return &chunkConn{in: bytes.NewReader(in), chunk: chunk}, nil
			})
			c, err := dial(context.Background(), "tcp", "x")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Write(tc.request); err != nil {
				t.Fatal(err)
			}
			if n, err := io.Copy(io.Discard, c); err != nil || n != int64(len(in)) {
				t.Fatalf("%s: read %d of %d: %v", tc.name, n, len(in), err)
			}
			if got := nc.count(); got != tc.want {
				t.Errorf("%s, reads of %d bytes: %d notifications, want %d", tc.name, chunk, got, tc.want)
			}
		}
	}
}
