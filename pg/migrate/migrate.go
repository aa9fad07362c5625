package migrate

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/pg"
)

// Latest is the lease schema version this pglease needs, the number of
// its last migration: what Up migrates to and Check expects, and the
// version to compare Version's answer with. Version 0 is no pglease
// schema at all, which includes the schema pglease set up before schema
// versions existed (migrations 1 and 2 upgrade it in place).
const Latest = 4

// Migrator manages the lease schema of one pair of tables (one
// pg.Config's names) on a DB: it migrates it up or down, reads and
// checks its version, and installs the optional release trigger. Every
// change runs as one transaction under one advisory lock, so Migrators in
// several processes, migration tools applying the SQL of SQL, and
// SyncGuard's own setup can run at the same time. A Migrator is
// immutable and safe for concurrent use (as safe as its DB).
type Migrator struct {
	db pg.DB
	s  *store.Store
	n  store.Names
}

// New returns a Migrator for cfg's tables on db. It validates cfg (bad
// names are InvalidArgument) and does no I/O.
func New(db pg.DB, cfg pg.Config) (*Migrator, error) {
	s, err := store.New("migrate.New", db, store.Config(cfg))
	if err != nil {
		return nil, err
	}
	return &Migrator{db: db, s: s, n: s.Names()}, nil
}

// Up brings the schema to Latest, applying the missing migrations up from
// the recorded version: on an empty database it creates SyncGuard's
// tables (if missing) and pglease's functions; on a current one it only
// reads the version. It never goes down: a newer schema that still serves
// Latest is left alone, one that does not is an error (*SchemaError
// cause). It is idempotent and safe to run from several processes at
// once: the DDL runs as one implicit transaction that first takes a
// transaction-level advisory lock and checks that the version is still
// the one read. It needs CREATE on the schema; production deployments may
// apply the migrations (SQL) with an owner role instead.
func (m *Migrator) Up(ctx context.Context) error {
	const op = "migrate.Up"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	return m.migrate(ctx, op, Latest, true)
}

// To takes the schema to version (0 … Latest), up or down, applying the
// migrations in order in one transaction, under Up's advisory lock. Going
// down to 0 removes everything pglease added. SyncGuard's lock and fence
// counter tables stay unless the session that runs it set
// pglease.drop_tables to 'on' (SET pglease.drop_tables = 'on' on a
// *pgx.Conn given to New, or options=-c%20pglease.drop_tables%3Don in its
// connection string): dropping the fence counters lets a later grant
// reuse a fence an old holder still has. A version this pglease does not
// know (a newer schema) cannot be migrated down from here: use the newer
// pglease. A version out of range is InvalidArgument before any I/O.
func (m *Migrator) To(ctx context.Context, version int) error {
	const op = "migrate.To"
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return err
	}
	if version < 0 || version > Latest {
		return pgerr.New(pglease.CodeInvalidArgument, op, "version out of range 0.."+strconv.Itoa(Latest), nil)
	}
	return m.migrate(ctx, op, version, false)
}

// Version returns the schema version recorded in the database for the
// Migrator's tables (0: none) and the oldest code version it serves, for
// deployment checks and operators. Read-only; it needs no privilege
// beyond connecting (and EXECUTE on the record function, which the roles
// SQL grants). Two round trips.
func (m *Migrator) Version(ctx context.Context) (version, compatibleFrom int, err error) {
	return m.s.ReadVersion(ctx, "migrate.Version")
}

// Check returns nil when the database's lease schema serves this pglease
// (Latest), else an InvalidArgument error whose cause is a *SchemaError
// that says how to migrate: for a program that leaves migrations to its
// deployment and wants to fail at start rather than at its first acquire
// (pg.Store and the Manager check once by themselves, before their first
// acquire).
func (m *Migrator) Check(ctx context.Context) error {
	const op = "migrate.Check"
	v, c, err := m.s.ReadVersion(ctx, op)
	if err != nil {
		return err
	}
	if !store.Serves(v, c, Latest) {
		return store.SchemaErr(op, &store.SchemaError{Found: v, CompatibleFrom: c, Want: Latest})
	}
	return nil
}

// migrate moves the schema to target. upOnly (Up) never goes down and
// accepts a newer schema that serves this version. A concurrent migration
// that changes the version between the read and the lock makes it read
// again (bounded).
func (m *Migrator) migrate(ctx context.Context, op string, target int, upOnly bool) error {
	ms := migrations(m.n)
	for attempt := 0; ; attempt++ {
		v, c, err := m.s.ReadVersion(ctx, op)
		if err != nil {
			return err
		}
		if upOnly && v >= target {
			if !store.Serves(v, c, target) {
				return store.SchemaErr(op, &store.SchemaError{Found: v, CompatibleFrom: c, Want: target})
			}
			return nil
		}
		if v == target {
			return nil
		}
		if v > len(ms) {
			return pgerr.New(pglease.CodeInvalidArgument, op,
				fmt.Sprintf("schema version %d is newer than this pglease knows (%d): migrate it with the newer pglease", v, len(ms)), nil)
		}
		var b strings.Builder
		b.WriteString(setupLock)
		b.WriteString(guardSQL(m.n, v))
		if v < target {
			for _, mg := range ms[v:target] {
				b.WriteString(mg.up)
			}
		} else {
			for i := v; i > target; i-- {
				b.WriteString(ms[i-1].down)
			}
		}
		// Stores built from now on check the schema again (this process
		// remembers the checks of Stores on the same target).
		m.s.ForgetChecked()
		// One simple-protocol Exec (no arguments): one implicit
		// transaction for all statements.
		_, err = m.db.Exec(ctx, b.String())
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == errConcurrent && attempt < 10 {
			continue
		}
		if pgerr.CatalogRace(err) && ctx.Err() == nil {
			// Someone without our advisory lock (SyncGuard's setupSchema,
			// a hand-run migration) created the same objects at the same
			// moment. The transaction rolled back; again, after a short
			// jittered pause, finds them there.
			if attempt < 10 {
				select {
				case <-time.After(time.Duration(5+rand.IntN(20)) * time.Millisecond):
				case <-ctx.Done():
				}
				continue
			}
			return pgerr.New(pglease.CodeServiceUnavailable, op, pgerr.CatalogRaceMsg, pgerr.Map(ctx, op, err))
		}
		if err != nil {
			return pgerr.Map(ctx, op, err)
		}
		return nil
	}
}

// SchemaError says that the database's lease schema is not the one this
// pglease needs, and how to fix it, so that a program (or an operator's
// tool) can tell "migrate first" from other failures and say which
// versions it found. A Store's or Manager's first acquire, Up and Check
// return it as the cause of an InvalidArgument *pglease.Error; find it
// with errors.As.
type SchemaError struct {
	// Found is the recorded version: 0 when there is no pglease schema
	// (none at all, or one from before schema versions).
	Found int
	// Want is the version this pglease needs (Latest).
	Want int

	compatibleFrom int   // the oldest code version the found schema serves
	err            error // the server's answer that showed the schema missing
}

// Error says what was found, what is needed and what to run.
func (e *SchemaError) Error() string {
	return (&store.SchemaError{Found: e.Found, CompatibleFrom: e.compatibleFrom, Want: e.Want, Err: e.err}).Error()
}

// Unwrap returns the server's error that showed the schema missing
// (SQLSTATE 42883: the version record is undefined), if that is how it
// was found, so that errors.As finds its SQLSTATE.
func (e *SchemaError) Unwrap() error { return e.err }

func init() {
	// The store reports a wrong schema with its own type (it cannot
	// import this package); errors.As finds this one through the hook.
	store.AsPublic = func(e *store.SchemaError, target any) bool {
		p, ok := target.(**SchemaError)
		if ok {
			*p = &SchemaError{Found: e.Found, Want: e.Want, compatibleFrom: e.CompatibleFrom, err: e.Err}
		}
		return ok
	}
	// The test harness sets schemas up through the store, below this
	// package (see store.Setup).
	store.Setup.Install = func(ctx context.Context, db store.DB, cfg store.Config) error {
		m, err := New(db, pg.Config(cfg))
		if err != nil {
			return err
		}
		return m.Up(ctx)
	}
	store.Setup.RolesSQL = RolesSQL
}
