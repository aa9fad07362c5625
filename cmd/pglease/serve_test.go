package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
)

// startServe runs `pglease serve` (the built binary) on a free loopback
// port with DATABASE_URL=url and returns its base URL; it is stopped
// (SIGINT) when the test ends. stdin feeds a --token-file - style token
// when needed.
func startServe(t *testing.T, url string, env []string, args ...string) (string, *lockedBuffer) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--addr", "127.0.0.1:0", "--interval", "250ms"}, args...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "DATABASE_URL=" + url}, env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Error("pglease serve did not stop within 10 s of SIGINT")
		}
	})
	log := &lockedBuffer{}
	base := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			log.WriteString(line + "\n")
			if u, ok := strings.CutPrefix(line, "pglease serve: http://"); ok {
				base <- "http://" + strings.Fields(u)[0]
			}
		}
		close(base)
	}()
	select {
	case b, ok := <-base:
		if !ok {
			t.Fatalf("pglease serve exited:\n%s", log.String())
		}
		return strings.TrimSuffix(b, "/"), log
	case <-time.After(30 * time.Second):
		t.Fatal("pglease serve did not start within 30 s")
	}
	return "", nil
}

// lockedBuffer is a bytes.Buffer safe for one writer and readers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) WriteString(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.WriteString(s)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func getState(t *testing.T, base string) (serveState, string) {
	t.Helper()
	resp, err := http.Get(base + "/api/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var st serveState
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("state: %v\n%s", err, b)
	}
	return st, string(b)
}

func openManager(t *testing.T, url, holder string) *manager.Manager {
	t.Helper()
	m, err := manager.Open(ctx(t), url, manager.Config{Config: pg.Config{Holder: holder}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m
}

// TestServePage: the page in a real headless Chromium against a live
// fleet: it loads, shows the holder and, in order, the waiters by process
// identity, updates in place when the lock changes hands (no reload),
// shows no raw key, and logs no console error; a screenshot goes to the
// test's artifacts directory.
func TestServePage(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	c := ctx(t)
	const key = "exports:nightly-secret-customer"
	a := openManager(t, w.url, "export-a[101]@host-a")
	bm := openManager(t, w.url, "export-b[202]@host-b")
	la, err := a.Acquire(c, key)
	if err != nil {
		t.Fatal(err)
	}
	base, _ := startServe(t, w.url, nil)
	br := startBrowser(t)
	br.call("Page.navigate", map[string]any{"url": base + "/"})
	holders := `document.querySelector("#holders tbody").innerText`
	br.waitText("the holder", holders, func(s string) bool { return strings.Contains(s, "export-a[101]@host-a") })
	br.eval(`window.__sameLoad = 42`)
	// B waits: the page lists it by its identity.
	got := make(chan error, 1)
	var lb *manager.Lock
	go func() {
		var err error
		lb, err = bm.Acquire(c, key)
		got <- err
	}()
	br.waitText("the waiting Manager", `document.querySelector("#waiters tbody").innerText`,
		func(s string) bool { return strings.Contains(s, "export-b[202]@host-b") })
	// A releases: B gets the key; the page changes without a reload.
	if err := la.Release(c); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	defer lb.Release(context.Background())
	br.waitText("the new holder", holders, func(s string) bool {
		return strings.Contains(s, "export-b[202]@host-b") && !strings.Contains(s, "export-a[101]@host-a")
	})
	br.waitText("the hand-over in the events", `document.querySelector("#events tbody").innerText`,
		func(s string) bool { return strings.Contains(s, "export-b[202]@host-b") })
	if v := br.eval(`String(window.__sameLoad)`); v != "42" {
		t.Fatalf("the page reloaded instead of updating (marker %q)", v)
	}
	if body := br.eval(`document.body.innerText`); strings.Contains(body, key) || !strings.Contains(body, pglease.HashKey(key)) {
		t.Fatalf("the page shows the raw key, or not its hash:\n%s", body)
	}
	if n := br.eval(`String(document.querySelectorAll("#chart rect").length)`); n == "0" {
		t.Fatal("the contention picture is empty")
	}
	shot := filepath.Join(testArtifactDir(t), "pglease-serve.png")
	if err := br.screenshot(shot); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", shot)
	if p := br.pageProblems(); len(p) > 0 {
		t.Fatalf("the page reported problems:\n%s", strings.Join(p, "\n"))
	}
}

// TestServeReadOnlyAndRevoke: by default the page cannot revoke and
// answers only to its own host names; with --allow-revoke a request
// without the token is refused and one with it revokes (its holder is
// told ErrRevoked). No raw key is served without --show-keys.
func TestServeReadOnlyAndRevoke(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	c := ctx(t)
	const key = "billing:acct-secret-42"
	hash := pglease.HashKey(key)
	m := openManager(t, w.url, "billing[7]@host")
	lk, err := m.Acquire(c, key)
	if err != nil {
		t.Fatal(err)
	}
	base, _ := startServe(t, w.url, nil)
	leases := func(st serveState) []serveHolder {
		var out []serveHolder
		for _, h := range st.Holders {
			if h.Kind == "lease" {
				out = append(out, h)
			}
		}
		return out
	}
	var st serveState
	var raw string
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, raw = getState(t, base)
		if len(leases(st)) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if l := leases(st); len(l) != 1 || l[0].KeyHash != hash || l[0].Holders[0] != "billing[7]@host" || st.CanRevoke || strings.Contains(raw, key) {
		t.Fatalf("state: %s", raw)
	}
	post := func(base, token, body string) int {
		t.Helper()
		req, _ := http.NewRequest("POST", base+"/api/revoke", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(base, "anything-at-all-long", `{"key_hash":"`+hash+`"}`); code != http.StatusForbidden {
		t.Fatalf("read-only serve answered a revoke with %d, want 403", code)
	}
	// Another site's name for 127.0.0.1 (DNS rebinding) is refused.
	req, _ := http.NewRequest("GET", base+"/api/state", nil)
	req.Host = "attacker.example:" + strings.Split(base, ":")[2]
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("a foreign Host header: %v %v, want 421", resp, err)
	}

	// Revoke needs a token.
	r := run(t, w.url, "", "serve", "--allow-revoke")
	want(t, r, exitUsage, "token")
	const token = "0123456789abcdef-serve-token"
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rbase, log := startServe(t, w.url, nil, "--allow-revoke", "--token-file", tokenFile)
	deadline = time.Now().Add(30 * time.Second)
	for {
		if st, _ := getState(t, rbase); len(leases(st)) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code := post(rbase, "", `{"key_hash":"`+hash+`"}`); code != http.StatusUnauthorized {
		t.Fatalf("revoke without the token: %d, want 401", code)
	}
	if code := post(rbase, "wrong-token-wrong-token", `{"key_hash":"`+hash+`"}`); code != http.StatusUnauthorized {
		t.Fatalf("revoke with a wrong token: %d, want 401", code)
	}
	if code := post(rbase, token, `{"key_hash":"`+hash+`"}`); code != http.StatusOK {
		t.Fatalf("revoke with the token: %d, want 200", code)
	}
	select {
	case <-lk.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the holder was not told of the revoke")
	}
	if !errors.Is(context.Cause(lk.Context()), pglease.ErrRevoked) {
		t.Fatalf("the holder's cause: %v, want ErrRevoked", context.Cause(lk.Context()))
	}
	if strings.Contains(log.String(), token) {
		t.Fatalf("serve printed the token:\n%s", log.String())
	}
}
