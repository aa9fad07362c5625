package migrate

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pglease/pglease/internal/store"
)

// scriptGrants returns what roles.sql's step 2 grants the runtime role,
// as "object: PRIV" (objects without the schema; "database" and "schema"
// for CONNECT and USAGE; "pglease_*" for the loop over the schema's
// pglease functions).
func scriptGrants(t *testing.T) []string {
	t.Helper()
	_, step2, ok := strings.Cut(tmpl("roles.sql"), rolesStep2)
	if !ok {
		t.Fatal("roles.sql lacks its step 2 marker")
	}
	var out []string
	stmt := regexp.MustCompile(`(?s)^GRANT (.+?) ON (TABLE|FUNCTION|DATABASE|SCHEMA) (.+) TO :"runtime_role"$`)
	obj := regexp.MustCompile(`:"schema"\.([A-Za-z_][A-Za-z0-9_]*(?:\([^)]*\))?)`)
	var lines []string
	for _, l := range strings.Split(step2, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "--") {
			lines = append(lines, l)
		}
	}
	for _, s := range strings.Split(strings.Join(lines, "\n"), ";") {
		s = strings.Join(strings.Fields(s), " ")
		if !strings.HasPrefix(s, "GRANT ") {
			continue
		}
		m := stmt.FindStringSubmatch(s)
		if m == nil {
			t.Fatalf("roles.sql: a GRANT this test cannot read: %s", s)
		}
		var objs []string
		switch m[2] {
		case "DATABASE":
			objs = []string{"database"}
		case "SCHEMA":
			objs = []string{"schema"}
		default:
			for _, o := range obj.FindAllStringSubmatch(m[3], -1) {
				objs = append(objs, o[1])
			}
		}
		for _, o := range objs {
			for _, p := range strings.Split(m[1], ",") {
				out = append(out, o+": "+strings.TrimSpace(p))
			}
		}
	}
	if !strings.Contains(step2, `p.proname LIKE 'pglease\_%'`) || !strings.Contains(step2, `'GRANT EXECUTE ON FUNCTION %s TO %I'`) {
		t.Fatal("roles.sql no longer grants EXECUTE on every pglease_* function in a loop; update this test and runtimeGrants")
	}
	out = append(out, "pglease_*: EXECUTE")
	slices.Sort(out)
	return out
}

// TestRuntimeGrantsMatchScript checks that MissingPrivileges' list
// (runtimeGrants) and docs/operations.md's Roles table say exactly what
// roles.sql grants the runtime role, so none of them can drift from the
// script.
func TestRuntimeGrantsMatchScript(t *testing.T) {
	want := scriptGrants(t)

	n, err := store.Config{}.Names("test")
	if err != nil {
		t.Fatal(err)
	}
	got := []string{"database: CONNECT", "schema: USAGE", "pglease_*: EXECUTE"}
	for _, g := range runtimeGrants(n) {
		for _, p := range g.privs {
			got = append(got, strings.ReplaceAll(g.obj, `"`, "")+": "+p)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("runtimeGrants (MissingPrivileges) differs from roles.sql:\n got  %q\n want %q", got, want)
	}

	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "| object | runtime role's privileges |\n|---|---|\n")
	if !ok {
		t.Fatal("docs/operations.md has no Roles table")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	tick := regexp.MustCompile("`([^`]+)`")
	var documented []string
	for _, row := range strings.Split(table, "\n") {
		cells := strings.Split(strings.Trim(row, "|"), "|")
		if len(cells) != 2 {
			t.Fatalf("docs/operations.md Roles table: row %q", row)
		}
		privs := tick.FindAllStringSubmatch(cells[1], -1)
		if strings.Contains(cells[0], "the schema; the database") {
			if len(privs) != 2 {
				t.Fatalf("docs/operations.md Roles table: row %q", row)
			}
			documented = append(documented, "schema: "+privs[0][1], "database: "+privs[1][1])
			continue
		}
		o := tick.FindStringSubmatch(cells[0])
		if o == nil {
			t.Fatalf("docs/operations.md Roles table: row %q names no object", row)
		}
		for _, p := range privs {
			documented = append(documented, o[1]+": "+p[1])
		}
	}
	slices.Sort(documented)
	if !slices.Equal(documented, want) {
		t.Errorf("docs/operations.md's Roles table differs from roles.sql:\n doc  %q\n want %q", documented, want)
	}
}
