package telemetry

import (
	"log/slog"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Config configures the spans, metrics and log records of a Manager
// (manager.Config.Telemetry). The zero value means the defaults: the
// global OpenTelemetry providers, no logging, and keys identified by
// SyncGuard's unkeyed hash. A Manager reads it once, in manager.New.
type Config struct {
	// TracerProvider creates the spans. Nil (the default) means the
	// global one, otel.GetTracerProvider(), read by manager.New (the
	// global provider delegates to one installed later). pglease never
	// takes a Tracer: it names its own, ScopeName with the release's
	// version.
	TracerProvider trace.TracerProvider
	// MeterProvider creates the instruments. Nil (the default) means
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Logger receives pglease's own records (a lost lock, a failed extend
	// or release, an acquire that failed). Records identify keys by hash
	// only, as spans do. Nil (the default) means no logging. Records are
	// written from the Manager's goroutines: give it a handler that does
	// not block.
	Logger *slog.Logger
	// KeySecret makes key hashes keyed: HMAC-SHA-256(secret, NFC(key)),
	// truncated to its first 128 bits and printed as 32 lowercase hex
	// digits. Without a secret (nil or empty, the default) the hash is
	// SyncGuard's hashKey (24 hex digits), which anyone can compute, so
	// low-entropy keys (order numbers, e-mail addresses) can be recovered
	// from it by guessing. Use a random secret of at least 32 bytes and
	// the same one in every process that should produce matching hashes.
	// It is copied by manager.New and never appears in telemetry.
	KeySecret []byte
	// RawKeys adds the raw key, as attribute pglease.key and
	// log field "key", next to its hash. For debugging only: keys may be
	// personal or secret data, and this sends them to every span exporter
	// and log sink. Default false. LockIds are never recorded, whatever
	// the configuration.
	RawKeys bool
}

// ScopeName is the instrumentation scope name of every tracer and meter
// pglease creates: the module path, since pglease instruments itself.
// Filter or route pglease's spans and metrics by it.
const ScopeName = "github.com/pglease/pglease"
