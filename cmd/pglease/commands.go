package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
)

// runFunc runs a command with its arguments, once its flags are parsed.
type runFunc func(ctx context.Context, args []string) error

// command is one subcommand. The table of them (commands) drives both the
// dispatch and the help.
type command struct {
	name string
	// args is the synopsis of its arguments, for its usage line:
	// "usage: pglease NAME [flags] ARGS".
	args string
	// title is its entry's left column in the help (name by default).
	title string
	// summary is its entry in the help: the first line beside the title,
	// the others below it; none hides the command.
	summary []string
	// flags registers the command's own flags on fs (the common flags are
	// there already) and returns the run that reads them; nil for a
	// command that takes no flags and ignores its arguments (help).
	flags func(a *app, fs *flag.FlagSet) runFunc
}

// commands are the subcommands, in the order help lists them.
var commands = []command{
	{name: "status", flags: statusFlags, summary: []string{
		"every lease and every advisory lock, with waiters and waiting Managers,",
		"shared holds, marks and lock delays, each key's fair queue in order,",
		"watching Managers, guarded tables, and the schema's missing parts",
		"(--json, --watch)"}},
	{name: "inspect", args: "KEY", title: "inspect KEY", flags: inspectFlags, summary: []string{
		"one key: exclusive holder, fence, fence counter, expiry, shared holds,",
		"exclusive waiting, lock delay, its fair queue in order, acquires and",
		"Managers waiting or watching"}},
	{name: "release", args: "(--key KEY | --lock-id ID | --pid PID)", flags: releaseFlags, summary: []string{
		"revoke a lease (--key K | --lock-id ID; its holder is told at once;",
		"--delay D: no grant for D), ask the holders to release (--key K --request),",
		"or end an advisory holder's session (--pid PID);",
		"confirmation or --yes; --force for a live lease"}},
	{name: "setup", flags: setupFlags, summary: []string{"bring the schema to the version this pglease needs"}},
	{name: "migrate", flags: migrateFlags, summary: []string{"migrate the schema (--to N, --designs, --drop-tables)"}},
	{name: "version", flags: versionFlags, summary: []string{"this pglease's version, the schema version it needs (and the database's)"}},
	{name: "sql", args: "[schema | migrations | designs | roles]", flags: sqlFlags, summary: []string{
		"print SQL: schema (default) | migrations [--down] | designs [--down] | roles"}},
	{name: "doctor", flags: doctorFlags, summary: []string{
		"check the server, schema, runtime role's privileges (--role), release trigger,",
		"LISTEN path (--listen-url), replication and clock; what to do for each (--json)"}},
	{name: "serve", flags: serveFlags, summary: []string{
		"a live page on 127.0.0.1:7432 (--addr): holders, waiters in order, contention,",
		"events; read-only unless --allow-revoke with a token (--token-file)"}},
	{name: "help"},
}

// lookup finds the command name.
func lookup(name string) (*command, bool) {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i], true
		}
	}
	return nil, false
}

// usageTail is the help after the commands: the common flags and the
// exit codes.
const usageTail = `
flags (before or after the command):
  --database-url URL   pgx connection string (default $DATABASE_URL)
  --lock-table NAME    lock table (default syncguard_locks)
  --fence-table NAME   fence counter table (default syncguard_fence_counters)
  --timeout D          bound on the database work (default 10s)

exit codes: 0 done, 1 failed, 2 usage, 3 not found, 4 refused, 5 schema missing or not current (run: pglease setup),
  6 doctor found something worth a look, 7 doctor found something to fix
`

// usage is the help: pglease help, and what a bad invocation prints.
func usage() string {
	var b strings.Builder
	b.WriteString("usage: pglease [flags] COMMAND [command flags] [args]\n\ncommands:\n")
	for _, c := range commands {
		for i, line := range c.summary {
			left := ""
			if i == 0 {
				left = c.title
				if left == "" {
					left = c.name
				}
			}
			fmt.Fprintf(&b, "  %-16s%s\n", left, line)
		}
	}
	b.WriteString(usageTail)
	return b.String()
}

// runCommand parses c's flags from args and runs it.
func (a *app) runCommand(ctx context.Context, c *command, args []string) error {
	if c.flags == nil {
		fmt.Fprint(a.stdout, usage())
		return nil
	}
	fs := a.flags(c.name, c.args)
	run := c.flags(a, fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	return run(ctx, fs.Args())
}
