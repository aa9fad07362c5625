package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/store"
)

// RoleSchema is a fresh schema of the package's database set up the way
// roles.sql (migrate.RolesSQL) sets up production: an owner role that ran
// SetupSchema, and a runtime role with only the grants of roles.sql (no
// DDL, no DELETE or TRUNCATE on the fence table, not superuser, no
// pg_signal_backend). Tests run their lock operations on RuntimeURL;
// only the schema setup ran as the owner.
type RoleSchema struct {
	Schema  string // holds SyncGuard's default table names and the pglease_* functions
	Owner   string // the owner role's name
	Runtime string // the runtime role's name
	// OwnerURL and RuntimeURL connect to the package's database as the
	// role, with search_path = Schema (trust auth, as pgtest's clusters).
	OwnerURL, RuntimeURL string
	// Admin is the superuser URL of the package database (for fault
	// injection and for checking what the roles did, never for the
	// operations under test).
	Admin string
}

// The runtime and owner roles of this test process (one pair per
// package run, created on first use, dropped by Main after the package's
// database).
var (
	rolesOnce              sync.Once
	rolesErr               error
	ownerRole, runtimeRole string
)

func processRoles(ctx context.Context, conn *pgx.Conn) (owner, runtime string, err error) {
	rolesOnce.Do(func() {
		var super bool
		if err := conn.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super); err != nil {
			rolesErr = err
			return
		}
		if !super {
			rolesErr = errNotSuperuser
			return
		}
		o, r := RandomName("pglease_owner_"), RandomName("pglease_rt_")
		for _, n := range []string{o, r} {
			if _, err := conn.Exec(ctx, "CREATE ROLE "+n+" LOGIN"); err != nil {
				rolesErr = fmt.Errorf("pgtest: create role: %w", err)
				return
			}
		}
		ownerRole, runtimeRole = o, r
	})
	return ownerRole, runtimeRole, rolesErr
}

var grantMu sync.Mutex // serializes RoleSchemaForTest's grants

// ExecGrants runs sql (roles.sql's steps, or other GRANTs on the package's
// database) on conn while no RoleSchemaForTest of this process grants:
// concurrent GRANTs on one database or role fail with "tuple concurrently
// updated".
func ExecGrants(ctx context.Context, conn interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, sql string) error {
	grantMu.Lock()
	defer grantMu.Unlock()
	_, err := conn.Exec(ctx, sql)
	return err
}

var errNotSuperuser = errors.New("pgtest: needs a superuser DATABASE_URL (pgtest's throwaway clusters are) to create login roles")

// dropRoles drops the process's roles (after the package's database,
// which held everything they owned or were granted, was dropped).
func dropRoles(ctx context.Context, server string) error {
	if ownerRole == "" {
		return nil
	}
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		return fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(context.Background())
	for _, r := range []string{ownerRole, runtimeRole} {
		if _, err := conn.Exec(ctx, "DROP ROLE IF EXISTS "+r); err != nil {
			return fmt.Errorf("pgtest: drop role: %w", err)
		}
	}
	return nil
}

// RoleSchemaForTest returns a fresh schema of the package's database set
// up like production (roles.sql): step 1 of the grants (migrate.RolesSQL)
// as the superuser, SetupSchema as the owner role (SyncGuard's default
// table names), step 2 for the runtime role. The roles are the test
// process's pair (shared by its tests, dropped by Main); the schema is
// dropped when the test ends. It skips the test when the package database
// is not reached as a superuser (it cannot create login roles then).
func RoleSchemaForTest(tb testing.TB) *RoleSchema {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := URL(tb)
	conn, owner, runtime := adminRoles(tb, ctx, admin)
	defer conn.Close(context.Background())
	var db string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	rs := &RoleSchema{Owner: owner, Runtime: runtime, Admin: admin}
	// Registered before Schema's cleanup, so it runs after the schema is
	// dropped (cleanups run last-in first-out): objects the owner created
	// outside the schema (none today) are dropped with it.
	rs.Schema = Schema(tb)
	rs.OwnerURL = roleURL(tb, admin, rs.Owner, rs.Schema)
	rs.RuntimeURL = roleURL(tb, admin, rs.Runtime, rs.Schema)

	// pgtest sits below pg/migrate (whose tests import it): the schema is
	// set up with what pg/migrate registered in the store (store.Setup).
	mustSetup(tb)
	ownerSQL, runtimeSQL, err := store.Setup.RolesSQL(rs.Owner, rs.Runtime, rs.Schema, db)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	// Parallel tests grant to the same two roles: concurrent GRANTs and
	// ALTER ROLEs of one role fail with "tuple concurrently updated".
	grantMu.Lock()
	defer grantMu.Unlock()
	if _, err := conn.Exec(ctx, ownerSQL); err != nil {
		tb.Fatalf("pgtest: roles.sql step 1: %v", err)
	}
	owner1, err := pgx.Connect(ctx, rs.OwnerURL)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	defer owner1.Close(context.Background())
	if err := store.Setup.Install(ctx, owner1, store.Config{}); err != nil {
		tb.Fatalf("pgtest: SetupSchema as the owner role: %v", err)
	}
	if _, err := conn.Exec(ctx, runtimeSQL); err != nil {
		tb.Fatalf("pgtest: roles.sql step 2: %v", err)
	}
	return rs
}

// RuntimePool is Pool as the runtime role: a pool on a fresh schema that
// the owner role set up (RoleSchemaForTest), connecting as the runtime
// role, closed when the test ends. It returns the pool and the
// RoleSchema (for the schema's name and the superuser URL).
func RuntimePool(tb testing.TB, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, *RoleSchema) {
	tb.Helper()
	rs := RoleSchemaForTest(tb)
	return rs.RuntimePool(tb, configure...), rs
}

// RuntimePool returns a pool on rs.RuntimeURL, closed when the test ends.
// configure, if given, may change the pool config.
func (rs *RoleSchema) RuntimePool(tb testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(rs.RuntimeURL)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	for _, f := range configure {
		f(cfg)
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(p.Close)
	return p
}

// roleURL returns s connecting as role (no password) with search_path =
// schema (unless schema is "").
func roleURL(tb testing.TB, s, role, schema string) string {
	tb.Helper()
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		if strings.ContainsAny(role+schema, " '\\") {
			tb.Fatalf("pgtest: role %q / schema %q need quoting", role, schema)
		}
		s += " user=" + role + " password=''"
		if schema != "" {
			s += " search_path=" + schema
		}
		return s
	}
	u.User = url.User(role)
	if schema != "" {
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// RuntimeRoleURL returns the package database's connection string as the
// test process's runtime role (see RoleSchemaForTest), without a schema:
// for tests of advisory locks, which need no table, only what every role
// has (CONNECT, the pg_advisory_* functions, pg_locks). It skips the test
// when the package database is not reached as a superuser.
func RuntimeRoleURL(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := URL(tb)
	conn, _, runtime := adminRoles(tb, ctx, admin)
	defer conn.Close(context.Background())
	return roleURL(tb, admin, runtime, "")
}

// AdminPool returns a superuser pool on rs.Admin with search_path =
// rs.Schema, closed when the test ends: for fault injection and DDL a test
// does to the lock tables behind the runtime role's back, never for the
// operations under test.
func (rs *RoleSchema) AdminPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(rs.Admin)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = rs.Schema
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(p.Close)
	return p
}

// adminRoles connects to the package database as the superuser at admin
// and returns that connection (the caller closes it) with the test
// process's owner and runtime roles; it skips the test when admin is not a
// superuser.
func adminRoles(tb testing.TB, ctx context.Context, admin string) (*pgx.Conn, string, string) {
	tb.Helper()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		tb.Fatalf("pgtest: connect: %v", err)
	}
	owner, runtime, err := processRoles(ctx, conn)
	if err != nil {
		conn.Close(context.Background())
		if errors.Is(err, errNotSuperuser) {
			tb.Skip(err.Error())
		}
		tb.Fatal(err)
	}
	return conn, owner, runtime
}
