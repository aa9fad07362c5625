// Command demo is what `make demo` runs: pglease's lease locks on the
// PostgreSQL at DATABASE_URL, first in one process (pg.Store), then with
// several worker processes (examples/worker) that compete for a handful of
// job keys through manager.Manager. It prints a merged timeline: who holds
// which job, fence tokens, heartbeat extends, handoffs. Then it freezes
// one holding worker with SIGSTOP until its lease has passed to another
// worker (a higher fence), resumes it with SIGCONT, and shows the frozen
// worker learning of the loss at once and its late write being refused by
// the fenced write (pg.FenceGuard) on the jobs table. It ends with a
// summary and exits 0 if everything happened as it should.
//
//	make demo                          # throwaway PostgreSQL
//	DATABASE_URL=postgres://… go run ./demo [-ttl 2s -workers 3 …]
//
// It never prints a lockId (a bearer secret). Unix only (SIGSTOP).
package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/exampledb"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// Options configure a demo run (its flags).
type Options struct {
	Workers, Jobs    int
	TTL              time.Duration // lease TTL of the workers
	WorkMin, WorkMax time.Duration // length of one job
	Normal           time.Duration // how long the workers run before the freeze
	Tail             time.Duration // how long they run after the frozen worker's late write
	WorkerBin        string        // a built examples/worker; "" = go build it
	SkipIntro        bool          // skip the single-process pg.Store section
}

func defaultOptions() Options {
	return Options{Workers: 3, Jobs: 3, TTL: 2 * time.Second, WorkMin: 3 * time.Second, WorkMax: 4 * time.Second,
		Normal: 9 * time.Second, Tail: 3 * time.Second}
}

func main() {
	o := defaultOptions()
	flag.IntVar(&o.Workers, "workers", o.Workers, "worker processes")
	flag.IntVar(&o.Jobs, "jobs", o.Jobs, "job keys")
	flag.DurationVar(&o.TTL, "ttl", o.TTL, "lease TTL")
	flag.DurationVar(&o.WorkMin, "work-min", o.WorkMin, "shortest job")
	flag.DurationVar(&o.WorkMax, "work-max", o.WorkMax, "longest job")
	flag.DurationVar(&o.Normal, "normal", o.Normal, "run time before the freeze")
	flag.DurationVar(&o.Tail, "tail", o.Tail, "run time after the late write")
	flag.StringVar(&o.WorkerBin, "worker-bin", "", "path of a built examples/worker (default: go build it)")
	flag.BoolVar(&o.SkipIntro, "skip-intro", false, "skip the single-process section")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A schema of its own (the workers get it through their connection
	// string), dropped at the end: nothing is left in your database.
	err := exampledb.Run(ctx, os.Getenv("DATABASE_URL"), "pglease_demo", func(url string) error {
		return run(ctx, os.Stdout, url, o)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// jobsTable is the table the workers write with fenced writes.
const jobsTable = "pglease_demo_jobs"

// timeTolerance is how long past its expiry a lease still counts as held
// for other acquirers: SyncGuard's tolerance of 1 s, which pglease keeps.
const timeTolerance = time.Second

func run(ctx context.Context, w io.Writer, url string, o Options) error {
	if url == "" {
		return errors.New("DATABASE_URL is not set (make demo starts a throwaway PostgreSQL)")
	}
	if o.Workers < 2 || o.Jobs < 1 || o.TTL < 300*time.Millisecond || o.WorkMin < 100*time.Millisecond || o.WorkMax < o.WorkMin {
		return errors.New("bad options: need ≥ 2 workers, ≥ 1 job, ttl ≥ 300ms, work ≥ 100ms")
	}
	started := time.Now()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	mg, err := migrate.New(pool, pg.Config{})
	if err != nil {
		return err
	}
	if err := mg.Up(ctx); err != nil {
		return err
	}
	store, err := pg.New(pool, pg.Config{})
	if err != nil {
		return err
	}
	if !o.SkipIntro {
		if err := intro(ctx, w, store); err != nil {
			return err
		}
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+jobsTable+` (
		id text PRIMARY KEY, fence bigint, status text NOT NULL DEFAULT 'new', worker text, updated_at timestamptz)`); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `DELETE FROM `+jobsTable); err != nil {
		return err
	}

	bin := o.WorkerBin
	if bin == "" {
		dir, err := os.MkdirTemp("", "pglease-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		bin = filepath.Join(dir, "worker")
		fmt.Fprintln(w, "building examples/worker …")
		build := exec.CommandContext(ctx, cmp.Or(os.Getenv("GO"), "go"), "build", "-o", bin, "github.com/pglease/pglease/examples/worker")
		build.Stdout, build.Stderr = w, w
		if err := build.Run(); err != nil {
			return fmt.Errorf("building the worker: %w", err)
		}
	}

	jobs := make([]string, o.Jobs)
	for i := range jobs {
		jobs[i] = fmt.Sprintf("job-%d", i+1)
	}
	fmt.Fprintf(w, "\n== 2. %d worker processes, %d jobs, lease TTL %v (auto-extended), each job takes %v–%v ==\n",
		o.Workers, o.Jobs, o.TTL, o.WorkMin, o.WorkMax)
	fmt.Fprintf(w, "Each worker: Acquire(job) → claim the job's row with a fenced write → work → fenced write \"done\" → Release.\n\n")
	tl := newTimeline(w, o)
	err = tl.play(ctx, bin, url, jobs)
	tl.stopAll()
	if err != nil {
		return err
	}
	return tl.summary(ctx, pool, jobs, time.Since(started))
}

// intro is the single-process section: the Store's operations.
func intro(ctx context.Context, w io.Writer, store *pg.Store) error {
	fmt.Fprintln(w, "== 1. One process, pg.Store (one round trip per operation) ==")
	key := "demo:intro:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	a, err := store.Acquire(ctx, key, 2*time.Second)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "acquire              → ok=%v fence=%s (lockId shown only as its hash #%s)\n", a.OK, a.Fence, pglease.HashKey(a.LockID))
	b, err := store.Acquire(ctx, key, 2*time.Second)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "acquire again        → ok=%v (\"locked\" is a result, not an error)\n", b.OK)
	e, err := store.Extend(ctx, a.LockID, 10*time.Second)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "extend to 10s        → ok=%v\n", e.OK)
	if _, err := store.Release(ctx, a.LockID); err != nil {
		return err
	}
	c, err := store.Acquire(ctx, key, time.Second)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "release, re-acquire  → ok=%v fence=%s (fences only grow)\n", c.OK, c.Fence)
	_, err = store.Release(ctx, c.LockID)
	return err
}

// event is a worker's output line (see examples/worker), plus who and when.
type event struct {
	Ev          string `json:"ev"`
	Job         string `json:"job"`
	Fence       int64  `json:"fence"`
	WaitMs      int64  `json:"wait_ms"`
	ExpiresInMs int64  `json:"expires_in_ms"`
	Accepted    *bool  `json:"accepted"`
	RowFence    int64  `json:"row_fence"`
	Msg         string `json:"msg"`

	worker int
	at     time.Time
}

type worker struct {
	name   string
	cmd    *exec.Cmd
	exited bool
	frozen bool
}

type holder struct {
	worker   int
	fence    int64
	released time.Time // zero while held
	lost     bool
}

// timeline runs the workers and merges their events.
type timeline struct {
	w     io.Writer
	o     Options
	start time.Time
	ws    []*worker
	evs   chan event

	holders map[string]*holder
	fences  map[string][]int64
	done    int
	extends int
	// per holding (job, fence): heartbeat extends seen, printed with the
	// holding's end instead of one line each
	hb map[string]int
	// per job: runs completed
	doneBy map[string]int
	// handoffs: release → next acquire by another worker, in ms
	handoffs  []int64
	takeovers int
	lateOK    int // the frozen worker's late writes accepted (after a takeover: must not happen)
	lateNo    int
	// lateUnclaimed counts other workers' late writes accepted because no
	// newer holder had claimed the job (their lease was declared lost
	// early, e.g. under CPU load): allowed.
	lateUnclaimed int
	doneNo        int
	errs          []string

	// the freeze scene
	frozen      int // worker index, -1 none
	frozenJob   string
	frozenFence int64
	frozenAt    time.Time
	contAt      time.Time
	lostAfter   time.Duration // SIGCONT → loss reported
	lostSeen    bool
	lateSeen    bool
}

func newTimeline(w io.Writer, o Options) *timeline {
	return &timeline{w: w, o: o, evs: make(chan event, 256), holders: map[string]*holder{}, fences: map[string][]int64{}, frozen: -1,
		hb: map[string]int{}, doneBy: map[string]int{}}
}

func (t *timeline) printf(who, job, format string, args ...any) {
	fmt.Fprintf(t.w, "%7.3fs  %-4s %-6s %s\n", time.Since(t.start).Seconds(), who, job, fmt.Sprintf(format, args...))
}

func (t *timeline) startWorkers(ctx context.Context, bin, url string, jobs []string) error {
	for i := range t.o.Workers {
		name := fmt.Sprintf("w%d", i+1)
		cmd := exec.Command(bin, "-id", name, "-jobs", strings.Join(jobs, ","), "-start", strconv.Itoa(i),
			"-ttl", t.o.TTL.String(), "-work-min", t.o.WorkMin.String(), "-work-max", t.o.WorkMax.String(), "-table", jobsTable)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
		cmd.SysProcAttr = sysProcAttr()
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		stderr, err := cmd.StderrPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		t.ws = append(t.ws, &worker{name: name, cmd: cmd})
		go t.read(i, stderr, true)
		go func() {
			t.read(i, stdout, false)
			_ = cmd.Wait()
			t.evs <- event{Ev: "exited", worker: i, at: time.Now()}
		}()
	}
	return nil
}

// read turns a worker's output into events; stderr lines become "log".
func (t *timeline) read(i int, r io.Reader, isErr bool) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var ev event
		if isErr || json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Ev == "" {
			ev = event{Ev: "log", Msg: sc.Text()}
		}
		ev.worker, ev.at = i, time.Now()
		t.evs <- ev
	}
}

// play runs the scenario: normal work, freeze, takeover, resume, tail,
// shutdown.
func (t *timeline) play(ctx context.Context, bin, url string, jobs []string) error {
	t.start = time.Now()
	if err := t.startWorkers(ctx, bin, url, jobs); err != nil {
		return err
	}
	const (
		normal = iota
		freezeNext
		frozen
		resumed
		tail
		stopping
	)
	phase := normal
	var phaseEnd time.Time
	ready := 0
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	takeoverBound := t.o.TTL + timeTolerance + 4*time.Second + t.o.WorkMax
	exited := 0
	for exited < len(t.ws) {
		select {
		case <-ctx.Done():
			if phase != stopping {
				fmt.Fprintln(t.w, "interrupted: stopping the workers")
				t.signalAll(syscall.SIGINT)
				phase, phaseEnd = stopping, time.Now().Add(5*time.Second)
			}
		case <-tick.C:
		case ev := <-t.evs:
			if ev.Ev == "exited" {
				exited++
				t.ws[ev.worker].exited = true
				if phase != stopping {
					return fmt.Errorf("worker %s exited early", t.ws[ev.worker].name)
				}
				continue
			}
			if ev.Ev == "ready" {
				if ready++; ready == len(t.ws) {
					phaseEnd = time.Now().Add(t.o.Normal)
				}
			}
			t.show(ev)
			switch {
			case phase == freezeNext && ev.Ev == "acquired":
				t.freeze(ev)
				phase, phaseEnd = frozen, time.Now().Add(takeoverBound)
			case phase == frozen && ev.Ev == "acquired" && ev.Job == t.frozenJob && ev.worker != t.frozen:
				t.resume()
				phase, phaseEnd = resumed, time.Now().Add(5*time.Second)
			case phase == resumed && t.lostSeen && t.lateSeen:
				phase, phaseEnd = tail, time.Now().Add(t.o.Tail)
			}
		}
		now := time.Now()
		switch {
		case phaseEnd.IsZero() || now.Before(phaseEnd):
		case phase == normal:
			phase = freezeNext
			phaseEnd = now.Add(2*t.o.WorkMax + 2*t.o.TTL + 5*time.Second)
		case phase == freezeNext:
			return errors.New("no worker acquired a job to freeze")
		case phase == frozen:
			return errors.New("no other worker took over the frozen worker's job")
		case phase == resumed:
			return errors.New("the frozen worker did not report the loss and its late write")
		case phase == tail:
			fmt.Fprintf(t.w, "%7.3fs  demo        stopping the workers (SIGINT): they release what they hold\n", time.Since(t.start).Seconds())
			t.signalAll(syscall.SIGINT)
			phase, phaseEnd = stopping, now.Add(10*time.Second)
		case phase == stopping:
			return errors.New("workers did not stop within 10s")
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}

func (t *timeline) freeze(ev event) {
	wk := t.ws[ev.worker]
	if err := wk.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.errs = append(t.errs, "SIGSTOP: "+err.Error())
		return
	}
	wk.frozen = true
	t.frozen, t.frozenJob, t.frozenFence, t.frozenAt = ev.worker, ev.Job, ev.Fence, time.Now()
	fmt.Fprintf(t.w, "%7.3fs  demo        ❄ SIGSTOP %s while it holds %s (fence %d): it can neither work nor heartbeat.\n",
		time.Since(t.start).Seconds(), wk.name, ev.Job, ev.Fence)
	fmt.Fprintf(t.w, "                       Its lease runs out after the %v TTL; others may take the job 1 s (tolerance) later.\n", t.o.TTL)
}

func (t *timeline) resume() {
	wk := t.ws[t.frozen]
	fmt.Fprintf(t.w, "%7.3fs  demo        ▶ SIGCONT %s after %.1f s frozen; its process resumes believing it holds %s\n",
		time.Since(t.start).Seconds(), wk.name, time.Since(t.frozenAt).Seconds(), t.frozenJob)
	t.contAt = time.Now()
	_ = wk.cmd.Process.Signal(syscall.SIGCONT)
	wk.frozen = false
}

// show prints one event and updates the statistics.
func (t *timeline) show(ev event) {
	who := t.ws[ev.worker].name
	switch ev.Ev {
	case "ready":
		t.printf(who, "", "ready")
	case "acquired":
		h := t.holders[ev.Job]
		note := ""
		if ev.WaitMs >= 50 {
			note = fmt.Sprintf(" (waited %d ms)", ev.WaitMs)
		}
		waitStart := ev.at.Add(-time.Duration(ev.WaitMs) * time.Millisecond)
		switch {
		case h != nil && h.worker != ev.worker && h.lost:
			note = fmt.Sprintf("  ⚑ TAKEOVER from %s, whose lease expired (fence %d → %d)", t.ws[h.worker].name, h.fence, ev.Fence)
			t.takeovers++
		case h != nil && h.worker != ev.worker && !h.released.IsZero() && waitStart.Before(h.released):
			// The acquirer was waiting when the holder released: a handoff.
			d := ev.at.Sub(h.released).Milliseconds()
			note = fmt.Sprintf("  ← handoff from %s, %d ms after its release (waited %d ms)", t.ws[h.worker].name, d, ev.WaitMs)
			t.handoffs = append(t.handoffs, d)
		case h != nil && h.worker != ev.worker && !h.released.IsZero():
			note = fmt.Sprintf("  (free since %s released it)", t.ws[h.worker].name)
		case h != nil && h.worker != ev.worker && h.released.IsZero() && ev.Job == t.frozenJob && ev.worker != t.frozen:
			note = fmt.Sprintf("  ⚑ TAKEOVER from frozen %s, whose lease expired (fence %d → %d)", t.ws[h.worker].name, h.fence, ev.Fence)
			t.takeovers++
		}
		if prev := t.fences[ev.Job]; len(prev) > 0 && prev[len(prev)-1] >= ev.Fence {
			t.errs = append(t.errs, fmt.Sprintf("%s: fence %d after %d", ev.Job, ev.Fence, prev[len(prev)-1]))
		}
		t.fences[ev.Job] = append(t.fences[ev.Job], ev.Fence)
		t.holders[ev.Job] = &holder{worker: ev.worker, fence: ev.Fence}
		t.printf(who, ev.Job, "acquired  fence %d, claimed the row%s", ev.Fence, note)
	case "extended":
		t.extends++
		t.hb[holding(ev.Job, ev.Fence)]++
		if t.extends == 1 {
			t.printf(who, ev.Job, "extended  (heartbeat: the Manager renewed the lease, which now ends in %.1f s;", float64(ev.ExpiresInMs)/1000)
			fmt.Fprintf(t.w, "%21s from here on extends are counted, and shown when the holding ends)\n", "")
		}
	case "done":
		if ev.Accepted != nil && *ev.Accepted {
			t.done++
			t.doneBy[ev.Job]++
			t.printf(who, ev.Job, "done      result written with fence %d%s", ev.Fence, t.hbNote(ev))
		} else {
			t.doneNo++
			t.printf(who, ev.Job, "done      but its write was REFUSED by the fence (a newer holder wrote the row)")
		}
	case "released":
		if h := t.holders[ev.Job]; h != nil && h.fence == ev.Fence {
			h.released = ev.at
		}
		if ev.Msg != "" {
			t.printf(who, ev.Job, "released  (%s)%s", ev.Msg, t.hbNote(ev))
		} else {
			t.printf(who, ev.Job, "released")
		}
	case "lost":
		if h := t.holders[ev.Job]; h != nil && h.fence == ev.Fence {
			h.lost = true
		}
		extra := ""
		if ev.worker == t.frozen && !t.contAt.IsZero() && !t.lostSeen {
			t.lostSeen = true
			t.lostAfter = ev.at.Sub(t.contAt)
			extra = fmt.Sprintf(" — noticed %d ms after SIGCONT", t.lostAfter.Milliseconds())
		}
		t.printf(who, ev.Job, "LOST      fence %d: lock context cancelled (%s)%s%s", ev.Fence, ev.Msg, extra, t.hbNote(ev))
	case "late_write":
		if ev.worker == t.frozen {
			t.lateSeen = true
		}
		switch {
		case ev.Accepted != nil && *ev.Accepted && ev.worker != t.frozen:
			// Not the frozen worker: its lease was declared lost on its own
			// clock (on a loaded machine a slow round trip can use up a
			// short TTL's trust window) but nobody had claimed the job
			// since, so its fence was still the row's highest and the guard
			// rightly let the write through. The fence protects against
			// newer holders, and there was none.
			t.lateUnclaimed++
			t.printf(who, ev.Job, "late write with fence %d accepted: no newer holder had claimed the job (its fence was still the highest)", ev.Fence)
		case ev.Accepted != nil && *ev.Accepted:
			t.lateOK++
			t.printf(who, ev.Job, "late write with fence %d ACCEPTED — this must not happen", ev.Fence)
		default:
			t.lateNo++
			t.printf(who, ev.Job, "late write with fence %d REFUSED by the fenced UPDATE (the row holds fence %d) ✔", ev.Fence, ev.RowFence)
		}
	case "wait_timeout":
		t.printf(who, ev.Job, "gave up waiting; trying the next job")
	case "error":
		t.errs = append(t.errs, who+": "+ev.Msg)
		t.printf(who, ev.Job, "error: %s", ev.Msg)
	case "stopped":
		t.printf(who, "", "stopped")
	case "log":
		t.printf(who, "", "| %s", ev.Msg)
	default:
		t.printf(who, ev.Job, "%s", ev.Ev)
	}
}

// holding names one holding of a job: its fence.
func holding(job string, fence int64) string { return job + "#" + strconv.FormatInt(fence, 10) }

// hbNote says how many heartbeat extends the holding ev ends had.
func (t *timeline) hbNote(ev event) string {
	n := t.hb[holding(ev.Job, ev.Fence)]
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" · heartbeat renewed its lease %d×", n)
}

func (t *timeline) signalAll(sig syscall.Signal) {
	for _, wk := range t.ws {
		if wk.exited {
			continue
		}
		if wk.frozen {
			_ = wk.cmd.Process.Signal(syscall.SIGCONT)
			wk.frozen = false
		}
		_ = wk.cmd.Process.Signal(sig)
	}
}

// stopAll makes sure no worker outlives the demo: SIGCONT and SIGKILL
// whatever has not exited, then drain the events until all have.
func (t *timeline) stopAll() {
	left := 0
	for _, wk := range t.ws {
		if !wk.exited {
			left++
			_ = wk.cmd.Process.Signal(syscall.SIGCONT)
			_ = wk.cmd.Process.Kill()
		}
	}
	for left > 0 {
		if ev := <-t.evs; ev.Ev == "exited" {
			t.ws[ev.worker].exited = true
			left--
		}
	}
}

func (t *timeline) summary(ctx context.Context, pool *pgxpool.Pool, jobs []string, took time.Duration) error {
	w := t.w
	fmt.Fprintf(w, "\n== Summary (%.1f s) ==\n", took.Seconds())
	fmt.Fprintf(w, "jobs done (result written under the lock): %d\n", t.done)
	if len(t.handoffs) > 0 {
		s := slices.Clone(t.handoffs)
		slices.Sort(s)
		fmt.Fprintf(w, "handoffs to a waiting worker: %d (release → waiter's acquire: median %d ms, max %d ms)\n", len(s), s[len(s)/2], s[len(s)-1])
	} else {
		fmt.Fprintln(w, "handoffs to a waiting worker: 0")
	}
	fmt.Fprintf(w, "takeovers after an expired lease: %d\n", t.takeovers)
	fmt.Fprintf(w, "heartbeat extends seen: %d\n", t.extends)
	fmt.Fprintln(w, "fences per job (strictly increasing):")
	for _, j := range jobs {
		fs := make([]string, len(t.fences[j]))
		for i, f := range t.fences[j] {
			fs[i] = strconv.FormatInt(f, 10)
		}
		fmt.Fprintf(w, "  %-6s %s\n", j, strings.Join(fs, " "))
	}
	if t.frozen >= 0 {
		fmt.Fprintf(w, "frozen worker %s: loss noticed %d ms after SIGCONT\n", t.ws[t.frozen].name, t.lostAfter.Milliseconds())
	}
	fmt.Fprintf(w, "late writes refused by the fence: %d, accepted: %d\n", t.lateNo+t.doneNo, t.lateOK)
	if t.lateUnclaimed > 0 {
		fmt.Fprintf(w, "late writes of leases declared lost early, accepted as nobody had claimed the job since: %d\n", t.lateUnclaimed)
	}
	rows, err := pool.Query(ctx, `SELECT id, coalesce(fence, 0), status, coalesce(worker, '') FROM `+jobsTable+` ORDER BY id`)
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "jobs table at the end (every row written with a fenced write):")
	fmt.Fprintf(w, "  %-6s %-6s %-12s %-7s %s\n", "job", "fence", "last state", "by", "runs completed")
	for rows.Next() {
		var id, status, wk string
		var fence int64
		if err := rows.Scan(&id, &fence, &status, &wk); err != nil {
			rows.Close()
			return err
		}
		fmt.Fprintf(w, "  %-6s %-6d %-12s %-7s %d\n", id, fence, status, wk, t.doneBy[id])
		if status == "running" {
			// Every worker has stopped: its last holder finished it or
			// marked it interrupted before releasing.
			t.errs = append(t.errs, fmt.Sprintf("%s: row still says running after every worker stopped", id))
		}
		if fs := t.fences[id]; len(fs) > 0 && fs[len(fs)-1] != fence {
			t.errs = append(t.errs, fmt.Sprintf("%s: row fence %d, last granted %d", id, fence, fs[len(fs)-1]))
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	switch {
	case t.frozen < 0 || !t.lostSeen:
		t.errs = append(t.errs, "the frozen worker's loss was not reported")
	case t.takeovers < 1:
		t.errs = append(t.errs, "no takeover with a higher fence")
	case t.lateNo < 1 || t.lateOK > 0:
		t.errs = append(t.errs, "the late write was not refused")
	case t.done < 1:
		t.errs = append(t.errs, "no job was done")
	}
	if len(t.errs) > 0 {
		return fmt.Errorf("demo failed: %s", strings.Join(t.errs, "; "))
	}
	fmt.Fprintln(w, "OK: one holder per job at a time, fences only grew, the paused worker learned of its loss and could not write.")
	return nil
}
