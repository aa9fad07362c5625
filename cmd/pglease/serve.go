package main

import (
	"cmp"
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg/advisory"
)

// The page's assets: one HTML file, one script, one stylesheet, no
// third-party code and nothing fetched from elsewhere.
//
//go:embed web
var webFiles embed.FS

// Defaults of serve.
const (
	defaultServeAddr = "127.0.0.1:7432"
	minServeInterval = 200 * time.Millisecond
	maxServeEvents   = 200
	minTokenBytes    = 16
)

// serveState is what the page shows (GET /api/state). Keys are hashes
// unless --show-keys.
type serveState struct {
	Time       time.Time      `json:"time"`
	IntervalMs int64          `json:"interval_ms"`
	ShowKeys   bool           `json:"show_keys"`
	CanRevoke  bool           `json:"can_revoke"`
	Error      string         `json:"error,omitempty"`
	Holders    []serveHolder  `json:"holders"`
	Waiters    []serveWaiter  `json:"waiters"`
	History    []servePoint   `json:"history"`
	Events     []serveEvent   `json:"events"`
	Schema     string         `json:"schema"`
	Counts     map[string]int `json:"counts"`
}

// serveHolder is one held lock: an exclusive lease, a key's shared holds,
// or an advisory lock.
type serveHolder struct {
	Kind        string   `json:"kind"` // lease, readers, permits, advisory
	KeyHash     string   `json:"key_hash,omitempty"`
	Key         string   `json:"key,omitempty"`
	Holders     []string `json:"holders"` // identities (application_name for advisory locks)
	Fence       string   `json:"fence,omitempty"`
	HeldMs      int64    `json:"held_ms"`
	ExpiresInMs int64    `json:"expires_in_ms,omitempty"`
	Count       int      `json:"count,omitempty"`
	Limit       int      `json:"limit,omitempty"`
	Waiting     int      `json:"waiting"`
	// Queued counts the callers in the key's fair queue (listed among
	// the waiters).
	Queued int `json:"queued,omitempty"`
}

// serveWaiter is one waiter, oldest first: an acquire waiting in the
// database, a waiting Manager, a session waiting for an advisory lock,
// or a caller waiting in a key's fair queue (What "queued": Position in
// its key's line and Mode, Process its holder identity, no PID).
type serveWaiter struct {
	What      string `json:"what"`
	KeyHash   string `json:"key_hash,omitempty"`
	Key       string `json:"key,omitempty"`
	PID       int32  `json:"pid"`
	Process   string `json:"process"`
	WaitingMs int64  `json:"waiting_ms"`
	Position  int    `json:"position,omitempty"`
	Mode      string `json:"mode,omitempty"`
}

// servePoint is one refresh's contention: how many wait and how many
// locks are held.
type servePoint struct {
	Time    time.Time `json:"time"`
	Waiting int       `json:"waiting"`
	Held    int       `json:"held"`
}

// serveEvent is a change seen between two refreshes (or a revoke made
// from the page).
type serveEvent struct {
	Time    time.Time `json:"time"`
	Kind    string    `json:"kind"` // granted, changed_hands, released, expired, revoked
	KeyHash string    `json:"key_hash"`
	Key     string    `json:"key,omitempty"`
	Holder  string    `json:"holder,omitempty"`
	Fence   string    `json:"fence,omitempty"`
	Detail  string    `json:"detail,omitempty"`
}

// leaseSeen is what a refresh saw of a lease, to tell the next one's
// changes.
type leaseSeen struct {
	key, holder, fence string
	expiresAt          time.Time
	live               bool
}

// server is a running `pglease serve`.
type server struct {
	a        *app
	o        viewOpts
	st       *store.Store
	revoker  *store.Store // with the notify channel: the holder's Manager is told at once
	interval time.Duration
	history  time.Duration
	token    []byte // nil: read-only

	mu      sync.Mutex
	state   serveState
	keyOf   map[string]string // key hash → key, for revokes by hash
	prev    map[string]leaseSeen
	hist    []servePoint
	events  []serveEvent
	started bool
}

// serveCmd is pglease serve: the live page.
type serveCmd struct {
	a                 *app
	o                 viewOpts
	addr, tokenFile   string
	interval, history time.Duration
	allowRevoke       bool
}

func serveFlags(a *app, fs *flag.FlagSet) runFunc {
	c := &serveCmd{a: a}
	a.viewFlags(fs, &c.o)
	fs.StringVar(&c.addr, "addr", defaultServeAddr, "listen on `HOST:PORT` (default loopback only; another address exposes the page to that network)")
	fs.DurationVar(&c.interval, "interval", 2*time.Second, "refresh every D")
	fs.DurationVar(&c.history, "history", 10*time.Minute, "keep the contention picture and events for D")
	fs.BoolVar(&c.allowRevoke, "allow-revoke", false, "let the page revoke leases, for requests that present the token (--token-file or $PGLEASE_SERVE_TOKEN)")
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding the revoke token (at least 16 bytes; whitespace trimmed)")
	return c.run
}

// check checks serve's flags and arguments, without any I/O but reading
// the token: the token (nil: read-only) and the host to listen on.
func (c *serveCmd) check(args []string) (token []byte, host string, err error) {
	switch {
	case len(args) != 0:
		return nil, "", fail(exitUsage, "serve takes no arguments (got %q)", args[0])
	case c.o.json:
		return nil, "", fail(exitUsage, "serve has no --json: GET /api/state is the JSON")
	case c.interval < minServeInterval:
		return nil, "", fail(exitUsage, "--interval must be at least %s", minServeInterval)
	case c.history < c.interval:
		return nil, "", fail(exitUsage, "--history must be at least --interval")
	}
	if err := c.o.check(&c.a.c); err != nil {
		return nil, "", err
	}
	if token, err = c.token(); err != nil {
		return nil, "", err
	}
	host, _, err = net.SplitHostPort(c.addr)
	if err != nil {
		return nil, "", fail(exitUsage, "bad --addr: %v", err)
	}
	return token, host, nil
}

// token reads the revoke token: nil without --allow-revoke.
func (c *serveCmd) token() ([]byte, error) {
	switch {
	case c.allowRevoke:
		t := os.Getenv("PGLEASE_SERVE_TOKEN")
		if c.tokenFile != "" {
			b, err := os.ReadFile(c.tokenFile)
			if err != nil {
				return nil, fail(exitUsage, "--token-file: %v", err)
			}
			t = string(b)
		}
		t = strings.TrimSpace(t)
		if len(t) < minTokenBytes {
			return nil, fail(exitUsage, "--allow-revoke needs a token of at least %d bytes in --token-file or $PGLEASE_SERVE_TOKEN", minTokenBytes)
		}
		return []byte(t), nil
	case c.tokenFile != "":
		return nil, fail(exitUsage, "--token-file without --allow-revoke: the page is read-only")
	}
	return nil, nil
}

func (c *serveCmd) run(ctx context.Context, args []string) error {
	a := c.a
	token, host, err := c.check(args)
	if err != nil {
		return err
	}
	reg, err := a.loadRegistry(&c.o)
	if err != nil {
		return err
	}
	pool, st, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg := a.c.config()
	cfg.NotifyChannel = c.o.notifyChannel
	revoker, err := store.New("pg.New", pool, store.Config(cfg))
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return fail(exitFailed, "cannot listen on %s: %v", c.addr, err)
	}
	s := &server{a: a, o: c.o, st: st, revoker: revoker, interval: c.interval, history: c.history, token: token,
		prev: map[string]leaseSeen{}}
	mode := "read-only"
	if token != nil {
		mode = "revoke allowed with the token"
	}
	fmt.Fprintf(a.stderr, "pglease serve: http://%s/ (%s)\n", ln.Addr(), mode)
	if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && host != "localhost" {
		fmt.Fprintf(a.stderr, "pglease serve: WARNING: %s is not a loopback address: anyone who reaches it sees holders and waiters\n", host)
	}
	return s.serve(ctx, ln, pool, reg)
}

// serve serves the page on ln, refreshing the state, until ctx ends.
func (s *server) serve(ctx context.Context, ln net.Listener, pool *pgxpool.Pool, reg *advisory.Registry) error {
	hs := &http.Server{Handler: s.handler(ln.Addr().String()), ReadHeaderTimeout: 10 * time.Second}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() { s.poll(rctx, pool, reg) })
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case <-ctx.Done():
	case err := <-errc:
		stop()
		wg.Wait()
		return fail(exitFailed, "serve: %v", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	stop()
	wg.Wait()
	return nil
}

// poll refreshes the state every interval until ctx ends.
func (s *server) poll(ctx context.Context, pool *pgxpool.Pool, reg *advisory.Registry) {
	for {
		s.refresh(ctx, pool, reg)
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.interval):
		}
	}
}

func (s *server) refresh(ctx context.Context, pool *pgxpool.Pool, reg *advisory.Registry) {
	o := s.o
	o.showKeys = true // keys stay on the server: revokes by hash need them
	cctx, cancel := s.a.withTimeout(ctx)
	defer cancel()
	v, err := collect(cctx, pool, s.st, reg, &o, store.ListOptions{Limit: o.limit}, &s.a.c)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		s.state.Error = scrub(err.Error(), passwords(s.a.c.url))
		s.state.Time = time.Now().UTC()
		return
	}
	s.apply(v)
}

// apply turns a snapshot into the page's state: holders, waiters oldest
// first, the contention point, and the events since the last snapshot.
func (s *server) apply(v *snapshotView) {
	now := v.Time
	p := pageKeys{show: s.o.showKeys, keyOf: map[string]string{}}
	for _, l := range v.Leases.Rows {
		p.keyOf[l.KeyHash] = l.Key
	}
	st := serveState{Time: now, IntervalMs: s.interval.Milliseconds(), ShowKeys: p.show, CanRevoke: s.token != nil,
		Holders: p.holders(v), Waiters: p.waiters(v), Counts: map[string]int{}}
	st.Schema = fmt.Sprintf("schema v%d", v.Schema.Version)
	if !v.Schema.Current {
		st.Schema += fmt.Sprintf(" (this pglease needs v%d: run `pglease setup`)", v.Schema.Needs)
	}
	st.Counts["held"] = len(st.Holders)
	st.Counts["waiting"] = len(st.Waiters)
	st.Counts["queued"] = v.Queue.Tickets
	st.Counts["leases_live"] = v.Leases.Live
	cur := map[string]leaseSeen{}
	for _, l := range v.Leases.Rows {
		cur[l.KeyHash] = leaseSeen{key: l.Key, holder: l.Holder, fence: l.Fence, expiresAt: l.ExpiresAt, live: l.Live}
	}
	if s.started {
		s.changes(v, cur, p)
	}
	s.started = true
	s.prev = cur
	s.keyOf = p.keyOf
	s.hist = append(s.hist, servePoint{Time: now, Waiting: len(st.Waiters), Held: len(st.Holders)})
	for len(s.hist) > 0 && now.Sub(s.hist[0].Time) > s.history {
		s.hist = s.hist[1:]
	}
	st.History = slices.Clone(s.hist)
	st.Events = slices.Clone(s.events)
	s.state = st
}

// pageKeys shows keys on the page: their hashes, and the keys themselves
// with --show-keys.
type pageKeys struct {
	show  bool
	keyOf map[string]string // key hash → key, of the lease rows
}

// key is k if the page shows keys, "" otherwise.
func (p pageKeys) key(k string) string {
	if p.show {
		return k
	}
	return ""
}

// holders are the snapshot's held locks: live leases, shared holds by
// key, advisory locks (but pglease's own).
func (p pageKeys) holders(v *snapshotView) []serveHolder {
	now := v.Time
	hs := []serveHolder{}
	for _, l := range v.Leases.Rows {
		if !l.Live {
			continue
		}
		hs = append(hs, serveHolder{Kind: "lease", KeyHash: l.KeyHash, Key: p.key(l.Key), Holders: []string{dash(l.Holder)},
			Fence: strings.TrimLeft(l.Fence, "0"), HeldMs: now.Sub(l.AcquiredAt).Milliseconds(), ExpiresInMs: l.ExpiresInMs,
			Waiting: l.AcquiresWaiting + l.ManagersWaiting, Queued: l.Queued})
	}
	for _, g := range v.Shared.Rows {
		h := serveHolder{Kind: g.Kind, KeyHash: g.KeyHash, Key: p.key(g.Key), Count: g.Count, Limit: g.Limit, Holders: []string{},
			Waiting: g.AcquiresWaiting, Queued: g.Queued}
		for _, x := range g.Holders {
			h.Holders = append(h.Holders, dash(x.Holder))
			if d := now.Sub(x.AcquiredAt).Milliseconds(); d > h.HeldMs {
				h.HeldMs = d
			}
		}
		hs = append(hs, h)
	}
	for _, ad := range v.Advisory {
		if !ad.Granted || managerLock(ad) || strings.HasPrefix(ad.Name, "lease acquire") {
			continue
		}
		hs = append(hs, serveHolder{Kind: "advisory", KeyHash: ad.Key, Key: p.key(ad.Name),
			Holders: []string{fmt.Sprintf("%d %s", ad.PID, dash(ad.Application))}})
	}
	return hs
}

// managerLock: a waiting or watching Manager's lock (listed as waiting
// Managers, not as a lock).
func managerLock(ad advisoryView) bool {
	return strings.HasPrefix(ad.Name, "waiting Manager") || strings.HasPrefix(ad.Name, "watching Manager")
}

// waiters are the snapshot's waiters, oldest first: acquires waiting in
// the database, sessions waiting for advisory locks, waiting Managers,
// callers in the fair queue.
func (p pageKeys) waiters(v *snapshotView) []serveWaiter {
	ws := []serveWaiter{}
	for _, ad := range v.Advisory {
		if ad.Granted || managerLock(ad) {
			continue
		}
		w := serveWaiter{What: dash(ad.Name), PID: ad.PID, Process: dash(ad.Application), WaitingMs: ad.WaitingMs}
		if h, ok := strings.CutPrefix(ad.Name, "lease acquire "); ok {
			w.What, w.KeyHash = "acquire in the database", h
			w.Key = p.key(p.keyOf[h])
		} else {
			w.KeyHash = ad.Key
		}
		ws = append(ws, w)
	}
	for _, m := range v.WaitingManagers {
		for i, pid := range m.PIDs {
			w := serveWaiter{What: "waiting Manager", PID: pid}
			if i < len(m.Applications) {
				w.Process = dash(m.Applications[i])
			}
			if len(m.KeyHashes) > 0 {
				w.KeyHash = m.KeyHashes[0]
				w.Key = p.key(p.keyOf[w.KeyHash])
			}
			ws = append(ws, w)
		}
	}
	// The fair queue's tickets, in order per key (an earlier ticket
	// has waited longer, so the sort below keeps the order).
	for _, g := range v.Queue.Rows {
		for _, t := range g.Tickets {
			ws = append(ws, serveWaiter{What: "queued", KeyHash: g.KeyHash, Key: p.key(g.Key), Process: dash(t.Holder),
				WaitingMs: t.WaitingMs, Position: t.Position, Mode: t.Mode})
		}
	}
	// Oldest wait first (a waiting Manager's start is not known: last).
	slices.SortStableFunc(ws, func(a, b serveWaiter) int { return cmp.Compare(b.WaitingMs, a.WaitingMs) })
	return ws
}

// changes records the events between the last snapshot's leases (s.prev)
// and this one's (cur): grants, hand-overs, expiries, releases, revokes.
func (s *server) changes(v *snapshotView, cur map[string]leaseSeen, p pageKeys) {
	now := v.Time
	for h, c := range cur {
		prev, ok := s.prev[h]
		switch {
		case c.live && (!ok || !prev.live):
			s.event(serveEvent{Time: now, Kind: "granted", KeyHash: h, Key: p.key(c.key), Holder: c.holder, Fence: c.fence})
		case c.live && prev.fence != c.fence:
			s.event(serveEvent{Time: now, Kind: "changed_hands", KeyHash: h, Key: p.key(c.key), Holder: c.holder, Fence: c.fence,
				Detail: "from " + dash(prev.holder)})
		case !c.live && ok && prev.live:
			s.event(serveEvent{Time: now, Kind: "expired", KeyHash: h, Key: p.key(c.key), Holder: prev.holder, Fence: prev.fence,
				Detail: "not released before its expiry: its holder lost it"})
		}
	}
	revokedNow := map[string]bool{}
	for _, m := range v.Marks {
		if m.Mark == markLockDelay && m.Source == "revoke" {
			revokedNow[m.KeyHash] = true
		}
	}
	for h, prev := range s.prev {
		if _, ok := cur[h]; ok || !prev.live {
			continue
		}
		e := serveEvent{Time: now, Kind: "released", KeyHash: h, Key: p.key(prev.key), Holder: prev.holder, Fence: prev.fence}
		switch {
		case revokedNow[h]:
			e.Kind, e.Detail = "revoked", "deleted by a revoke; its holder is told (ErrRevoked)"
		case !prev.expiresAt.After(now):
			e.Kind, e.Detail = "expired", "not released before its expiry: its holder lost it"
		}
		s.event(e)
	}
}

// event records e, newest first, keeping at most maxServeEvents within
// the history window.
func (s *server) event(e serveEvent) {
	s.events = append([]serveEvent{e}, s.events...)
	for len(s.events) > 0 && (len(s.events) > maxServeEvents || e.Time.Sub(s.events[len(s.events)-1].Time) > s.history) {
		s.events = s.events[:len(s.events)-1]
	}
}

// handler serves the page, its assets, the state and (with a token) the
// revoke. Requests whose Host is not the address served (DNS rebinding)
// are refused.
func (s *server) handler(addr string) http.Handler {
	mux := http.NewServeMux()
	web, _ := fs.Sub(webFiles, "web")
	static := http.FileServerFS(web)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { static.ServeHTTP(w, r) })
	mux.Handle("GET /app.js", static)
	mux.Handle("GET /app.css", static)
	mux.HandleFunc("GET /api/state", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		st := s.state
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, st)
	})
	mux.HandleFunc("POST /api/revoke", s.revoke)
	mux.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	_, port, _ := net.SplitHostPort(addr)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		host, p, err := net.SplitHostPort(r.Host)
		if err != nil || p != port || !allowedHost(host, addr) {
			http.Error(w, "unknown Host", http.StatusMisdirectedRequest)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// allowedHost: the page answers to the names of the address it serves
// (loopback names for a loopback address), so that another site's
// name pointed at 127.0.0.1 cannot read it from a browser.
func allowedHost(host, addr string) bool {
	served, _, _ := net.SplitHostPort(addr)
	if host == served {
		return true
	}
	ip := net.ParseIP(served)
	if ip != nil && ip.IsLoopback() {
		return host == "localhost" || host == "127.0.0.1" || host == "::1"
	}
	return ip != nil && ip.IsUnspecified()
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// revoke revokes the lease of a key given by hash, for a request that
// presents the token (Authorization: Bearer). Read-only by default.
func (s *server) revoke(w http.ResponseWriter, r *http.Request) {
	if s.token == nil {
		writeJSON(w, http.StatusForbidden, map[string]string{"error": "read-only: start pglease serve with --allow-revoke and a token to revoke from the page"})
		return
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(got), s.token) != 1 {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "a valid token is needed (Authorization: Bearer TOKEN)"})
		return
	}
	var req struct {
		KeyHash string `json:"key_hash"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil || req.KeyHash == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": `body must be {"key_hash": "…"}`})
		return
	}
	s.mu.Lock()
	key, known := s.keyOf[req.KeyHash]
	s.mu.Unlock()
	if !known || key == "" {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no lease of that key hash in the last refresh"})
		return
	}
	ctx, cancel := s.a.withTimeout(r.Context())
	defer cancel()
	res, err := s.revoker.Revoke(ctx, []store.RevokeRequest{{Key: key}})
	if err != nil {
		writeJSON(w, http.StatusBadGateway, map[string]string{"error": scrub(err.Error(), passwords(s.a.c.url))})
		return
	}
	result := "not_live"
	if len(res) == 1 && res[0].Revoked > 0 {
		result = "revoked"
		fence := ""
		if len(res[0].Fences) > 0 {
			fence = res[0].Fences[0].String()
		}
		s.mu.Lock()
		s.event(serveEvent{Time: time.Now().UTC(), Kind: "revoked", KeyHash: req.KeyHash, Fence: fence,
			Detail: "revoked from this page"})
		s.mu.Unlock()
	}
	s.a.auditLogger().Info("pglease serve", "action", "revoke_lease", "key_hash", req.KeyHash, "remote", r.RemoteAddr,
		"operator", operator(), "result", result)
	writeJSON(w, http.StatusOK, map[string]string{"result": result})
}
