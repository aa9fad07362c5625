package telemetry

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/obs"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// docName is one row of the table under "# Names" in telemetry/doc.go.
type docName struct {
	name, kind, unit, meaning string
}

// category is the row's kind without its detail: span, event, attribute
// or metric.
func (d docName) category() string { return strings.TrimSpace(strings.Split(d.kind, ",")[0]) }

var tableSplit = regexp.MustCompile(`\s{2,}`)

// docTable parses the names table of the public telemetry package's
// documentation: the code block of its "# Names" section, one row per line
// that starts in the name column, continuation lines indented.
func docTable(t *testing.T) []docName {
	t.Helper()
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var rows []docName
	in, header := false, false
	for _, line := range strings.Split(string(src), "\n") {
		switch {
		case strings.HasPrefix(line, "// # Names"):
			in = true
			continue
		case !in:
			continue
		case strings.HasPrefix(line, "// # "):
			in = false
			continue
		}
		code, ok := strings.CutPrefix(line, "//\t")
		if !ok {
			continue
		}
		if !header {
			if f := strings.Fields(code); len(f) != 4 || f[0] != "name" || f[1] != "kind" || f[2] != "unit" || f[3] != "meaning" {
				t.Fatalf("the table's first line is %q, want the header name kind unit meaning", code)
			}
			header = true
			continue
		}
		if strings.HasPrefix(code, " ") {
			if len(rows) == 0 {
				t.Fatalf("continuation line before the first row: %q", code)
			}
			rows[len(rows)-1].meaning += " " + strings.TrimSpace(code)
			continue
		}
		f := tableSplit.Split(code, 4)
		if len(f) != 4 {
			t.Fatalf("row %q: want the columns name, kind, unit, meaning", code)
		}
		rows = append(rows, docName{name: f[0], kind: f[1], unit: f[2], meaning: f[3]})
	}
	if len(rows) == 0 {
		t.Fatal("no names table under \"# Names\" in telemetry/doc.go")
	}
	return rows
}

// sqlStateErr is a server error with a SQLSTATE, as pgerr's mapped ones.
type sqlStateErr struct{}

func (sqlStateErr) Error() string    { return "lock not available" }
func (sqlStateErr) SQLState() string { return "55P03" }

// recordEverything drives every path of the recorder, with raw keys on
// (pglease.key), a database (server.*, db.namespace) and a server error
// (db.response.status_code), and returns the span, event, attribute and
// metric names it recorded, each "category name", and each metric's unit.
func recordEverything(t *testing.T) (names map[string]bool, units map[string]string) {
	h := newHarnessDB(t, obs.Database{Address: "db.example", Port: 5432, Namespace: "app"}, func(c *Config) { c.RawKeys = true })
	exercise(t, h.rec, newSecrets(t, 24))
	ctx := context.Background()
	_, a := h.rec.StartAcquire(ctx, h.rec.Key("every-op"), obs.AcquireInfo{Kind: obs.KindAdvisory})
	for _, op := range []obs.DBOperation{obs.OpAcquireMany, obs.OpReleaseMany, obs.OpExtendMany, obs.OpHandOff, obs.OpAcquireShared, obs.OpAcquireSets,
		obs.OpAdvisoryLock, obs.OpAdvisoryTryLock, obs.OpAdvisoryUnlock, obs.OpListen, obs.OpRevoke, obs.OpRequestRelease, obs.OpSnapshot} {
		_, db := h.rec.StartDB(ctx, op, 2, a.SpanContext())
		db.End(1, nil)
		_, db = h.rec.StartDB(ctx, op, 1, trace.SpanContext{})
		db.End(0, pgerr.New(pglease.CodeNetworkTimeout, "test", "timeout", sqlStateErr{}))
	}
	a.Failed(errors.New("x"))
	// A lock held and an acquire waiting at collection: the age gauges.
	_, held := h.rec.StartAcquire(ctx, h.rec.Key("held"), obs.AcquireInfo{Kind: obs.KindLease})
	held.Granted(1)
	_, waits := h.rec.StartAcquire(ctx, h.rec.Key("waits"), obs.AcquireInfo{Kind: obs.KindLease})
	waits.Waiting(obs.WaitHolder, "other[1]@host")
	_, waited := h.rec.StartAcquire(ctx, h.rec.Key("waited"), obs.AcquireInfo{Kind: obs.KindLease})
	waited.Waiting(obs.WaitLockDelay, "other[1]@host")
	waited.Ticket(2)
	waited.Failed(pglease.ErrAcquisitionTimeout)
	h.rec.ListenerPolling("behind a transaction-mode pooler")
	h.rec.ListenerUp(true)
	h.rec.ReleaseTrigger(true, "pglease_release")
	l := h.rec.Loop()
	l.Busy()
	l.SetDepth(obs.QueueDue, 1)
	time.Sleep(time.Millisecond)
	l.Idle()

	names, units = map[string]bool{}, map[string]string{}
	attrs := func(kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			names["attribute "+string(kv.Key)] = true
		}
	}
	for _, s := range h.ended() {
		names["span "+s.Name()] = true
		attrs(s.Attributes())
		for _, e := range s.Events() {
			names["event "+e.Name] = true
			attrs(e.Attributes)
		}
	}
	for _, sm := range h.collect().ScopeMetrics {
		for _, m := range sm.Metrics {
			names["metric "+m.Name] = true
			units[m.Name] = m.Unit
			sets, ok := attrSets(m)
			if !ok {
				t.Fatalf("metric %s: unhandled data %T", m.Name, m.Data)
			}
			for _, s := range sets {
				attrs(s.ToSlice())
			}
		}
	}
	return names, units
}

// declaredNames returns the names.go constants, each "category name",
// and the span names of database round trips: the obs.DBOperation
// constants (Op…) of internal/obs/vocab.go.
func declaredNames(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	declared(t, "names.go", map[string]string{"span": "span", "event": "event", "attr": "attribute", "metric": "metric"}, out)
	declared(t, "../internal/obs/vocab.go", map[string]string{"Op": "span"}, out)
	if len(out) < 60 {
		t.Fatalf("%d names declared: the parse missed names.go or vocab.go", len(out))
	}
	return out
}

// declared adds to out the string constants of file whose name starts
// with a key of categories, each "category name"; in names.go every
// constant must have one.
func declared(t *testing.T, file string, categories map[string]string, out map[string]bool) {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, id := range vs.Names {
			cat := ""
			for prefix, c := range categories {
				if strings.HasPrefix(id.Name, prefix) {
					cat = c
				}
			}
			var lit *ast.BasicLit
			if i < len(vs.Values) {
				switch v := vs.Values[i].(type) {
				case *ast.BasicLit:
					lit = v
				case *ast.CallExpr: // attribute.Key("…")
					lit, _ = v.Args[0].(*ast.BasicLit)
				}
			}
			if (cat == "" || lit == nil) && file != "names.go" {
				continue // vocab.go: not an operation
			}
			if cat == "" || lit == nil {
				t.Fatalf("names.go: %s is not a span, event, attr or metric name constant", id.Name)
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			out[cat+" "+s] = true
		}
		return false
	})
}

// TestNamesMatchDocTable holds the table of every name in the public
// telemetry package's documentation to what the recorder records: a name
// recorded but missing from the table, or in the table but never
// recorded, fails it, as does a constant of names.go the table lacks or a
// metric whose unit differs from the table's.
func TestNamesMatchDocTable(t *testing.T) {
	t.Parallel()
	rows := docTable(t)
	table := map[string]docName{}
	for _, r := range rows {
		cat := r.category()
		if !slices.Contains([]string{"span", "event", "attribute", "metric"}, cat) {
			t.Errorf("%s: kind %q is not a span, event, attribute or metric", r.name, r.kind)
		}
		if r.unit == "" || strings.TrimSpace(r.meaning) == "" {
			t.Errorf("%s: no unit or meaning", r.name)
		}
		if _, dup := table[cat+" "+r.name]; dup {
			t.Errorf("%s %s is in the table twice", cat, r.name)
		}
		table[cat+" "+r.name] = r
	}

	recorded, units := recordEverything(t)
	for n := range recorded {
		if _, ok := table[n]; !ok {
			t.Errorf("%s is recorded but missing from the table in telemetry/doc.go", n)
		}
	}
	for n := range table {
		if !recorded[n] {
			t.Errorf("%s is in the table in telemetry/doc.go but never recorded", n)
		}
	}
	for n := range declaredNames(t) {
		if _, ok := table[n]; !ok {
			t.Errorf("names.go declares %s, missing from the table in telemetry/doc.go", n)
		}
	}
	for name, unit := range units {
		want := table["metric "+name].unit
		if want == "-" {
			want = ""
		}
		if unit != want {
			t.Errorf("metric %s has unit %q, the table says %q", name, unit, want)
		}
	}
}
