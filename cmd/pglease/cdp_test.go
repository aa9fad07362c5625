package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// A minimal Chrome DevTools Protocol client over a hand-written WebSocket
// (RFC 6455: client frames masked, text messages, fragments joined):
// enough to drive a real headless Chromium from a test without a
// third-party module.

// chromiumPath returns Debian's chromium, or skips the test without it
// unless PGLEASE_REQUIRE_CHROMIUM=1 (CI), which makes its absence a
// failure.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "/usr/bin/chromium"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("PGLEASE_REQUIRE_CHROMIUM") == "1" {
		t.Fatal("chromium not found (PGLEASE_REQUIRE_CHROMIUM=1): install Debian's chromium package")
	}
	t.Skip("chromium not found: install Debian's chromium package to test pglease serve's page in a browser")
	return ""
}

// browser is a headless Chromium with one page attached over CDP.
type browser struct {
	t    *testing.T
	cmd  *exec.Cmd
	conn net.Conn
	rd   *bufio.Reader
	wmu  sync.Mutex

	mu      sync.Mutex
	nextID  int
	waiting map[int]chan cdpReply
	// problems are console errors, uncaught exceptions and failed loads
	// the page reported.
	problems []string
	closed   chan struct{}
}

type cdpReply struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// startBrowser starts headless Chromium with an empty profile and
// attaches to its first page.
func startBrowser(t *testing.T) *browser {
	t.Helper()
	bin := chromiumPath(t)
	// Not t.TempDir: Chromium may still write to its profile as it dies.
	profile, err := os.MkdirTemp("", "pglease-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 20 {
			if os.RemoveAll(profile) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	cmd := exec.Command(bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
		"--user-data-dir="+profile, "--remote-debugging-port=0", "--window-size=1280,900", "about:blank")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b := &browser{t: t, cmd: cmd, waiting: map[int]chan cdpReply{}, closed: make(chan struct{})}
	t.Cleanup(b.close)
	wsURL := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "DevTools listening on "); ok {
				select {
				case wsURL <- u:
				default:
				}
			}
		}
	}()
	var bu string
	select {
	case bu = <-wsURL:
	case <-time.After(60 * time.Second):
		t.Fatal("chromium did not start its DevTools endpoint within 60 s")
	}
	u, err := url.Parse(bu)
	if err != nil {
		t.Fatal(err)
	}
	// The page target: /json/list on the same host.
	var pageWS string
	deadline := time.Now().Add(30 * time.Second)
	for pageWS == "" {
		resp, err := http.Get("http://" + u.Host + "/json/list")
		if err == nil {
			var targets []struct{ Type, WebSocketDebuggerURL string }
			_ = json.NewDecoder(resp.Body).Decode(&targets)
			resp.Body.Close()
			for _, tg := range targets {
				if tg.Type == "page" {
					pageWS = tg.WebSocketDebuggerURL
					break
				}
			}
		}
		if pageWS == "" {
			if time.Now().After(deadline) {
				t.Fatal("chromium shows no page target")
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if err := b.dial(pageWS); err != nil {
		t.Fatal(err)
	}
	go b.readLoop()
	for _, m := range []string{"Runtime.enable", "Log.enable", "Page.enable"} {
		b.call(m, nil)
	}
	return b
}

func (b *browser) close() {
	if b.conn != nil {
		b.conn.Close()
	}
	if b.cmd.Process != nil {
		_ = b.cmd.Process.Kill()
		_ = b.cmd.Wait()
	}
}

// dial opens the WebSocket to a ws:// URL.
func (b *browser) dial(ws string) error {
	u, err := url.Parse(ws)
	if err != nil {
		return err
	}
	conn, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
	if err != nil {
		return err
	}
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", u.RequestURI(), u.Host, base64.StdEncoding.EncodeToString(key))
	rd := bufio.NewReaderSize(conn, 1<<16)
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		conn.Close()
		return err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		conn.Close()
		return fmt.Errorf("websocket upgrade: %s", resp.Status)
	}
	b.conn, b.rd = conn, rd
	return nil
}

func (b *browser) writeText(p []byte) error {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	hdr := []byte{0x81} // FIN, text
	switch n := len(p); {
	case n <= 125:
		hdr = append(hdr, 0x80|byte(n))
	case n <= 0xffff:
		hdr = append(hdr, 0x80|126, byte(n>>8), byte(n))
	default:
		hdr = append(hdr, 0x80|127)
		hdr = binary.BigEndian.AppendUint64(hdr, uint64(n))
	}
	mask := make([]byte, 4)
	_, _ = rand.Read(mask)
	hdr = append(hdr, mask...)
	masked := make([]byte, len(p))
	for i := range p {
		masked[i] = p[i] ^ mask[i%4]
	}
	_, err := b.conn.Write(append(hdr, masked...))
	return err
}

// readMessage reads one whole message (fragments joined; pings answered).
func (b *browser) readMessage() ([]byte, error) {
	var msg []byte
	for {
		var h [2]byte
		if _, err := io.ReadFull(b.rd, h[:]); err != nil {
			return nil, err
		}
		fin, op := h[0]&0x80 != 0, h[0]&0x0f
		n := uint64(h[1] & 0x7f)
		switch n {
		case 126:
			var x [2]byte
			if _, err := io.ReadFull(b.rd, x[:]); err != nil {
				return nil, err
			}
			n = uint64(binary.BigEndian.Uint16(x[:]))
		case 127:
			var x [8]byte
			if _, err := io.ReadFull(b.rd, x[:]); err != nil {
				return nil, err
			}
			n = binary.BigEndian.Uint64(x[:])
		}
		var mask [4]byte
		if h[1]&0x80 != 0 {
			if _, err := io.ReadFull(b.rd, mask[:]); err != nil {
				return nil, err
			}
		}
		p := make([]byte, n)
		if _, err := io.ReadFull(b.rd, p); err != nil {
			return nil, err
		}
		if h[1]&0x80 != 0 {
			for i := range p {
				p[i] ^= mask[i%4]
			}
		}
		switch op {
		case 0x8:
			return nil, io.EOF
		case 0x9: // ping: answer with a pong
			b.wmu.Lock()
			_, _ = b.conn.Write([]byte{0x8a, 0x80, 0, 0, 0, 0})
			b.wmu.Unlock()
			continue
		case 0xa:
			continue
		}
		msg = append(msg, p...)
		if fin {
			return msg, nil
		}
	}
}

func (b *browser) readLoop() {
	defer close(b.closed)
	for {
		m, err := b.readMessage()
		if err != nil {
			return
		}
		var env struct {
			ID     int             `json:"id"`
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
			cdpReply
		}
		if json.Unmarshal(m, &env) != nil {
			continue
		}
		if env.ID != 0 {
			b.mu.Lock()
			ch := b.waiting[env.ID]
			delete(b.waiting, env.ID)
			b.mu.Unlock()
			if ch != nil {
				ch <- env.cdpReply
			}
			continue
		}
		b.event(env.Method, env.Params)
	}
}

// event records what the page reports as going wrong.
func (b *browser) event(method string, params json.RawMessage) {
	var problem string
	switch method {
	case "Runtime.exceptionThrown":
		var p struct {
			ExceptionDetails struct {
				Text      string
				Exception struct{ Description string }
			}
		}
		_ = json.Unmarshal(params, &p)
		problem = "exception: " + p.ExceptionDetails.Text + " " + p.ExceptionDetails.Exception.Description
	case "Runtime.consoleAPICalled":
		var p struct {
			Type string
			Args []struct {
				Value       any
				Description string
			}
		}
		_ = json.Unmarshal(params, &p)
		if p.Type == "error" || p.Type == "assert" {
			problem = fmt.Sprintf("console.%s: %+v", p.Type, p.Args)
		}
	case "Log.entryAdded":
		var p struct {
			Entry struct{ Level, Text, URL string }
		}
		_ = json.Unmarshal(params, &p)
		if p.Entry.Level == "error" {
			problem = "log error: " + p.Entry.Text + " " + p.Entry.URL
		}
	}
	if problem != "" {
		b.mu.Lock()
		b.problems = append(b.problems, problem)
		b.mu.Unlock()
	}
}

// call sends a CDP command and waits for its result.
func (b *browser) call(method string, params any) json.RawMessage {
	b.t.Helper()
	b.mu.Lock()
	b.nextID++
	id := b.nextID
	ch := make(chan cdpReply, 1)
	b.waiting[id] = ch
	b.mu.Unlock()
	msg, err := json.Marshal(map[string]any{"id": id, "method": method, "params": params})
	if err != nil {
		b.t.Fatal(err)
	}
	if err := b.writeText(msg); err != nil {
		b.t.Fatalf("CDP %s: %v", method, err)
	}
	select {
	case r := <-ch:
		if r.Error != nil {
			b.t.Fatalf("CDP %s: %s", method, r.Error.Message)
		}
		return r.Result
	case <-b.closed:
		b.t.Fatalf("CDP %s: the browser connection closed", method)
	case <-time.After(60 * time.Second):
		b.t.Fatalf("CDP %s: no answer within 60 s", method)
	}
	return nil
}

// eval evaluates a JavaScript expression in the page and returns its
// value as a string.
func (b *browser) eval(expr string) string {
	b.t.Helper()
	r := b.call("Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true})
	var v struct {
		Result struct {
			Value any
		}
		ExceptionDetails *struct{ Text string }
	}
	if err := json.Unmarshal(r, &v); err != nil {
		b.t.Fatal(err)
	}
	if v.ExceptionDetails != nil {
		b.t.Fatalf("evaluating %q: %s", expr, v.ExceptionDetails.Text)
	}
	return fmt.Sprint(v.Result.Value)
}

// waitText polls expr until f accepts its value (bounded).
func (b *browser) waitText(what, expr string, f func(string) bool) string {
	b.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		// Before the page has loaded the expression may throw.
		s := b.eval(`(() => { try { return ` + expr + ` } catch (e) { return "" } })()`)
		if f(s) {
			return s
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("the page never showed %s; last:\n%s", what, s)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (b *browser) screenshot(path string) error {
	r := b.call("Page.captureScreenshot", map[string]any{"format": "png"})
	var v struct{ Data string }
	if err := json.Unmarshal(r, &v); err != nil {
		return err
	}
	png, err := base64.StdEncoding.DecodeString(v.Data)
	if err != nil {
		return err
	}
	if len(png) < 1000 {
		return errors.New("screenshot too small")
	}
	return os.WriteFile(path, png, 0o644)
}

func (b *browser) pageProblems() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.problems...)
}

var _ = context.Background
