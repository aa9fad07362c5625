package telemetry

import (
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Option configures New. Options cannot fail: a nil provider or logger
// means "use the default".
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	tp        trace.TracerProvider
	mp        metric.MeterProvider
	logger    *slog.Logger
	keySecret []byte
	rawKeys   bool
	db        []attribute.KeyValue
}

// WithTracerProvider sets the TracerProvider spans are created with. A nil
// provider, or no option, means the global one: otel.GetTracerProvider(),
// read once by New (the global provider delegates to one installed later).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp = tp })
}

// WithMeterProvider sets the MeterProvider instruments are created with. A
// nil provider, or no option, means otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.mp = mp })
}

// WithLogger sets the logger pglease writes its own records to (a lost
// lock, a failed extend or release, an acquire that failed). Records
// identify keys by hash only, as spans do. Default (nil or no option): no
// logging (slog.DiscardHandler).
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) { c.logger = l })
}

// WithKeySecret makes key hashes keyed: HMAC-SHA-256(secret, NFC(key)),
// truncated to its first 128 bits and printed as 32 lowercase hex digits.
// Without a secret the hash is SyncGuard's hashKey (24 hex digits), which
// anyone can compute, so low-entropy keys (order numbers, e-mail
// addresses) can be recovered from it by guessing. Use a random secret of
// at least 32 bytes and the same one in every process that should
// produce matching hashes. The secret is copied; an empty secret means no
// secret. It never appears in telemetry.
func WithKeySecret(secret []byte) Option {
	s := append([]byte(nil), secret...)
	return optionFunc(func(c *config) { c.keySecret = s })
}

// WithRawKeys adds the raw key, as attribute pglease.key and log field
// "key", next to its hash. For debugging only: keys may be personal or
// secret data (RELIABILITY.md §6.3), and this sends them to every span
// exporter and log sink. Default false. LockIds are never recorded,
// whatever the options.
func WithRawKeys(on bool) Option {
	return optionFunc(func(c *config) { c.rawKeys = on })
}

// WithDatabase names the database server and database the round trips go
// to: the semantic-convention attributes server.address, server.port and
// db.namespace on every database span and on db.client.operation.duration
// (empty or zero values are left out). The Manager sets it from its pool's
// connection configuration (host, port, database), before the options of
// Config.Telemetry, so an explicit WithDatabase there overrides it.
func WithDatabase(address string, port int, namespace string) Option {
	var kv []attribute.KeyValue
	if address != "" {
		kv = append(kv, semconv.ServerAddress(address))
	}
	if port > 0 {
		kv = append(kv, semconv.ServerPort(port))
	}
	if namespace != "" {
		kv = append(kv, semconv.DBNamespace(namespace))
	}
	return optionFunc(func(c *config) { c.db = kv })
}
