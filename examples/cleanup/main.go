// Command cleanup is the e-mail cleanup-lock design, end to end, on
// pglease (package pg/advisory). Each cleanup request is a process, as
// each edge-function invocation is in the design:
//
//   - it derives the lock key from the e-mail address exactly as the SQL
//     email_to_lock_id does (advisory.SHA256Key: SHA-256 of
//     lower(trim(email)), first 8 bytes as a bigint), opens a session and
//     tries the lock (acquire_cleanup_lock = pg_try_advisory_lock);
//   - when another request holds it, it answers 409 ORPHAN_CLEANUP_009 at
//     once; else it runs the cleanup and releases the lock on the way out
//     (release_cleanup_lock = pg_advisory_unlock, the design's finally);
//   - the design's 30-second limit is the session's HoldLimit: the
//     cleanup runs under the lock's Context, which ends at the limit with
//     pglease.ErrHoldLimitExceeded; the cleanup stops, the request answers
//     504, and the lock is released when the request returns, not before;
//   - a request killed with SIGKILL mid-cleanup leaves no lock behind:
//     PostgreSQL frees it when the connection closes, and the next request
//     proceeds at once.
//
// Run without arguments it plays these out with several request
// processes (the limit shortened to 2 s; -limit 30s for the design's) and
// returns an error if any of it does not hold:
//
//	go run ./internal/cmd/withpg -C examples -- go run ./cleanup
//
// One request: echo user@example.com | go run ./cleanup request
// (the address is read from stdin, so it is not in the process list, and
// it is never printed).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pg/advisory"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	url := os.Getenv("DATABASE_URL")
	if len(os.Args) > 1 && os.Args[1] == "request" {
		os.Exit(requestMain(ctx, os.Args[2:], url))
	}
	fs := flag.NewFlagSet("cleanup", flag.ExitOnError)
	limit := fs.Duration("limit", 2*time.Second, "the cleanup time limit (the design's is 30s)")
	_ = fs.Parse(os.Args[1:])
	self, err := os.Executable()
	if err == nil {
		err = run(ctx, os.Stdout, url, Options{Bin: self, Limit: *limit})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cleanup:", err)
		os.Exit(1)
	}
}

// Options shape the scenario; the zero value gives the defaults.
type Options struct {
	// Bin is this program's binary, started as the request processes.
	Bin string
	// Limit is the cleanup time limit (default 2 s; the design's is 30 s).
	Limit time.Duration
	// Work is how long a normal cleanup takes (default 1.5 s).
	Work time.Duration
	// Requests is how many concurrent requests race for one address
	// (default 5).
	Requests int
}

func (o Options) withDefaults() Options {
	if o.Limit == 0 {
		o.Limit = 2 * time.Second
	}
	if o.Work == 0 {
		o.Work = 1500 * time.Millisecond
	}
	if o.Requests == 0 {
		o.Requests = 5
	}
	return o
}

// response is a request's answer: the design's status and error code.
type response struct {
	Status  int    `json:"status"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

// event is one line a request process prints: "started" when it holds
// the lock and begins the cleanup (with its backend pid), then "answer".
type event struct {
	Event string    `json:"event"`
	PID   int32     `json:"pid,omitempty"`
	Resp  *response `json:"response,omitempty"`
	MS    int64     `json:"ms,omitempty"` // from the start of the request to the answer
}

// requestMain is one request process: the e-mail address on stdin.
func requestMain(ctx context.Context, args []string, url string) int {
	fs := flag.NewFlagSet("request", flag.ContinueOnError)
	limit := fs.Duration("limit", 30*time.Second, "the cleanup time limit")
	work := fs.Duration("work", 1500*time.Millisecond, "how long the cleanup takes")
	gate := fs.Bool("gate", false, `print {"event":"ready"} once the session is open and wait for a line on stdin before trying the lock`)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	in := bufio.NewReader(os.Stdin)
	email, err := in.ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	enc := json.NewEncoder(os.Stdout)
	start := time.Now()
	ready := func() {
		if *gate {
			_ = enc.Encode(event{Event: "ready"})
			_, _ = in.ReadString('\n') // "go", or EOF
		}
	}
	started := func(pid int32) { _ = enc.Encode(event{Event: "started", PID: pid}) }
	resp := cleanupOrphanedUser(ctx, url, strings.TrimRight(email, "\r\n"), *limit, *work, ready, started)
	_ = enc.Encode(event{Event: "answer", Resp: &resp, MS: time.Since(start).Milliseconds()})
	return 0
}

// cleanupOrphanedUser is the design's edge function. ready is called
// once the session is open, before the lock is tried; started once the
// cleanup has begun.
func cleanupOrphanedUser(ctx context.Context, url, email string, limit, work time.Duration, ready func(), started func(pid int32)) response {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return response{Status: 500, Message: err.Error()}
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "cleanup-request"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return response{Status: 500, Message: err.Error()}
	}
	defer pool.Close()

	// readme:begin cleanup-request
	key, err := advisory.SHA256Key(email) // = email_to_lock_id(email); never logged
	if err != nil {
		return response{Status: 400, Message: "invalid e-mail address"}
	}
	// The session (a dedicated connection) enforces the time limit: at
	// HoldLimit the lock's Context ends with ErrHoldLimitExceeded.
	sess, err := advisory.Open(ctx, pool, &advisory.Options{HoldLimit: limit})
	if err != nil {
		return response{Status: 503, Message: err.Error()}
	}
	defer sess.Close(context.WithoutCancel(ctx))
	// readme:end cleanup-request
	ready() // the demonstration starts concurrent requests' attempts together
	// readme:begin cleanup-try
	lock, ok, err := sess.TryLock(ctx, key) // = acquire_cleanup_lock(email)
	if err != nil {
		return response{Status: 503, Message: err.Error()}
	}
	if !ok {
		return response{Status: 409, Code: "ORPHAN_CLEANUP_009",
			Message: "Cleanup operation already in progress for this email"}
	}
	// = release_cleanup_lock(email) in the design's finally, also on a
	// timeout: after the cleanup has returned, never while it still runs.
	defer lock.Release(context.WithoutCancel(ctx))
	err = performCleanup(lock.Context(), pool, key, work, func() { started(sess.BackendPID()) })
	switch {
	case errors.Is(err, pglease.ErrHoldLimitExceeded):
		return response{Status: 504, Code: "ORPHAN_CLEANUP_TIMEOUT",
			Message: fmt.Sprintf("Cleanup timed out after %v", limit)}
	case errors.Is(err, pglease.ErrLockLost):
		return response{Status: 503, Message: "lost the cleanup lock; the cleanup stopped"}
	case err != nil:
		return response{Status: 500, Message: err.Error()}
	}
	return response{Status: 200}
	// readme:end cleanup-try
}

// performCleanup stands for the design's steps (verify the user, its
// orphan status, generate and send a verification code, store it, log):
// it records a run (then calls begun), works for work (or until ctx
// ends), and records the outcome. It stops when ctx ends and returns the
// cause.
func performCleanup(ctx context.Context, pool *pgxpool.Pool, key advisory.Key, work time.Duration, begun func()) error {
	var id int64
	if err := pool.QueryRow(ctx, `INSERT INTO cleanup_runs (lock_id, pid) VALUES ($1, $2) RETURNING id`,
		key.String(), os.Getpid()).Scan(&id); err != nil {
		return err
	}
	begun()
	outcome, result := "done", error(nil)
	select {
	case <-time.After(work):
	case <-ctx.Done():
		outcome, result = "stopped", context.Cause(ctx)
	}
	// Recorded under a context of its own: the lock's may have ended.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := pool.Exec(dctx, `UPDATE cleanup_runs SET finished = clock_timestamp(), outcome = $2 WHERE id = $1`, id, outcome); err != nil {
		return errors.Join(result, err)
	}
	return result
}

const schemaSQL = `CREATE TABLE IF NOT EXISTS cleanup_runs (
	id bigserial PRIMARY KEY, lock_id text NOT NULL, pid int NOT NULL,
	started timestamptz NOT NULL DEFAULT clock_timestamp(), finished timestamptz, outcome text)`

// request is a running request process.
type request struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	ready   chan struct{} // closed when a gated request is ready to try the lock
	started chan int32    // the backend pid, once it holds the lock
	answer  chan response // closed without a value if the process died first
	ms      int64         // valid after answer: from the start of the request
	at      time.Time     // valid after answer: when it arrived
}

// startRequest starts a request process for email; a gated one waits
// for release before it tries the lock.
func startRequest(ctx context.Context, bin, url, email string, limit, work time.Duration, gated bool) (*request, error) {
	cmd := exec.CommandContext(ctx, bin, "request", "-limit", limit.String(), "-work", work.String(), fmt.Sprintf("-gate=%v", gated))
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if _, err := io.WriteString(stdin, email+"\n"); err != nil {
		return nil, err
	}
	if !gated {
		_ = stdin.Close()
	}
	r := &request{cmd: cmd, stdin: stdin, ready: make(chan struct{}), started: make(chan int32, 1), answer: make(chan response, 1)}
	go func() {
		defer close(r.answer)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var e event
			if json.Unmarshal(sc.Bytes(), &e) != nil {
				continue
			}
			switch {
			case e.Event == "ready":
				close(r.ready)
			case e.Event == "started":
				r.started <- e.PID
			case e.Event == "answer" && e.Resp != nil:
				r.ms, r.at = e.MS, time.Now()
				r.answer <- *e.Resp
			}
		}
		_ = cmd.Wait()
	}()
	return r, nil
}

// wait returns the request's answer, or an error if the process ended
// without one or ctx ended.
func (r *request) wait(ctx context.Context) (response, error) {
	select {
	case resp, ok := <-r.answer:
		if !ok {
			return response{}, errors.New("request process ended without an answer")
		}
		return resp, nil
	case <-ctx.Done():
		return response{}, ctx.Err()
	}
}

func (r *request) waitStarted(ctx context.Context) (int32, error) {
	select {
	case pid := <-r.started:
		return pid, nil
	case resp, ok := <-r.answer:
		return 0, fmt.Errorf("request answered %+v (%v) before it started a cleanup", resp, ok)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func run(ctx context.Context, w io.Writer, url string, o Options) error {
	if url == "" {
		return errors.New("DATABASE_URL is not set")
	}
	o = o.withDefaults()
	if o.Work >= o.Limit {
		return errors.New("a normal cleanup (Work) must take less than the limit")
	}
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	say := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, schemaSQL); err != nil {
		return err
	}
	const email = "Orphaned.User@Example.com" // never printed
	key, err := advisory.SHA256Key(email)
	if err != nil {
		return err
	}

	// 1. Concurrent requests for one address.
	say("%d concurrent cleanup requests for one e-mail address (each a process, as edge functions are):", o.Requests)
	var reqs []*request
	for range o.Requests {
		r, err := startRequest(ctx, o.Bin, url, email, o.Limit, o.Work, true)
		if err != nil {
			return err
		}
		reqs = append(reqs, r)
	}
	// Process start-up takes long and varies; let them all open their
	// sessions first, then try the lock together.
	for _, r := range reqs {
		select {
		case <-r.ready:
		case <-r.answer:
			return errors.New("a request ended before it was ready")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	goAt := time.Now()
	for _, r := range reqs {
		_, _ = io.WriteString(r.stdin, "go\n")
		_ = r.stdin.Close()
	}
	answers := make([]response, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() { answers[i], errs[i] = r.wait(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	var ran *request
	var busy []time.Duration
	for i, a := range answers {
		switch a.Status {
		case 200:
			if ran != nil {
				return errors.New("two requests ran the cleanup")
			}
			ran = reqs[i]
		case 409:
			busy = append(busy, reqs[i].at.Sub(goAt))
		default:
			return fmt.Errorf("request %d answered %+v", i, a)
		}
	}
	if ran == nil || len(busy) != o.Requests-1 {
		return fmt.Errorf("%d busy answers and a run: %v; want exactly one run", len(busy), ran != nil)
	}
	slices.Sort(busy)
	say("  one request ran the cleanup (200, %d ms); %d answered 409 ORPHAN_CLEANUP_009 at once (within %d ms), while it ran",
		ran.at.Sub(goAt).Milliseconds(), len(busy), busy[len(busy)-1].Milliseconds())
	if busy[len(busy)-1] >= ran.at.Sub(goAt) {
		return errors.New("a busy answer came after the cleanup finished: it waited instead of answering at once")
	}

	// 2. The holder is killed mid-cleanup.
	say("\na request is killed with SIGKILL in the middle of its cleanup:")
	a, err := startRequest(ctx, o.Bin, url, email, o.Limit, time.Hour, false)
	if err != nil {
		return err
	}
	pid, err := a.waitStarted(ctx)
	if err != nil {
		return err
	}
	if err := showHolder(ctx, say, pool, email, pid); err != nil {
		return err
	}
	if err := a.cmd.Process.Kill(); err != nil {
		return err
	}
	killed := time.Now()
	if _, err := a.wait(ctx); err == nil {
		return errors.New("the killed request answered")
	}
	b, err := startRequest(ctx, o.Bin, url, email, o.Limit, 200*time.Millisecond, false)
	if err != nil {
		return err
	}
	resp, err := b.wait(ctx)
	if err != nil {
		return err
	}
	if resp.Status != 200 {
		return fmt.Errorf("the request after the kill answered %+v: the lock was not freed", resp)
	}
	say("  the next request ran the cleanup (200) %d ms after the kill: PostgreSQL freed the lock when the connection closed",
		time.Since(killed).Milliseconds())

	// 3. The time limit.
	say("\na cleanup that would run for an hour, under a %v limit:", o.Limit)
	d, err := startRequest(ctx, o.Bin, url, email, o.Limit, o.Work, true) // ready to try once c runs
	if err != nil {
		return err
	}
	c, err := startRequest(ctx, o.Bin, url, email, o.Limit, time.Hour, false)
	if err != nil {
		return err
	}
	if _, err := c.waitStarted(ctx); err != nil {
		return err
	}
	select {
	case <-d.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	_, _ = io.WriteString(d.stdin, "go\n")
	_ = d.stdin.Close()
	if resp, err := d.wait(ctx); err != nil || resp.Status != 409 {
		return fmt.Errorf("a request during the long cleanup answered %+v %v, want 409", resp, err)
	}
	say("  meanwhile another request: 409 (the lock is held until the cleanup returns)")
	resp, err = c.wait(ctx)
	if err != nil {
		return err
	}
	if resp.Status != 504 {
		return fmt.Errorf("the long cleanup answered %+v, want 504", resp)
	}
	if got := time.Duration(c.ms) * time.Millisecond; got < o.Limit {
		return fmt.Errorf("the long cleanup stopped after %v, before its %v limit", got, o.Limit)
	}
	say("  it stopped at the limit: %d %s %q after %d ms", resp.Status, resp.Code, resp.Message, c.ms)
	e, err := startRequest(ctx, o.Bin, url, email, o.Limit, 200*time.Millisecond, false)
	if err != nil {
		return err
	}
	if resp, err := e.wait(ctx); err != nil || resp.Status != 200 {
		return fmt.Errorf("the request after the timeout answered %+v %v, want 200", resp, err)
	}
	say("  the next request ran the cleanup (200): the lock was released when the timed-out request returned")

	// The runs table agrees: never two cleanups of the address at once.
	rows, err := pool.Query(ctx, `SELECT started, finished, coalesce(outcome, 'killed') FROM cleanup_runs
		WHERE lock_id = $1 ORDER BY started`, key.String())
	if err != nil {
		return err
	}
	var outcomes []string
	var lastEnd time.Time
	for rows.Next() {
		var s time.Time
		var finished *time.Time
		var outcome string
		if err := rows.Scan(&s, &finished, &outcome); err != nil {
			return err
		}
		f := killed // a killed run ended with its process
		if finished != nil {
			f = *finished
		}
		if !lastEnd.IsZero() && s.Before(lastEnd) {
			return errors.New("two cleanups of the address overlapped")
		}
		lastEnd = f
		outcomes = append(outcomes, outcome)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	say("\ncleanup runs of the address, in order: %s; never two at once", strings.Join(outcomes, ", "))
	return nil
}

// showHolder finds the cleanup lock of email with advisory.Inspect, by
// name, the way an operator would: the team's registry names the
// pattern, and the operator derives the key from the address in the
// ticket. Neither the address nor its key is printed.
func showHolder(ctx context.Context, say func(string, ...any), pool *pgxpool.Pool, email string, pid int32) error {
	// readme:begin cleanup-inspect
	reg := advisory.NewRegistry()
	if _, err := reg.Pattern("orphan-cleanup", "{email}", advisory.SHA256Key, "email_to_lock_id"); err != nil {
		return err
	}
	if _, err := reg.Derive("orphan-cleanup", email); err != nil { // remembered as a key, not the address
		return err
	}
	infos, err := advisory.Inspect(ctx, pool, reg)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(infos, func(li advisory.LockInfo) bool { return li.Name == "orphan-cleanup" && li.Granted })
	if i < 0 {
		return errors.New("the cleanup lock is not in advisory.Inspect")
	}
	say("  Inspect: %s held by backend %d (%s, %s)", infos[i].Name, infos[i].PID, infos[i].ApplicationName, infos[i].State)
	// readme:end cleanup-inspect
	if infos[i].PID != pid {
		return fmt.Errorf("advisory.Inspect shows backend %d, the request's is %d", infos[i].PID, pid)
	}
	return nil
}
