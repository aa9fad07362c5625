package pglease_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// quickStartCreates is README.md's Quick start sentence about what the
// program creates: "It creates <n> tables (<`names`>) and <n> `pglease_*`
// functions in the connection's current schema" (line breaks anywhere).
var quickStartCreates = regexp.MustCompile(strings.Join(strings.Fields(
	"It creates (?:pglease's )?(\\w+) tables \\(([^)]*)\\) and (\\w+) (?:`pglease_\\*` )?functions in the connection's current schema"), `\s+`))

var numberWords = map[string]int{"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
	"eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}

// TestReadmeQuickStartCreates keeps README.md's Quick start honest about
// what SetupSchema creates: it runs SetupSchema in a fresh schema (the
// connection's current schema) and compares the tables (by name) and the
// pglease_* functions (by count) found there with the sentence.
func TestReadmeQuickStartCreates(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := quickStartCreates.FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("README.md has no sentence matching %q", quickStartCreates)
	}
	nTables, okT := numberWords[m[1]]
	nFuncs, okF := numberWords[m[3]]
	if !okT || !okF {
		t.Fatalf("README.md: %q: write the counts as words (one … twelve)", m[0])
	}
	var readmeTables []string
	for _, f := range regexp.MustCompile("`([A-Za-z0-9_]+)`").FindAllStringSubmatch(m[2], -1) {
		readmeTables = append(readmeTables, f[1])
	}
	slices.Sort(readmeTables)

	pool, schema := pgtest.Pool(t)
	c := t.Context()
	mg, err := migrate.New(pool, pg.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := mg.Up(c); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(c, "SELECT relname::text FROM pg_class WHERE relnamespace = $1::regnamespace AND relkind IN ('r', 'p') ORDER BY 1", schema)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	rows, err = pool.Query(c, "SELECT proname::text FROM pg_proc WHERE pronamespace = $1::regnamespace ORDER BY 1", schema)
	if err != nil {
		t.Fatal(err)
	}
	funcs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range funcs {
		if !strings.HasPrefix(f, "pglease_") {
			t.Errorf("SetupSchema created function %s, not pglease_*: update the README sentence %q", f, m[0])
		}
	}
	if len(tables) != nTables || !slices.Equal(tables, readmeTables) {
		t.Errorf("SetupSchema creates %d tables %v; README.md says %s %v: update %q", len(tables), tables, m[1], readmeTables, m[0])
	}
	if len(funcs) != nFuncs {
		t.Errorf("SetupSchema creates %d functions %v; README.md says %s: update %q", len(funcs), funcs, m[3], m[0])
	}
}
