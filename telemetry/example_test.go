package telemetry_test

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/telemetry"
)

// A Manager configured with an SDK TracerProvider records one span per
// operation and one client span per database round trip, identifying the
// key by hash only.
func Example() {
	ctx := context.Background()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(ctx)

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	m, err := manager.New(pool, manager.Config{
		DisableNotify: true, // no pglease.listen span, to keep the output short
		Telemetry:     telemetry.Config{TracerProvider: tp},
	})
	if err != nil {
		panic(err)
	}
	if err := m.SetupSchema(ctx); err != nil {
		panic(err)
	}
	lk, err := m.Acquire(ctx, "customer:alice@example.com")
	if err != nil {
		panic(err)
	}
	if err := lk.Release(ctx); err != nil {
		panic(err)
	}
	if err := m.Close(ctx); err != nil {
		panic(err)
	}

	for _, s := range spans.Ended() {
		line := s.Name()
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case "pglease.key.hash": // the names are in the package documentation's table
				line += " key.hash=" + kv.Value.AsString()[:8] + "…"
			case "pglease.outcome":
				line += " outcome=" + kv.Value.AsString()
			}
			if strings.Contains(kv.Value.String(), "alice") {
				line += " RAW KEY!"
			}
		}
		fmt.Println(line)
	}
	// Output:
	// pglease.acquire_many outcome=ok
	// pglease.acquire key.hash=a713a4a1… outcome=granted
	// pglease.release_many outcome=ok
	// pglease.release key.hash=a713a4a1… outcome=ok
}
