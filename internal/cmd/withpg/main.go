// Command withpg runs a command with DATABASE_URL pointing at a PostgreSQL
// database. When DATABASE_URL is already set it just runs the command; else
// it starts a throwaway cluster (internal/pgtest), runs the command with
// DATABASE_URL set to it, and stops and removes the cluster afterwards, also
// when the command fails or on Ctrl-C.
//
// With -pgbouncer transaction|session it also starts a throwaway PgBouncer
// in that pool mode in front of the server (the throwaway cluster's, or
// DATABASE_URL's) and sets PGBOUNCER_URL to DATABASE_URL's database
// through it, for benchmarks and examples that compare the two.
//
// Usage:
//
//	go run ./internal/cmd/withpg [-C dir] [-durable] [-log file] [-pgbouncer mode] [-max-connections n] -- command [args...]
//
// For example, one of the examples (a module of their own) on a throwaway
// server:
//
//	go run ./internal/cmd/withpg -C examples -- go run ./webhook
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/pglease/pglease/internal/pgtest"
)

func main() { os.Exit(run()) }

func run() int {
	durable := flag.Bool("durable", false, "keep fsync on (benchmarks, demo)")
	logPath := flag.String("log", "", "append the server log to this file")
	bouncer := flag.String("pgbouncer", "", "also start PgBouncer in this pool mode (transaction, session) and set PGBOUNCER_URL")
	dir := flag.String("C", "", "run the command in this directory (e.g. -C examples: the examples are a module of their own)")
	maxConns := flag.Int("max-connections", 0, "the throwaway server's max_connections (default 300; the bench's fleet scenario needs more from 50 workers)")
	flag.Parse()
	args := flag.Args()
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: withpg [-durable] [-log file] [-pgbouncer mode] [-max-connections n] -- command [args...]")
		return 2
	}
	env := os.Environ()
	var cluster *pgtest.Cluster
	if os.Getenv("DATABASE_URL") == "" {
		opts := pgtest.Options{Durable: *durable, MaxConnections: *maxConns}
		if *logPath != "" {
			f, err := os.OpenFile(*logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
			if err != nil {
				fmt.Fprintln(os.Stderr, "withpg:", err)
				return 2
			}
			defer f.Close()
			opts.Log = f
		}
		c, err := pgtest.Start(context.Background(), opts)
		if err != nil {
			fmt.Fprintln(os.Stderr, "withpg:", err)
			return 2
		}
		cluster = c
		defer cluster.Stop()
		fmt.Fprintf(os.Stderr, "withpg: throwaway PostgreSQL (%s) on 127.0.0.1:%d\n", c.BinDir, c.Port)
		env = append(env, "DATABASE_URL="+c.URL)
	}
	if *bouncer != "" {
		dbURL := os.Getenv("DATABASE_URL")
		if cluster != nil {
			dbURL = cluster.URL
		}
		b, err := pgtest.StartPgBouncer(context.Background(), dbURL, pgtest.BouncerOptions{PoolMode: *bouncer})
		if err != nil {
			fmt.Fprintln(os.Stderr, "withpg:", err)
			return 2
		}
		defer b.Stop()
		fmt.Fprintf(os.Stderr, "withpg: throwaway PgBouncer (%s mode) on 127.0.0.1:%d\n", b.PoolMode, b.Port)
		env = append(env, "PGBOUNCER_URL="+b.URL)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = env
	cmd.Dir = *dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "withpg:", err)
		return 2
	}
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s) // pass it on; cleanup runs when the child exits
		}
	}()
	err := cmd.Wait()
	signal.Stop(sigs)
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		if exitErr.ExitCode() < 0 {
			return 1
		}
		return exitErr.ExitCode()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "withpg:", err)
		return 1
	}
	return 0
}
