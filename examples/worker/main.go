// Command worker is one of the processes examples/demo starts: it takes
// job keys one after another through a manager.Manager, holds each with
// auto-heartbeat while it works, and writes the job's row in a jobs table
// with fenced writes (pg.FenceGuard). It prints one JSON object per line
// on stdout for the demo to merge into its timeline; it never prints a
// lockId.
//
// Run it alone with:
//
//	DATABASE_URL=postgres://… go run ./worker -id w1 -jobs job-1,job-2
//
// (the demo creates the tables; see examples/demo).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
)

// Event is one line of a worker's output.
type Event struct {
	Ev          string `json:"ev"` // ready, acquired, extended, done, released, lost, late_write, wait_timeout, error, stopped
	Job         string `json:"job,omitempty"`
	Fence       int64  `json:"fence,omitempty"`
	WaitMs      int64  `json:"wait_ms,omitempty"`       // acquired: how long Acquire waited
	ExpiresInMs int64  `json:"expires_in_ms,omitempty"` // extended: the lease's remaining time
	Accepted    *bool  `json:"accepted,omitempty"`      // done, late_write: the fenced write's outcome
	RowFence    int64  `json:"row_fence,omitempty"`     // late_write: the fence the row holds
	Msg         string `json:"msg,omitempty"`
}

// Config is a worker's configuration (its flags).
type Config struct {
	ID               string
	Jobs             []string
	Start            int // index in Jobs of the first job to take
	TTL              time.Duration
	WorkMin, WorkMax time.Duration
	Table            string // the jobs table: id text primary key, fence bigint, status text, worker text, updated_at timestamptz
	KeyPrefix        string // lock key = KeyPrefix + job
}

func main() {
	var cfg Config
	var jobs string
	flag.StringVar(&cfg.ID, "id", "w1", "worker name")
	flag.StringVar(&jobs, "jobs", "job-1,job-2,job-3", "comma-separated job ids")
	flag.IntVar(&cfg.Start, "start", 0, "index of the first job to take")
	flag.DurationVar(&cfg.TTL, "ttl", 2*time.Second, "lease TTL (auto-extended)")
	flag.DurationVar(&cfg.WorkMin, "work-min", 3*time.Second, "shortest job")
	flag.DurationVar(&cfg.WorkMax, "work-max", 4*time.Second, "longest job")
	flag.StringVar(&cfg.Table, "table", "pglease_demo_jobs", "jobs table")
	flag.StringVar(&cfg.KeyPrefix, "key-prefix", "demo:", "lock key prefix")
	flag.Parse()
	cfg.Jobs = strings.Split(jobs, ",")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, os.Getenv("DATABASE_URL"), cfg); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

type emitter struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (e *emitter) emit(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	_ = e.enc.Encode(ev)
}

func ptr[T any](v T) *T { return &v }

// run takes jobs until ctx ends. It returns nil on a clean shutdown.
func run(ctx context.Context, w io.Writer, url string, cfg Config) error {
	if url == "" {
		return errors.New("DATABASE_URL is not set")
	}
	if len(cfg.Jobs) == 0 || cfg.TTL <= 0 || cfg.WorkMin <= 0 || cfg.WorkMax < cfg.WorkMin {
		return errors.New("bad configuration")
	}
	out := &emitter{enc: json.NewEncoder(w)}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := manager.New(pool, manager.Config{TTL: cfg.TTL, AcquireTimeout: 4*cfg.TTL + 4*time.Second})
	if err != nil {
		return err
	}
	defer m.Close(context.Background())
	store, err := pg.New(pool, pg.Config{})
	if err != nil {
		return err
	}
	guard, err := pg.NewFenceGuard(cfg.Table, "id", "fence")
	if err != nil {
		return err
	}
	out.emit(Event{Ev: "ready"})
	for i := cfg.Start; ctx.Err() == nil; i++ {
		job := cfg.Jobs[i%len(cfg.Jobs)]
		if err := doJob(ctx, out, pool, m, store, guard, cfg, job); err != nil {
			if ctx.Err() != nil {
				break
			}
			out.emit(Event{Ev: "error", Job: job, Msg: err.Error()})
			select { // do not spin on a persistent error
			case <-time.After(cfg.TTL / 2):
			case <-ctx.Done():
			}
		}
	}
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = m.Close(cctx)
	out.emit(Event{Ev: "stopped"})
	return err
}

// doJob takes one job's lock, claims its row, works in steps while the
// lock is held, and writes the result, all under the lock's fence.
func doJob(ctx context.Context, out *emitter, pool *pgxpool.Pool, m *manager.Manager, store *pg.Store, guard *pg.FenceGuard, cfg Config, job string) error {
	key := cfg.KeyPrefix + job
	start := time.Now()
	lk, err := m.Acquire(ctx, key, manager.WithTTL(cfg.TTL))
	if pglease.CodeOf(err) == pglease.CodeAcquisitionTimeout {
		out.emit(Event{Ev: "wait_timeout", Job: job})
		return nil
	}
	if err != nil {
		return err
	}
	waited := time.Since(start)
	fence := lk.Fence()
	// Claim the row first: from now on every older holder's write is refused.
	// The claim is not cut short by a shutdown (ctx): a write cancelled in
	// flight may still commit, and the job's row would then say "running"
	// with nobody to finish it. The work loop below sees the shutdown at
	// once and records the job as interrupted.
	cctx, cancelClaim := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	ok, err := guard.Upsert(cctx, pool, job, fence,
		pg.Set{Column: "status", Value: "running"}, pg.Set{Column: "worker", Value: cfg.ID}, pg.Set{Column: "updated_at", Value: time.Now()})
	cancelClaim()
	if err != nil || !ok {
		_ = lk.Release(context.WithoutCancel(ctx))
		if err == nil {
			err = errors.New("claim refused: the row carries a newer fence")
		}
		return err
	}
	out.emit(Event{Ev: "acquired", Job: job, Fence: int64(fence), WaitMs: waited.Milliseconds()})

	// Report extends: watch the lease's expiry in the lock table.
	wctx, stopWatch := context.WithCancel(lk.Context())
	var watch sync.WaitGroup
	watch.Go(func() { watchExtends(wctx, out, store, key, job, fence) })

	// Work in steps of 100 ms: a process paused in the middle (SIGSTOP)
	// does not "finish" its work just because wall time passed.
	work := cfg.WorkMin + rand.N(cfg.WorkMax-cfg.WorkMin+1)
	steps := int(work / (100 * time.Millisecond))
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	outcome := "done"
	for n := 0; n < steps && outcome == "done"; {
		select {
		case <-tick.C:
			n++
		case <-lk.Done():
			outcome = "lost"
		case <-ctx.Done():
			outcome = "shutdown"
		}
	}
	stopWatch()
	watch.Wait()
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()

	switch outcome {
	case "done":
		ok, err := guard.Update(bg, pool, job, fence,
			pg.Set{Column: "status", Value: "done"}, pg.Set{Column: "worker", Value: cfg.ID}, pg.Set{Column: "updated_at", Value: time.Now()})
		if err != nil {
			return err
		}
		out.emit(Event{Ev: "done", Job: job, Fence: int64(fence), Accepted: ptr(ok)})
		if err := lk.Release(bg); err != nil {
			out.emit(Event{Ev: "lost", Job: job, Fence: int64(fence), Msg: describe(err)})
			return nil
		}
		out.emit(Event{Ev: "released", Job: job, Fence: int64(fence)})
	case "lost":
		out.emit(Event{Ev: "lost", Job: job, Fence: int64(fence), Msg: describe(lk.Err())})
		// Deliberately write anyway, as a worker that missed the signal
		// (paused between its check and its write) would: the fence,
		// not the signal, is what protects the row.
		ok, err := guard.Update(bg, pool, job, fence,
			pg.Set{Column: "status", Value: "done (late)"}, pg.Set{Column: "worker", Value: cfg.ID}, pg.Set{Column: "updated_at", Value: time.Now()})
		if err != nil {
			return err
		}
		var rowFence int64
		_ = pool.QueryRow(bg, "SELECT coalesce(fence, 0) FROM "+cfg.Table+" WHERE id = $1", job).Scan(&rowFence)
		out.emit(Event{Ev: "late_write", Job: job, Fence: int64(fence), Accepted: ptr(ok), RowFence: rowFence})
		_ = lk.Release(bg) // answers LockLost; stops nothing that still runs
	case "shutdown":
		// Record that the job stopped unfinished, so the row does not
		// claim it is still running, then release.
		if _, err := guard.Update(bg, pool, job, fence,
			pg.Set{Column: "status", Value: "interrupted"}, pg.Set{Column: "worker", Value: cfg.ID}, pg.Set{Column: "updated_at", Value: time.Now()}); err != nil {
			out.emit(Event{Ev: "error", Job: job, Msg: err.Error()})
		}
		_ = lk.Release(bg)
		out.emit(Event{Ev: "released", Job: job, Fence: int64(fence), Msg: "shutdown: job interrupted"})
	}
	return nil
}

// watchExtends polls the lease record and reports each move of its
// expiry while this worker's fence holds the key.
func watchExtends(ctx context.Context, out *emitter, store *pg.Store, key, job string, fence pglease.Fence) {
	var last time.Time
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		info, err := store.Lookup(ctx, key)
		if err != nil || info == nil || info.Fence != fence {
			continue
		}
		if !last.IsZero() && info.ExpiresAt.After(last) && ctx.Err() == nil {
			out.emit(Event{Ev: "extended", Job: job, Fence: int64(fence), ExpiresInMs: time.Until(info.ExpiresAt).Milliseconds()})
		}
		last = info.ExpiresAt
	}
}

// describe is a short, safe description of a lock's end (no key, no lockId).
func describe(err error) string {
	if err == nil {
		return ""
	}
	var e *pglease.Error
	if errors.As(err, &e) {
		return fmt.Sprintf("%s: %s", e.Code, e.Msg)
	}
	return err.Error()
}
