// Command pglease is the operator's tool for pglease's locks: who holds
// what (exclusively or shared), since when, who waits or watches, revoke a
// stuck lock safely, and set up or migrate the schema.
//
//	go install github.com/pglease/pglease/cmd/pglease@latest
//
// Usage:
//
//	pglease [flags] COMMAND [command flags] [args]
//
// Commands:
//
//	status          every lease and every advisory lock, with waiters (acquires in
//	                progress, waiting Managers); shared holds (readers, semaphore
//	                permits with their limit), keys marked exclusive waiting or
//	                under a lock delay, each key's fair queue in order (position,
//	                holder, mode, since when), watching Managers, guarded tables; which
//	                parts of the schema are missing (the lease tables, the parts of
//	                schema version 4) and whether the optional release trigger is
//	                installed: advisory locks are shown without any lease table;
//	                --json, --watch
//	inspect KEY     one key: exclusive holder, fence, fence counter, expiry, shared
//	                holds, exclusive waiting, lock delay, its fair queue in order,
//	                acquires and Managers waiting, Managers watching, guarded tables
//	release         revoke a lease (--key or --lock-id: its holder's Manager is
//	                told at once, ErrRevoked; --delay D keeps the key free for D),
//	                ask a key's holders to release it (--key K --request: nothing
//	                deleted), or end an advisory holder's session (--pid); asks for
//	                confirmation unless --yes
//	setup           bring the schema to the version this pglease needs (SetupSchema)
//	migrate         migrate the schema up or down (--to N; --designs for the
//	                optional design functions; --drop-tables to drop SyncGuard's tables at 0)
//	version         this pglease's version and the schema version it needs; with a
//	                database, the schema's version and whether it is current
//	sql             print SQL: schema (default), migrations, designs, roles
//	doctor          check what operators get wrong: server version, schema version,
//	                the runtime role's privileges (--role), the release trigger,
//	                the LISTEN path (--listen-url), replication, the clock offset;
//	                each finding with what to do (--json)
//	serve           a live page of holders, waiters in order, hold times, contention
//	                over the last minutes and events (hand-overs, expiries,
//	                revocations), on 127.0.0.1:7432 by default; read-only unless
//	                --allow-revoke with a token; key hashes unless --show-keys
//
// Flags for every command (before or after it):
//
//	--database-url URL   a pgx connection string (default $DATABASE_URL)
//	--lock-table NAME    default syncguard_locks
//	--fence-table NAME   default syncguard_fence_counters
//	--timeout D          bound on each command's database work (default 10s)
//
// Data goes to stdout, progress and errors to stderr; release writes one
// audit record (a JSON slog line) to stderr: action revoke_lease,
// request_release or terminate_backend. Keys are shown as
// pglease.HashKey hashes unless --show-keys; lockIds are never shown. The
// connection string and its password are never printed: not as a flag's
// default, not in an error.
//
// Every flag is checked before the command connects: a bad one is exit 2
// without any connection.
//
// Exit codes:
//
//	0  done
//	1  failed (database unreachable, SQL error, …)
//	2  usage: bad flags or arguments
//	3  not found: inspect found neither a lease row nor a shared hold of the
//	   key; release found no such live lease or lock (or, with --request,
//	   nobody holding the key), or it ended meanwhile
//	4  refused: release not confirmed, the lease is unexpired and --force is
//	   missing, or the key changed hands after it was shown (nothing revoked)
//	5  the schema is not at the version this pglease needs, or its tables are
//	   missing: run pglease setup (version, status, inspect, release, doctor)
//	6  doctor: a finding worth a look (warn), nothing broken
//	7  doctor: something to fix (fail); what to do is printed with it
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// Exit codes.
const (
	exitOK       = 0
	exitFailed   = 1
	exitUsage    = 2
	exitNotFound = 3
	exitRefused  = 4
	exitSchema   = 5
)

// exitError carries an exit code and a message for stderr.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func fail(code int, format string, args ...any) error {
	return &exitError{code: code, msg: fmt.Sprintf(format, args...)}
}

// common holds the flags every command takes.
type common struct {
	url, lockTable, fenceTable string
	timeout                    time.Duration
}

// secretString is a string flag that is never printed: its String is
// empty, so a usage message shows no default (the connection string's
// password would be in it).
type secretString struct{ p *string }

func (s secretString) String() string { return "" }

func (s secretString) Set(v string) error { *s.p = v; return nil }

func (c *common) register(fs *flag.FlagSet) {
	fs.Var(secretString{&c.url}, "database-url", "pgx connection string `URL` (default $DATABASE_URL; never printed)")
	fs.StringVar(&c.lockTable, "lock-table", c.lockTable, "lock table, ident or schema.ident")
	fs.StringVar(&c.fenceTable, "fence-table", c.fenceTable, "fence counter table, ident or schema.ident")
	fs.DurationVar(&c.timeout, "timeout", c.timeout, "bound on the command's database work")
}

func (c *common) config() pg.Config {
	return pg.Config{LockTable: c.lockTable, FenceTable: c.fenceTable}
}

// app is one run of the command.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	c              common
	isTerminal     bool // stdout is a terminal (status --watch clears the screen)
	stdinTerminal  bool // stdin is a terminal (confirmations are typed and echoed)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a := &app{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, isTerminal: isTerminal(os.Stdout), stdinTerminal: isTerminal(os.Stdin)}
	os.Exit(a.run(ctx, os.Args[1:]))
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func (a *app) run(ctx context.Context, args []string) int {
	a.c = common{url: os.Getenv("DATABASE_URL"), timeout: 10 * time.Second}
	fs := flag.NewFlagSet("pglease", flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	fs.Usage = func() { fmt.Fprint(a.stderr, usage()) }
	a.c.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fmt.Fprint(a.stderr, usage())
		return exitUsage
	}
	cmd, ok := lookup(rest[0])
	if !ok {
		fmt.Fprintf(a.stderr, "pglease: unknown command %q\n\n%s", rest[0], usage())
		return exitUsage
	}
	err := a.runCommand(ctx, cmd, rest[1:])
	if err == nil {
		return exitOK
	}
	code, msg := exitFailed, err.Error()
	var ee *exitError
	if errors.As(err, &ee) {
		code, msg = ee.code, ee.msg
	} else if m, ok := schemaProblem(err); ok {
		code, msg = exitSchema, m
	}
	if msg != "" {
		fmt.Fprintln(a.stderr, "pglease:", scrub(strings.TrimPrefix(msg, "pglease: "), passwords(a.c.url)))
	}
	return code
}

// howToSetup is what to run when the schema is missing or behind.
const howToSetup = "run `pglease setup` (as a role that may create tables and functions; `pglease sql` prints the SQL to apply by hand)"

// schemaProblem reports whether err says the pglease schema is missing
// or not at the version this pglease needs, and what to tell the
// operator then: its tables or functions do not exist (SQLSTATE 42P01,
// 42883, 3F000) or the schema version is wrong (a SchemaError).
func schemaProblem(err error) (string, bool) {
	var se *store.SchemaError
	if errors.As(err, &se) {
		if se.Found > se.Want {
			return fmt.Sprintf("the schema is at version %d (serving pglease schema versions %d..%d), newer than this pglease serves (it needs %d): upgrade pglease",
				se.Found, se.CompatibleFrom, se.Found, se.Want), true
		}
		return fmt.Sprintf("the schema is at version %d, this pglease needs version %d: %s", se.Found, se.Want, howToSetup), true
	}
	var st interface {
		error
		SQLState() string
	}
	if errors.As(err, &st) {
		switch st.SQLState() {
		case "42P01", "42883", "3F000": // undefined table, function, schema
			return fmt.Sprintf("pglease's tables or functions are missing (%v): %s", st, howToSetup), true
		}
	}
	return "", false
}

// flags returns a FlagSet for command name with the common flags.
func (a *app) flags(name, args string) *flag.FlagSet {
	fs := flag.NewFlagSet("pglease "+name, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	fs.Usage = func() {
		fmt.Fprintf(a.stderr, "usage: pglease %s [flags] %s\n\nflags:\n", name, args)
		fs.PrintDefaults()
	}
	a.c.register(fs)
	return fs
}

// parse parses a command's flags, which may come before, between or
// after its arguments ("--" ends the flags); the arguments are then in
// fs.Args(). A bad flag is exitUsage (flag already printed why), -h is
// exitOK.
func parse(fs *flag.FlagSet, args []string) error {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return &exitError{code: exitOK}
			}
			return &exitError{code: exitUsage}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			pos = append(pos, rest...) // everything after "--" is an argument
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	// Leave the arguments in fs.Args().
	_ = fs.Parse(append([]string{"--"}, pos...))
	return nil
}

// checkCommon checks the common flags, the connection string included,
// without any I/O: a bad one is exitUsage. Every command that connects
// calls it (through connect) after checking its own flags.
func (a *app) checkCommon() (*pgxpool.Config, error) {
	if err := a.checkLocal(); err != nil {
		return nil, err
	}
	if a.c.url == "" {
		return nil, fail(exitUsage, "no database: set DATABASE_URL or --database-url")
	}
	if err := checkAuthority(a.c.url); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(a.c.url)
	if err != nil {
		return nil, fail(exitUsage, "bad connection string: %s", parseReason(err))
	}
	cfg.MaxConns = 2
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "pglease-cli"
	}
	return cfg, nil
}

// checkLocal checks the common flags but the connection string.
func (a *app) checkLocal() error {
	if a.c.timeout <= 0 {
		return fail(exitUsage, "--timeout must be positive")
	}
	if _, err := migrate.SQL(a.c.config()); err != nil { // validates the table names
		return fail(exitUsage, "%v", err)
	}
	return nil
}

// connect opens a pool (two connections at most) and a Store; it checks
// the connection at once so a wrong URL fails here, with a clear message.
func (a *app) connect(ctx context.Context) (*pgxpool.Pool, *store.Store, error) {
	cfg, err := a.checkCommon()
	if err != nil {
		return nil, nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fail(exitFailed, "cannot connect: %v", err)
	}
	pctx, cancel := context.WithTimeout(ctx, a.c.timeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, nil, fail(exitFailed, "cannot connect to the database: %v", err)
	}
	st, err := store.New("pg.New", pool, store.Config(a.c.config()))
	if err != nil {
		pool.Close()
		return nil, nil, fail(exitUsage, "%v", err)
	}
	return pool, st, nil
}

// withTimeout bounds one command's database work.
func (a *app) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.c.timeout)
}
