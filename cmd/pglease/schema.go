package main

import (
	"context"
	"flag"
	"fmt"
	iofs "io/fs"
	"path"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/pg/migrate"
)

func setupFlags(a *app, _ *flag.FlagSet) runFunc { return a.setup }

func (a *app) setup(ctx context.Context, args []string) error {
	if len(args) != 0 {
		return fail(exitUsage, "setup takes no arguments")
	}
	pool, st, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cctx, cancel := a.withTimeout(ctx)
	defer cancel()
	before, _, err := st.ReadVersion(cctx, "migrate.Version")
	if err != nil {
		return err
	}
	mg, err := migrate.New(pool, a.c.config())
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	if err := mg.Up(cctx); err != nil {
		return err
	}
	after, _, err := st.ReadVersion(cctx, "migrate.Version")
	if err != nil {
		return err
	}
	if after == before {
		fmt.Fprintf(a.stderr, "schema already at version %d\n", after)
	} else {
		fmt.Fprintf(a.stderr, "schema migrated from version %d to %d\n", before, after)
	}
	return nil
}

// migrateCmd is pglease migrate: the schema, or the design functions, to
// a version.
type migrateCmd struct {
	a             *app
	to            int
	drop, designs bool
}

func migrateFlags(a *app, fs *flag.FlagSet) runFunc {
	c := &migrateCmd{a: a}
	fs.IntVar(&c.to, "to", migrate.Latest, "target version (0 removes pglease's objects; SyncGuard's tables stay unless --drop-tables)")
	fs.BoolVar(&c.drop, "drop-tables", false, "at version 0, also drop SyncGuard's lock and fence counter tables (fence counters are lost)")
	fs.BoolVar(&c.designs, "designs", false, "migrate the optional design functions (email_to_lock_id, …) instead: --to 1 installs, --to 0 removes")
	return c.run
}

// check checks migrate's flags and arguments, without any I/O.
func (c *migrateCmd) check(args []string) error {
	if len(args) != 0 {
		return fail(exitUsage, "migrate takes no arguments")
	}
	if c.designs {
		if c.to != 0 && c.to != 1 && c.to != migrate.Latest {
			return fail(exitUsage, "--designs: --to must be 1 (install) or 0 (remove)")
		}
	} else if c.to < 0 || c.to > migrate.Latest {
		return fail(exitUsage, "--to must be 0..%d", migrate.Latest)
	}
	if c.drop && (c.to != 0 || c.designs) {
		return fail(exitUsage, "--drop-tables only with --to 0")
	}
	return nil
}

func (c *migrateCmd) run(ctx context.Context, args []string) error {
	a := c.a
	if err := c.check(args); err != nil {
		return err
	}
	pool, st, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cctx, cancel := a.withTimeout(ctx)
	defer cancel()
	if c.designs {
		return c.migrateDesigns(cctx, pool)
	}
	before, _, err := st.ReadVersion(cctx, "migrate.Version")
	if err != nil {
		return err
	}
	if err := a.migrateTo(cctx, pool, c.to, c.drop); err != nil {
		return err
	}
	fmt.Fprintf(a.stderr, "schema migrated from version %d to %d", before, c.to)
	if c.to == 0 && !c.drop {
		fmt.Fprint(a.stderr, " (SyncGuard's tables and fence counters kept)")
	}
	fmt.Fprintln(a.stderr)
	return nil
}

// migrateDesigns installs (--to 1) or removes (--to 0) the design
// functions.
func (c *migrateCmd) migrateDesigns(ctx context.Context, pool *pgxpool.Pool) error {
	file, what := "designs/migrations/0001_advisory_design_functions.up.sql", "installed"
	if c.to == 0 {
		file, what = "designs/migrations/0001_advisory_design_functions.down.sql", "removed"
	}
	sql, err := c.a.sqlFile(file)
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, sql); err != nil {
		return err
	}
	fmt.Fprintf(c.a.stderr, "design functions %s\n", what)
	return nil
}

// migrateTo runs migrate.Migrator.To on a connection of pool; with drop,
// that connection's session first sets pglease.drop_tables = 'on', which
// lets migration 1's down drop SyncGuard's tables.
func (a *app) migrateTo(ctx context.Context, pool *pgxpool.Pool, to int, drop bool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if drop {
		if _, err := conn.Exec(ctx, "SET pglease.drop_tables = 'on'"); err != nil {
			return err
		}
		defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "RESET pglease.drop_tables") }()
	}
	mg, err := migrate.New(conn, a.c.config())
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	return mg.To(ctx, to)
}

// sqlFile returns a file of migrate.SQL for the configured names.
func (a *app) sqlFile(name string) (string, error) {
	fsys, err := migrate.SQL(a.c.config())
	if err != nil {
		return "", fail(exitUsage, "%v", err)
	}
	b, err := iofs.ReadFile(fsys, name)
	return string(b), err
}

// buildVersion is the binary's version: its main module's version as the
// go command recorded it ("(devel)" when built from a checkout).
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// version prints the binary's version and the schema version it needs,
// without a database; with one (DATABASE_URL or --database-url), also
// the schema's version, exiting 5 when it is not current.
func versionFlags(a *app, _ *flag.FlagSet) runFunc { return a.version }

func (a *app) version(ctx context.Context, args []string) error {
	if len(args) != 0 {
		return fail(exitUsage, "version takes no arguments")
	}
	if err := a.checkLocal(); err != nil {
		return err
	}
	if a.c.url != "" {
		if _, err := a.checkCommon(); err != nil {
			return err
		}
	}
	fmt.Fprintf(a.stdout, "pglease %s\nneeds schema version %d\n", buildVersion(), migrate.Latest)
	if a.c.url == "" {
		fmt.Fprintln(a.stdout, "database schema version: not checked (no DATABASE_URL or --database-url)")
		return nil
	}
	pool, st, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cctx, cancel := a.withTimeout(ctx)
	defer cancel()
	v, from, err := st.ReadVersion(cctx, "migrate.Version")
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "database schema version %d", v)
	if v > 0 {
		fmt.Fprintf(a.stdout, " (serves pglease schema versions %d..%d)", from, v)
	}
	fmt.Fprintln(a.stdout)
	switch {
	case v >= migrate.Latest && from <= migrate.Latest:
		fmt.Fprintln(a.stdout, "status: current")
		return nil
	case v < migrate.Latest:
		fmt.Fprintln(a.stdout, "status: behind: run `pglease setup`")
	default:
		fmt.Fprintln(a.stdout, "status: newer than this pglease serves: upgrade pglease")
	}
	return fail(exitSchema, "")
}

// sqlCmd is pglease sql: the SQL of the schema, the migrations, the
// design functions or the roles.
type sqlCmd struct {
	a                                *app
	down                             bool
	owner, runtime, schema, database string
}

func sqlFlags(a *app, fs *flag.FlagSet) runFunc {
	c := &sqlCmd{a: a}
	fs.BoolVar(&c.down, "down", false, "migrations, designs: print the down SQL (newest first)")
	fs.StringVar(&c.owner, "owner", "", "roles: the owner role (with --runtime, --schema, --database: the grants ready to run; without: the psql script)")
	fs.StringVar(&c.runtime, "runtime", "", "roles: the runtime role")
	fs.StringVar(&c.schema, "schema", "", "roles: the schema holding the tables")
	fs.StringVar(&c.database, "database", "", "roles: the database")
	return c.run
}

func (c *sqlCmd) run(_ context.Context, args []string) error {
	a := c.a
	what := "schema"
	if len(args) > 1 {
		return fail(exitUsage, "sql takes at most one argument")
	}
	if len(args) == 1 {
		what = args[0]
	}
	fsys, err := migrate.SQL(a.c.config())
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	read := func(name string) string {
		b, _ := iofs.ReadFile(fsys, name) // every name here is one SQL returns
		return string(b)
	}
	switch what {
	case "schema":
		fmt.Fprint(a.stdout, read("schema.sql"))
	case "migrations", "designs":
		dir := "migrations"
		if what == "designs" {
			dir = "designs/migrations"
		}
		suffix := ".up.sql"
		if c.down {
			suffix = ".down.sql"
		}
		names, err := iofs.Glob(fsys, dir+"/*"+suffix) // sorted: oldest first
		if err != nil {
			return err
		}
		if c.down {
			slices.Reverse(names)
		}
		for _, n := range names {
			fmt.Fprintf(a.stdout, "-- %s\n%s\n", path.Base(n), read(n))
		}
	case "roles":
		if c.owner == "" && c.runtime == "" && c.schema == "" && c.database == "" {
			fmt.Fprint(a.stdout, read("roles.sql"))
			return nil
		}
		o, r, err := migrate.RolesSQL(c.owner, c.runtime, c.schema, c.database)
		if err != nil {
			return fail(exitUsage, "%v", err)
		}
		fmt.Fprintf(a.stdout, "-- step 1, before the schema (as an administrator)\n%s\n-- step 2, after the schema\n%s", o, strings.TrimLeft(r, "\n"))
	default:
		return fail(exitUsage, "sql: unknown %q (schema, migrations, designs, roles)", what)
	}
	return nil
}
