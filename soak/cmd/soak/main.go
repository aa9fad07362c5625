// Command soak runs pglease's fault soak (see the README of
// soak): W worker processes with their own Managers, each through
// its own fault proxy, over K contended keys, while faults hit the
// network, the processes and the server; then it checks the logs.
//
//	soak run   [flags]   run a soak and check it (default)
//	soak check -dir DIR  check a finished run again
//	soak worker …        one worker process (started by run)
//	soak burn -cpu N     a CPU burner (started by run)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/pglease/pglease/soak/check"
	"github.com/pglease/pglease/soak/driver"
	"github.com/pglease/pglease/soak/event"
	"github.com/pglease/pglease/soak/worker"
)

func main() {
	args := os.Args[1:]
	sub := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "run":
		os.Exit(runCmd(args))
	case "check":
		os.Exit(checkCmd(args))
	case "worker":
		os.Exit(workerCmd(args))
	case "burn":
		fs := flag.NewFlagSet("burn", flag.ExitOnError)
		cpu := fs.Int("cpu", 0, "CPU to burn")
		_ = fs.Parse(args)
		driver.Burn(*cpu)
	default:
		fmt.Fprintf(os.Stderr, "soak: unknown subcommand %q (run, check, worker, burn)\n", sub)
		os.Exit(2)
	}
}

func runCmd(args []string) int {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	var o driver.Options
	fs.StringVar(&o.Dir, "dir", "", "run directory (default: a new directory under $TMPDIR)")
	fs.DurationVar(&o.Duration, "duration", 30*time.Minute, "longest faults phase; the run ends earlier once -cycles and -faults are reached")
	fs.Int64Var(&o.Cycles, "cycles", 100000, "lease lock cycles to reach (0: run for -duration)")
	fs.IntVar(&o.Faults, "faults", 1000, "faults to reach (0: run for -duration)")
	fs.DurationVar(&o.Tail, "tail", 0, "quiet time after the last fault (default TTL+3s)")
	fs.IntVar(&o.Workers, "workers", 8, "worker processes")
	fs.IntVar(&o.Keys, "keys", 12, "contended lease keys")
	fs.IntVar(&o.AdvKeys, "adv-keys", 4, "contended advisory keys")
	fs.IntVar(&o.LeaseG, "lease-g", 3, "lease goroutines per worker")
	fs.IntVar(&o.AdvG, "adv-g", 1, "advisory goroutines per worker")
	fs.IntVar(&o.PrimG, "prim-g", 1, "goroutines per worker running the other primitives: semaphore permits, readers and writers, all-or-nothing sets (0: none)")
	fs.IntVar(&o.SemKeys, "sem-keys", 2, "semaphore keys (permits taken with manager.WithLimit; one cycle in ten takes the key exclusively)")
	fs.IntVar(&o.SemLimit, "sem-limit", 3, "the semaphores' limit N")
	fs.IntVar(&o.RWKeys, "rw-keys", 1, "reader-writer keys (readers: manager.Shared; writers: Acquire)")
	fs.Float64Var(&o.RWWriters, "rw-writers", 0.2, "share of reader-writer cycles that are writers")
	fs.IntVar(&o.SetKeys, "set-keys", 5, "keys in the pool all-or-nothing sets (AcquireAll of 2–3 keys) draw from")
	fs.DurationVar(&o.PrimHold, "prim-hold", 300*time.Millisecond, "the primitives' holds: uniform [0, prim-hold)")
	fs.DurationVar(&o.PrimPause, "prim-pause", 200*time.Millisecond, "the primitives' pause between cycles: uniform [0, prim-pause)")
	fs.BoolVar(&o.Fair, "fair", false, "every worker's Manager runs with FairQueue (waiters served in arrival order across processes; the fair-order check applies)")
	fs.DurationVar(&o.TTL, "ttl", time.Second, "lease TTL")
	fs.DurationVar(&o.Margin, "margin", 0, "Manager LossMargin (0: the library default, TTL/10)")
	fs.DurationVar(&o.AcquireTimeout, "acquire-timeout", 2*time.Second, "Acquire wait bound")
	fs.DurationVar(&o.MaxHold, "max-hold", 10*time.Millisecond, "short holds: uniform [0, max-hold)")
	fs.Float64Var(&o.LongHold, "long-hold", 0.02, "probability of a long hold (1.5–3 TTL, auto-extended)")
	fs.DurationVar(&o.CloseTimeout, "close-timeout", 5*time.Second, "Manager CloseTimeout")
	fs.DurationVar(&o.FaultEvery, "fault-every", 1300*time.Millisecond, "mean interval between fault starts")
	mix := fs.String("mix", driver.DefaultMix, "fault types and weights")
	fs.IntVar(&o.Pooled, "pooled", 0, "workers whose pool goes through a PgBouncer (transaction mode) the driver starts (0: half of them when a pool fault is in the mix; -1: none)")
	fs.BoolVar(&o.RoundRobin, "round-robin", false, "start the fault types in turn instead of drawing them by weight")
	seed := fs.Uint64("seed", 0, "seed (0: from the clock; printed)")
	fs.StringVar(&o.Broken, "broken", "", "negative control: a broken mode, e.g. no-fence:0 (see soak/README.md)")
	bin := fs.String("worker-bin", "", "soak binary for workers and burners (default: this one; build it with -race to race-check the workers)")
	_ = fs.Parse(args)
	var err error
	if o.Mix, err = driver.ParseMix(*mix); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 2
	}
	o.Seed = *seed
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	o.Command = replayCommand(fs, o.Seed)
	if o.Dir == "" {
		o.Dir, err = os.MkdirTemp("", "pglease-soak-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			return 2
		}
	}
	o.Bin = *bin
	if o.Bin == "" {
		if o.Bin, err = os.Executable(); err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			return 2
		}
	}
	o.Log = func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "soak: "+format+"\n", a...)
	}
	fmt.Fprintf(os.Stderr, "soak: seed %d (replay: add -seed %d); run directory %s\n", o.Seed, o.Seed, o.Dir)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := driver.Run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 1
	}
	return report(o.Dir)
}

func report(dir string) int {
	rep, err := check.Run(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak: check:", err)
		return 1
	}
	fmt.Print(rep.Markdown())
	_ = os.WriteFile(filepath.Join(dir, "report.md"), []byte(rep.Markdown()), 0o644)
	code := 0
	if rep.Violations() > 0 {
		fmt.Fprintf(os.Stderr, "soak: %d violations (details in %s)\n", rep.Violations(), filepath.Join(dir, "violations.txt"))
		code = 1
	}
	if !rep.TargetsReached() {
		fmt.Fprintf(os.Stderr, "soak: targets not reached within -duration: %d of %d lease cycles, %d of %d faults\n",
			rep.LeaseGrants, rep.Meta.Cycles, rep.FaultCount(), rep.Meta.Faults)
		code = 1
	}
	return code
}

func checkCmd(args []string) int {
	fs := flag.NewFlagSet("check", flag.ExitOnError)
	dir := fs.String("dir", "", "run directory")
	_ = fs.Parse(args)
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "soak check: -dir is required")
		return 2
	}
	return report(*dir)
}

func workerCmd(args []string) int {
	fs := flag.NewFlagSet("worker", flag.ExitOnError)
	var c worker.Config
	fs.IntVar(&c.ID, "id", 0, "")
	fs.IntVar(&c.Inc, "inc", 0, "")
	fs.StringVar(&c.URL, "url", "", "")
	fs.StringVar(&c.ResURL, "res-url", "", "")
	fs.StringVar(&c.SessionURL, "session-url", "", "")
	fs.StringVar(&c.Log, "log", "", "")
	fs.IntVar(&c.Keys, "keys", 8, "")
	fs.IntVar(&c.AdvKeys, "adv-keys", 3, "")
	fs.IntVar(&c.LeaseG, "lease-g", 2, "")
	fs.IntVar(&c.AdvG, "adv-g", 1, "")
	fs.DurationVar(&c.TTL, "ttl", 2*time.Second, "")
	fs.DurationVar(&c.Margin, "margin", 0, "")
	fs.DurationVar(&c.AcquireTimeout, "acquire-timeout", 5*time.Second, "")
	fs.DurationVar(&c.MaxHold, "max-hold", 20*time.Millisecond, "")
	fs.Float64Var(&c.LongHold, "long-hold", 0.02, "")
	fs.DurationVar(&c.CloseTimeout, "close-timeout", 5*time.Second, "")
	fs.Uint64Var(&c.Seed, "seed", 1, "")
	fs.StringVar(&c.Broken, "broken", "", "")
	fs.IntVar(&c.PrimG, "prim-g", 0, "")
	fs.IntVar(&c.SemKeys, "sem-keys", 0, "")
	fs.IntVar(&c.SemLimit, "sem-limit", 3, "")
	fs.IntVar(&c.RWKeys, "rw-keys", 0, "")
	fs.Float64Var(&c.RWWriters, "rw-writers", 0.2, "")
	fs.IntVar(&c.SetKeys, "set-keys", 0, "")
	fs.DurationVar(&c.PrimHold, "prim-hold", 300*time.Millisecond, "")
	fs.DurationVar(&c.PrimPause, "prim-pause", 200*time.Millisecond, "")
	fs.BoolVar(&c.Fair, "fair", false, "")
	_ = fs.Parse(args)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	dumpOnSIGUSR1()
	if err := worker.Run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "soak worker:", err)
		return 1
	}
	return 0
}

// dumpOnSIGUSR1 writes every goroutine's stack to stderr on SIGUSR1, so a
// stalled worker can be looked at without ending it
// (kill -USR1 <pid>; the pids are in driver.jsonl's spawn events).
// It starts before the worker's goroutine-leak baseline.
func dumpOnSIGUSR1() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	go func() {
		for range ch {
			fmt.Fprintf(os.Stderr, "=== goroutine dump (SIGUSR1) at CLOCK_MONOTONIC %d\n", event.Now())
			_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
		}
	}()
}

// replayCommand is the command that replays this run, for the report:
// `make soak` with the flags given (not -dir, -worker-bin) and the seed.
func replayCommand(fs *flag.FlagSet, seed uint64) string {
	var flags []string
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "dir", "worker-bin", "seed":
			return
		}
		v := f.Value.String()
		if f.Name == "mix" || strings.ContainsAny(v, " ,=") {
			v = "'" + v + "'"
		}
		flags = append(flags, "-"+f.Name+" "+v)
	})
	flags = append(flags, fmt.Sprintf("-seed %d", seed))
	return `make soak SOAKFLAGS="` + strings.Join(flags, " ") + `"`
}
