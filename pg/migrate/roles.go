package migrate

import (
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// rolesStep2 starts step 2 of roles.sql (at a line start: the header
// mentions it too).
const rolesStep2 = "\n-- @@ step 2:"

// RolesSQL returns the grants for a least-privilege deployment, ready to
// Exec (no psql needed): owner is the role that owns the tables and
// functions and runs Up, runtime the role the application connects as,
// schema the schema that holds the tables (SyncGuard's default table
// names), database the database both connect to. beforeSchema grants the
// owner role what it needs to run Up, and must run before it;
// afterSchema grants the runtime role its least-privilege access (no
// DELETE on the fence counters, EXECUTE on pglease's functions only), and
// must run after it (it fails when the schema holds no pglease
// functions). Both are idempotent and must run as an administrator
// (superuser, or CREATEROLE plus ownership of the schema and database).
// They are roles.sql of SQL (a psql script with the variables owner_role,
// runtime_role and schema; see its header) with the variables filled in.
// Names are quoted, not validated as identifiers; an empty name, a NUL
// byte, invalid UTF-8 or more than 63 bytes is InvalidArgument.
func RolesSQL(owner, runtime, schema, database string) (beforeSchema, afterSchema string, err error) {
	const op = "migrate.RolesSQL"
	for _, f := range []struct{ what, v string }{
		{"owner", owner}, {"runtime", runtime}, {"schema", schema}, {"database", database},
	} {
		if f.v == "" || len(f.v) > 63 || !utf8.ValidString(f.v) || strings.IndexByte(f.v, 0) >= 0 {
			return "", "", pgerr.New(pglease.CodeInvalidArgument, op, f.what+" must be 1-63 bytes of UTF-8 without NUL", nil)
		}
	}
	lit := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	rep := strings.NewReplacer(
		`:"owner_role"`, pgx.Identifier{owner}.Sanitize(),
		`:"runtime_role"`, pgx.Identifier{runtime}.Sanitize(),
		`:"schema"`, pgx.Identifier{schema}.Sanitize(),
		`:"DBNAME"`, pgx.Identifier{database}.Sanitize(),
		`:'schema'`, lit(schema),
		`:'runtime_role'`, lit(runtime),
	)
	before, after, ok := strings.Cut(tmpl("roles.sql"), rolesStep2)
	if !ok {
		return "", "", pgerr.New(pglease.CodeInternal, op, "roles.sql lacks its step 2 marker", nil)
	}
	return rep.Replace(before + "\n"), rep.Replace(rolesStep2[1:] + after), nil
}
