package main

import (
	"context"
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/pglease/pglease/pg"
)

func (a *app) setup(ctx context.Context, args []string) error {
	fs := a.flags("setup", "")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fail(exitUsage, "setup takes no arguments")
	}
	pool, store, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cctx, cancel := a.withTimeout(ctx)
	defer cancel()
	before, _, err := store.SchemaVersion(cctx)
	if err != nil {
		return err
	}
	if err := store.SetupSchema(cctx); err != nil {
		return err
	}
	after, _, err := store.SchemaVersion(cctx)
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
	to := fs.Int("to", pg.SchemaVersion, "target version (0 removes pglease's objects; SyncGuard's tables stay unless --drop-tables)")
	drop := fs.Bool("drop-tables", false, "at version 0, also drop SyncGuard's lock and fence counter tables (fence counters are lost)")
	designs := fs.Bool("designs", false, "migrate the optional design functions (email_to_lock_id, …) instead: --to 1 installs, --to 0 removes")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fail(exitUsage, "migrate takes no arguments")
	}
	if *designs {
		if *to != 0 && *to != 1 && *to != pg.SchemaVersion {
			return fail(exitUsage, "--designs: --to must be 1 (install) or 0 (remove)")
		}
	} else if *to < 0 || *to > pg.SchemaVersion {
		return fail(exitUsage, "--to must be 0..%d", pg.SchemaVersion)
	}
	if *drop && (*to != 0 || *designs) {
		return fail(exitUsage, "--drop-tables only with --to 0")
	}
	pool, store, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cctx, cancel := a.withTimeout(ctx)
	defer cancel()
	if *designs {
		m := pg.DesignMigrations()[0]
		sql, what := m.Up, "installed"
		if *to == 0 {
			sql, what = m.Down, "removed"
		}
		if _, err := pool.Exec(cctx, sql); err != nil {
			return err
		}
		fmt.Fprintf(a.stderr, "design functions %s\n", what)
		return nil
	}
	before, _, err := store.SchemaVersion(cctx)
	if err != nil {
		return err
	}
	if err := store.Migrate(cctx, *to, pg.MigrateOptions{DropTables: *drop}); err != nil {
		return err
	}
	fmt.Fprintf(a.stderr, "schema migrated from version %d to %d", before, *to)
	if *to == 0 && !*drop {
		fmt.Fprint(a.stderr, " (SyncGuard's tables and fence counters kept)")
	}
	fmt.Fprintln(a.stderr)
	return nil
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
	fmt.Fprintf(a.stdout, "pglease %s\nneeds schema version %d\n", buildVersion(), pg.SchemaVersion)
	if a.c.url == "" {
		fmt.Fprintln(a.stdout, "database schema version: not checked (no DATABASE_URL or --database-url)")
		return nil
	}
	pool, store, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cctx, cancel := a.withTimeout(ctx)
	defer cancel()
	v, from, err := store.SchemaVersion(cctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "database schema version %d", v)
	if v > 0 {
		fmt.Fprintf(a.stdout, " (serves pglease schema versions %d..%d)", from, v)
	}
	fmt.Fprintln(a.stdout)
	switch {
	case v >= pg.SchemaVersion && from <= pg.SchemaVersion:
		fmt.Fprintln(a.stdout, "status: current")
		return nil
	case v < pg.SchemaVersion:
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
	cfg := a.c.config()
	switch what {
	case "schema":
		s, err := pg.SchemaSQL(cfg)
		if err != nil {
			return fail(exitUsage, "%v", err)
		}
		fmt.Fprint(a.stdout, s)
	case "migrations", "designs":
		var ms []pg.Migration
		if what == "designs" {
			ms = pg.DesignMigrations()
		} else {
			var err error
			if ms, err = pg.Migrations(cfg); err != nil {
				return fail(exitUsage, "%v", err)
			}
		}
		for i := range ms {
			m := ms[i]
			if *down {
				m = ms[len(ms)-1-i]
				fmt.Fprintf(a.stdout, "-- %04d_%s.down.sql\n%s\n", m.Version, m.Name, m.Down)
			} else {
				fmt.Fprintf(a.stdout, "-- %04d_%s.up.sql\n%s\n", m.Version, m.Name, m.Up)
			}
		}
	case "roles":
		if *owner == "" && *runtime == "" && *schema == "" && *database == "" {
			fmt.Fprint(a.stdout, pg.RolesFile)
			return nil
		}
		o, r, err := pg.RolesSQL(pg.Roles{Owner: *owner, Runtime: *runtime, Schema: *schema, Database: *database})
		if err != nil {
			return fail(exitUsage, "%v", err)
		}
		fmt.Fprintf(a.stdout, "-- step 1, before the schema (as an administrator)\n%s\n-- step 2, after the schema\n%s", o, strings.TrimLeft(r, "\n"))
	default:
		return fail(exitUsage, "sql: unknown %q (schema, migrations, designs, roles)", what)
	}
	return nil
}
