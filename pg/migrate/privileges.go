package migrate

import (
	"context"
	"strings"
	"unicode/utf8"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
	"github.com/pglease/pglease/internal/store"
)

// grant is one object the runtime role of roles.sql needs privileges on.
type grant struct {
	kind  string   // "table" (tables and views) or "function"
	obj   string   // quoted name (a function with its argument types)
	privs []string // what roles.sql grants on it
}

// runtimeGrants lists the privileges roles.sql's step 2 grants the
// runtime role on n's named objects (besides CONNECT on the database,
// USAGE on the schema and EXECUTE on every pglease_* function of the
// schema, which MissingPrivileges checks too). A test compares it with
// roles.sql's GRANT statements and with docs/operations.md's Roles table.
func runtimeGrants(n store.Names) []grant {
	rw := []string{"SELECT", "INSERT", "UPDATE", "DELETE"}
	ru := []string{"SELECT", "INSERT", "UPDATE"}
	sel := []string{"SELECT"}
	x := []string{"EXECUTE"}
	return []grant{
		{"table", n.Lock, rw},
		{"table", n.Fence, ru},
		{"table", n.Holders, ru},
		{"table", n.Shared, rw},
		{"table", n.Queue, rw},
		{"table", n.ViewLeases, sel},
		{"table", n.ViewWaiters, sel},
		{"table", n.ViewAdvisory, sel},
		{"function", n.APIAcquire + "(text, bigint)", x},
		{"function", n.APIRelease + "(text)", x},
		{"function", n.APIExtend + "(text, bigint)", x},
		{"function", n.APIStatus + "(text)", x},
		{"function", n.APIRevoke + "(text, bigint, text)", x},
		{"function", n.APIRequestRelease + "(text, text)", x},
	}
}

// MissingPrivileges lists what role (a role name, as in pg_roles) lacks
// of the privileges roles.sql grants the runtime role (`pglease sql
// roles`, RolesSQL) on this Migrator's tables: CONNECT on the database,
// USAGE on the lock table's schema, SELECT/INSERT/UPDATE/DELETE on the
// lock table, the shared-hold table and the queue table, SELECT/INSERT/UPDATE on the
// fence and holder tables, SELECT on the SQL API's views, and EXECUTE on
// the SQL API's functions and on every pglease_* function of the schema.
// Each entry reads like "DELETE on table public.syncguard_locks_shared";
// nil means the role can run every lock operation. A missing object (the
// schema is not migrated) is listed as missing, e.g. "table
// syncguard_locks_shared does not exist (run Up)". Privileges a role has
// through membership, ownership or superuser count as held. The names
// resolve through the search_path of this Migrator's connection, which
// should be the runtime role's. It reads the catalogs only, in one
// statement, and needs no privilege itself. A role that does not exist,
// or a name that is empty, longer than 63 bytes, not UTF-8 or holds a
// NUL, is InvalidArgument.
func (m *Migrator) MissingPrivileges(ctx context.Context, role string) ([]string, error) {
	const op = "migrate.MissingPrivileges"
	if role == "" || len(role) > 63 || !utf8.ValidString(role) || strings.IndexByte(role, 0) >= 0 {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "role must be 1-63 bytes of UTF-8 without NUL", nil)
	}
	if err := pgerr.CheckContext(op, ctx); err != nil {
		return nil, err
	}
	var kinds, objs, privs []string
	for _, g := range runtimeGrants(m.n) {
		for _, p := range g.privs {
			kinds, objs, privs = append(kinds, g.kind), append(objs, g.obj), append(privs, p)
		}
	}
	// One row per missing privilege; a first row of NULL when the role
	// does not exist (has_*_privilege would raise 42704).
	q := `WITH r AS (SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1) AS ok),
  lk AS (SELECT c.relnamespace AS nsp FROM pg_catalog.pg_class AS c WHERE c.oid = to_regclass($5))
SELECT NULL::text FROM r WHERE NOT r.ok
UNION ALL
SELECT 'CONNECT on database ' || quote_ident(current_database()) FROM r
  WHERE r.ok AND NOT has_database_privilege($1, current_database(), 'CONNECT')
UNION ALL
SELECT 'USAGE on schema ' || quote_ident(n.nspname) FROM r, lk JOIN pg_catalog.pg_namespace AS n ON n.oid = lk.nsp
  WHERE r.ok AND NOT has_schema_privilege($1, n.oid, 'USAGE')
UNION ALL
SELECT CASE
    WHEN u.kind = 'table' AND to_regclass(u.obj) IS NULL THEN 'table ' || u.obj || ' does not exist (run Up)'
    WHEN u.kind = 'function' AND to_regprocedure(u.obj) IS NULL THEN 'function ' || u.obj || ' does not exist (run Up)'
    WHEN u.kind = 'table' THEN u.priv || ' on table ' || to_regclass(u.obj)::text
    ELSE u.priv || ' on function ' || to_regprocedure(u.obj)::text END
  FROM r, unnest($2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS u(kind, obj, priv, i)
  WHERE r.ok AND CASE u.kind
    WHEN 'table' THEN to_regclass(u.obj) IS NULL OR NOT has_table_privilege($1, to_regclass(u.obj), u.priv)
    ELSE to_regprocedure(u.obj) IS NULL OR NOT has_function_privilege($1, to_regprocedure(u.obj), u.priv) END
UNION ALL
SELECT 'EXECUTE on function ' || p.oid::regprocedure::text FROM r, lk JOIN pg_catalog.pg_proc AS p ON p.pronamespace = lk.nsp
  WHERE r.ok AND p.proname LIKE 'pglease\_%' AND NOT has_function_privilege($1, p.oid, 'EXECUTE')`
	rows, err := m.db.Query(ctx, q, role, kinds, objs, privs, m.n.Lock)
	if err != nil {
		return nil, pgerr.Map(ctx, op, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s *string
		if err := rows.Scan(&s); err != nil {
			return nil, pgerr.Map(ctx, op, err)
		}
		if s == nil {
			rows.Close()
			return nil, pgerr.New(pglease.CodeInvalidArgument, op, "the role does not exist", nil)
		}
		out = append(out, *s)
	}
	if err := rows.Err(); err != nil {
		return nil, pgerr.Map(ctx, op, err)
	}
	return out, nil
}
