package pg

import (
	_ "embed" // for roles.sql
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// RolesFile is pg/roles.sql: the grants for a least-privilege owner
// (migration) role and runtime role, as a psql script with the variables
// owner_role, runtime_role and schema (see its header). Step 1 runs
// before SetupSchema, step 2 after it. RolesSQL returns both steps with
// the variables filled in.
//
//go:embed roles.sql
var RolesFile string

// Roles names the roles, schema and database RolesSQL writes grants for.
type Roles struct {
	// Owner owns the tables and functions and runs SetupSchema.
	Owner string
	// Runtime is the role the application connects as.
	Runtime string
	// Schema holds the tables (SyncGuard's default table names).
	Schema string
	// Database is the database both roles connect to.
	Database string
}

const rolesStep2 = "\n-- @@ step 2:" // at a line start: the header mentions it too

// RolesSQL returns RolesFile's two steps for r, ready to Exec (no psql
// needed): owner grants the owner role what it needs to run SetupSchema,
// and must run before it; runtime grants the runtime role its
// least-privilege access, and must run after it (it fails when the schema
// holds no pglease functions). Both are idempotent and must run as an
// administrator (superuser, or CREATEROLE plus ownership of the schema and
// database). Names are quoted, not validated as identifiers; an empty
// name, a NUL byte, invalid UTF-8 or more than 63 bytes is
// InvalidArgument.
func RolesSQL(r Roles) (owner, runtime string, err error) {
	const op = "pg.RolesSQL"
	for _, f := range []struct{ what, v string }{
		{"Owner", r.Owner}, {"Runtime", r.Runtime}, {"Schema", r.Schema}, {"Database", r.Database},
	} {
		if f.v == "" || len(f.v) > 63 || !utf8.ValidString(f.v) || strings.IndexByte(f.v, 0) >= 0 {
			return "", "", pgerr.New(pglease.CodeInvalidArgument, op, f.what+" must be 1-63 bytes of UTF-8 without NUL", nil)
		}
	}
	lit := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	rep := strings.NewReplacer(
		`:"owner_role"`, pgx.Identifier{r.Owner}.Sanitize(),
		`:"runtime_role"`, pgx.Identifier{r.Runtime}.Sanitize(),
		`:"schema"`, pgx.Identifier{r.Schema}.Sanitize(),
		`:"DBNAME"`, pgx.Identifier{r.Database}.Sanitize(),
		`:'schema'`, lit(r.Schema),
		`:'runtime_role'`, lit(r.Runtime),
	)
	before, after, ok := strings.Cut(RolesFile, rolesStep2)
	if !ok {
		return "", "", pgerr.New(pglease.CodeInternal, op, "roles.sql lacks its step 2 marker", nil)
	}
	return rep.Replace(before + "\n"), rep.Replace(rolesStep2[1:] + after), nil
}
