package manager

import (
	"errors"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// dbSpanAttrs returns the attributes of the ended client spans named op.
func dbSpanAttrs(spans []sdktrace.ReadOnlySpan, op string) []attribute.Set {
	var out []attribute.Set
	for _, s := range spans {
		if s.SpanKind() == trace.SpanKindClient && s.Name() == op {
			out = append(out, attribute.NewSet(s.Attributes()...))
		}
	}
	return out
}

// TestTelemetrySemconvDatabaseAttributes: database spans and the
// db.client.operation.duration metric carry server.address, server.port
// and db.namespace of the pool's connection (a real server), and a round
// trip the server refused carries its SQLSTATE as db.response.status_code.
func TestTelemetrySemconvDatabaseAttributes(t *testing.T) {
	r := newRig(t)
	b := setup(t, setupOpts{cfg: Config{Telemetry: r.opts}})
	cc := b.pool.Config().ConnConfig
	if cc.Host == "" || cc.Port == 0 || cc.Database == "" {
		t.Fatalf("pool config without host/port/database: %q %d %q", cc.Host, cc.Port, cc.Database)
	}
	server := []attribute.KeyValue{
		semconv.DBSystemNamePostgreSQL,
		semconv.ServerAddress(cc.Host),
		semconv.ServerPort(int(cc.Port)),
		semconv.DBNamespace(cc.Database),
	}
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "semconv:k")
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	acq := dbSpanAttrs(r.spans.Ended(), spanAcquireMany)
	if len(acq) == 0 {
		t.Fatal("no acquire_many span")
	}
	for _, set := range acq {
		if !has(set, server...) {
			t.Errorf("acquire_many span %v lacks %v", set.ToSlice(), server)
		}
		if _, ok := set.Value(semconv.DBResponseStatusCodeKey); ok {
			t.Errorf("a successful round trip has db.response.status_code: %v", set.ToSlice())
		}
	}
	if n := countOf(t, r.metrics(t)["db.client.operation.duration"], append(server, semconv.DBOperationName(spanAcquireMany))...); n == 0 {
		t.Error("db.client.operation.duration has no point with the server attributes")
	}

	// A second Manager of the same rig on a schema whose lock table was
	// dropped after SetupSchema: the server answers 42P01 (relation does
	// not exist).
	broken, _ := pgtest.Pool(t)
	m2, err := newManager("test", broken, false, Config{Telemetry: r.opts, DisableNotify: true}, func(*Manager) {})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close(ctx)
	if err := m2.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := broken.Exec(ctx, "DROP TABLE syncguard_locks CASCADE"); err != nil { // CASCADE: the SQL API's views
		t.Fatal(err)
	}
	_, _, err = m2.TryAcquire(ctx, "semconv:missing")
	var st interface{ SQLState() string }
	if !errors.Is(err, pglease.ErrInvalidArgument) || !errors.As(err, &st) {
		t.Fatalf("TryAcquire without schema: %v", err)
	}
	want := append(server, semconv.DBResponseStatusCode(st.SQLState()), semconv.ErrorTypeKey.String("InvalidArgument"))
	found := false
	for _, set := range dbSpanAttrs(r.spans.Ended(), spanAcquireMany) {
		if _, ok := set.Value(semconv.DBResponseStatusCodeKey); ok {
			found = true
			if !has(set, want...) {
				t.Errorf("failed round trip span %v, want %v", set.ToSlice(), want)
			}
		}
	}
	if !found {
		t.Error("no acquire_many span with db.response.status_code")
	}
	if n := countOf(t, r.metrics(t)["db.client.operation.duration"], want...); n == 0 {
		t.Error("db.client.operation.duration has no point with db.response.status_code")
	}
}
