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
// program creates: "It creates <n> tables (<`names`>), <n> views and its
// functions (named <`prefix*`> and <`prefix*`>) in the connection's
// current schema" (line breaks anywhere).
var quickStartCreates = regexp.MustCompile(strings.Join(strings.Fields(
	"It creates (\\w+) tables \\(([^)]*)\\), (\\w+) views and its functions \\(named ([^)]*)\\) in the connection's current schema"), `\s+`))

var numberWords = map[string]int{"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
	"eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}

// TestReadmeQuickStartCreates keeps README.md's Quick start honest about
// what SetupSchema creates: it runs SetupSchema in a fresh schema (the
// connection's current schema) and compares the tables (by name), the
// views (by count) and the functions (by name prefix) found there with
// the sentence.
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
	nViews, okV := numberWords[m[3]]
	var prefixes []string
	for _, f := range regexp.MustCompile("`([A-Za-z0-9_]+)\\*`").FindAllStringSubmatch(m[4], -1) {
		prefixes = append(prefixes, f[1])
	}
	if !okT || !okV || len(prefixes) == 0 {
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
		if !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(f, p) }) {
			t.Errorf("SetupSchema created function %s, not named %v*: update the README sentence %q", f, prefixes, m[0])
		}
	}
	if len(tables) != nTables || !slices.Equal(tables, readmeTables) {
		t.Errorf("SetupSchema creates %d tables %v; README.md says %s %v: update %q", len(tables), tables, m[1], readmeTables, m[0])
	}
	var views int
	if err := pool.QueryRow(c, "SELECT count(*) FROM pg_class WHERE relnamespace = $1::regnamespace AND relkind = 'v'", schema).Scan(&views); err != nil {
		t.Fatal(err)
	}
	if views != nViews {
		t.Errorf("SetupSchema creates %d views; README.md says %s: update %q", views, m[3], m[0])
	}
}
