package main

import (
	"context"
	"fmt"
	iofs "io/fs"
	"path"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/pg/migrate"
)

func (a *app) setup(ctx context.Context, args []string) error {
	fs := a.flags("setup", "")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
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

func (a *app) migrate(ctx context.Context, args []string) error {
	fs := a.flags("migrate", "")
	to := fs.Int("to", migrate.Latest, "target version (0 removes pglease's objects; SyncGuard's tables stay unless --drop-tables)")
	drop := fs.Bool("drop-tables", false, "at version 0, also drop SyncGuard's lock and fence counter tables (fence counters are lost)")
	designs := fs.Bool("designs", false, "migrate the optional design functions (email_to_lock_id, …) instead: --to 1 installs, --to 0 removes")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fail(exitUsage, "migrate takes no arguments")
	}
	if *designs {
		if *to != 0 && *to != 1 && *to != migrate.Latest {
			return fail(exitUsage, "--designs: --to must be 1 (install) or 0 (remove)")
		}
	} else if *to < 0 || *to > migrate.Latest {
		return fail(exitUsage, "--to must be 0..%d", migrate.Latest)
	}
	if *drop && (*to != 0 || *designs) {
		return fail(exitUsage, "--drop-tables only with --to 0")
	}
	pool, st, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cctx, cancel := a.withTimeout(ctx)
	defer cancel()
	if *designs {
		file, what := "designs/migrations/0001_advisory_design_functions.up.sql", "installed"
		if *to == 0 {
			file, what = "designs/migrations/0001_advisory_design_functions.down.sql", "removed"
		}
		sql, err := a.sqlFile(file)
		if err != nil {
			return err
		}
		if _, err := pool.Exec(cctx, sql); err != nil {
			return err
		}
		fmt.Fprintf(a.stderr, "design functions %s\n", what)
		return nil
	}
	before, _, err := st.ReadVersion(cctx, "migrate.Version")
	if err != nil {
		return err
	}
	if err := a.migrateTo(cctx, pool, *to, *drop); err != nil {
		return err
	}
	fmt.Fprintf(a.stderr, "schema migrated from version %d to %d", before, *to)
	if *to == 0 && !*drop {
		fmt.Fprint(a.stderr, " (SyncGuard's tables and fence counters kept)")
	}
	fmt.Fprintln(a.stderr)
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
func (a *app) version(ctx context.Context, args []string) error {
	fs := a.flags("version", "")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
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

func (a *app) sql(_ context.Context, args []string) error {
	fs := a.flags("sql", "[schema | migrations | designs | roles]")
	down := fs.Bool("down", false, "migrations, designs: print the down SQL (newest first)")
	owner := fs.String("owner", "", "roles: the owner role (with --runtime, --schema, --database: the grants ready to run; without: the psql script)")
	runtime := fs.String("runtime", "", "roles: the runtime role")
	schema := fs.String("schema", "", "roles: the schema holding the tables")
	database := fs.String("database", "", "roles: the database")
	if err := parse(fs, args); err != nil {
		return err
	}
	what := "schema"
	if fs.NArg() > 1 {
		return fail(exitUsage, "sql takes at most one argument")
	}
	if fs.NArg() == 1 {
		what = fs.Arg(0)
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
		if *down {
			suffix = ".down.sql"
		}
		names, err := iofs.Glob(fsys, dir+"/*"+suffix) // sorted: oldest first
		if err != nil {
			return err
		}
		if *down {
			slices.Reverse(names)
		}
		for _, n := range names {
			fmt.Fprintf(a.stdout, "-- %s\n%s\n", path.Base(n), read(n))
		}
	case "roles":
		if *owner == "" && *runtime == "" && *schema == "" && *database == "" {
			fmt.Fprint(a.stdout, read("roles.sql"))
			return nil
		}
		o, r, err := migrate.RolesSQL(*owner, *runtime, *schema, *database)
		if err != nil {
			return fail(exitUsage, "%v", err)
		}
		fmt.Fprintf(a.stdout, "-- step 1, before the schema (as an administrator)\n%s\n-- step 2, after the schema\n%s", o, strings.TrimLeft(r, "\n"))
	default:
		return fail(exitUsage, "sql: unknown %q (schema, migrations, designs, roles)", what)
	}
	return nil
}
