package obs

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// DBSpan follows one database round trip (one transaction or statement,
// however many keys it carries): a SpanKindClient span named after the
// DBOperation. The zero DBSpan is valid and records nothing. It is a small
// value: pass it by value.
type DBSpan struct {
	r     *Recorder
	span  trace.Span
	op    DBOperation
	batch int
	start time.Time
}

// MaxLinks bounds the links StartDB gives one round trip's span: the
// OpenTelemetry SDK's default link limit per span, beyond which it would
// drop them anyway. A batch serving more callers links to the first
// MaxLinks (collect no more than that).
const MaxLinks = 128

// StartDB starts the client span of one round trip carrying batch items.
// Call it in the worker goroutine, right before the SQL, and pass the
// returned ctx to pgx. The parent is:
//   - parent, when valid: the span of the operation the round trip is
//     made for (the acquire span of the one key's head waiter, the one
//     release it carries), so a caller's round trips are in its trace;
//   - otherwise the span in ctx (e.g. a Heartbeat's), or none: a batch
//     carrying several keys or releases is a root span.
//
// served are the spans of the operations the round trip serves (every
// waiter of every key it carries, the releases, the held locks it
// extends): the span links to each valid one other than its parent, from
// its start, as the messaging conventions link a batch to the messages it
// processes. So every caller's trace reaches every round trip made for it,
// as a child or through a link; the operation spans also link to the
// round trip (Acquisition.Attempt, Release.Served). At most MaxLinks.
func (r *Recorder) StartDB(ctx context.Context, op DBOperation, batch int, parent trace.SpanContext, served ...trace.SpanContext) (context.Context, DBSpan) {
	if r == nil {
		return ctx, DBSpan{}
	}
	if ctx == nil {
		ctx = context.Background()
	}
	if parent.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, parent)
	}
	opts := startClient
	if links := servedLinks(served, trace.SpanContextFromContext(ctx)); len(links) > 0 {
		opts = append(opts[:len(opts):len(opts)], trace.WithLinks(links...))
	}
	ctx, span := r.tracer.Start(ctx, string(op), opts...)
	if span.IsRecording() {
		span.SetAttributes(
			semconv.DBSystemNamePostgreSQL,
			semconv.DBOperationName(string(op)),
			attrBatchSize.Int(batch))
		span.SetAttributes(r.dbAttrs...)
	}
	return ctx, DBSpan{r: r, span: span, op: op, batch: batch, start: time.Now()}
}

// servedLinks returns a link to each valid span context of served other
// than parent, each once, at most MaxLinks; nil (no allocation) when
// there is none.
func servedLinks(served []trace.SpanContext, parent trace.SpanContext) []trace.Link {
	var links []trace.Link
	for _, sc := range served {
		if len(links) == MaxLinks {
			break
		}
		if !sc.IsValid() || sc.Equal(parent) || slices.ContainsFunc(links, func(l trace.Link) bool { return l.SpanContext.Equal(sc) }) {
			continue
		}
		links = append(links, trace.Link{SpanContext: sc})
	}
	return links
}

// SpanContext returns the span's context, for Acquisition.Attempt,
// Release.Served and Acquisition.Lost links.
func (d DBSpan) SpanContext() trace.SpanContext {
	if d.span == nil {
		return trace.SpanContext{}
	}
	return d.span.SpanContext()
}

// End ends the round trip: ok is how many items succeeded (granted,
// extended, released; for a contended acquire batch, fewer than the batch
// size), err the round trip's error (nil when it completed, whatever the
// per-item answers). Records db.client.operation.duration and
// pglease.db.batch.size.
func (d DBSpan) End(ok int, err error) {
	if d.r == nil {
		return
	}
	r := d.r
	now := time.Now()
	ctx := context.Background()
	o := r.dbOpts(d.op)
	r.batchSize.Record(ctx, int64(d.batch), o.batch.rec...)
	durOpt := o.success.rec
	var status []attribute.KeyValue // db.response.status_code: the SQLSTATE, when the server answered one
	if code := sqlState(err); code != "" {
		status = []attribute.KeyValue{semconv.DBResponseStatusCode(code)}
	}
	if err != nil {
		kv := append([]attribute.KeyValue{semconv.DBSystemNamePostgreSQL, o.op, semconv.ErrorTypeKey.String(errorType(err))}, r.dbAttrs...)
		durOpt = []metric.RecordOption{metric.WithAttributes(append(kv, status...)...)}
	}
	r.dbDuration.Record(ctx, now.Sub(d.start).Seconds(), durOpt...)
	if d.span.IsRecording() {
		outcome := outcomeOK
		if err != nil {
			outcome = outcomeError
		}
		attrs := []attribute.KeyValue{attrBatchOK.Int(ok), attrOutcome.String(outcome)}
		if err != nil {
			et := errorType(err)
			attrs = append(attrs, semconv.ErrorTypeKey.String(et))
			attrs = append(attrs, status...)
			d.span.SetStatus(codes.Error, et)
		}
		d.span.SetAttributes(attrs...)
	}
	d.span.End()
	if err != nil && r.logEnabled(ctx, slog.LevelDebug) {
		r.log.LogAttrs(trace.ContextWithSpanContext(ctx, d.span.SpanContext()), slog.LevelDebug,
			"pglease: database round trip failed",
			slog.String("db.operation.name", string(d.op)),
			slog.Int("batch.size", d.batch),
			slog.String("error.type", errorType(err)))
	}
}

// Heartbeat follows one heartbeat round: all extends due in one tick,
// sent as one round trip. The zero Heartbeat is valid and records nothing.
type Heartbeat struct {
	r    *Recorder
	span trace.Span
}

// StartHeartbeat starts a pglease.heartbeat span for a round extending due
// locks, and returns ctx carrying it: pass that ctx to StartDB (with an
// invalid parent) so the extend round trip is its child. Loop or worker.
func (r *Recorder) StartHeartbeat(ctx context.Context, due int) (context.Context, Heartbeat) {
	if r == nil {
		return ctx, Heartbeat{}
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, span := r.tracer.Start(ctx, spanHeartbeat, startInternal...)
	if span.IsRecording() {
		span.SetAttributes(attrDue.Int(due))
	}
	return ctx, Heartbeat{r: r, span: span}
}

// SpanContext returns the heartbeat span's context (e.g. for Lost's by).
func (h Heartbeat) SpanContext() trace.SpanContext {
	if h.span == nil {
		return trace.SpanContext{}
	}
	return h.span.SpanContext()
}

// End ends the round: extended and lost count the locks extended and the
// locks found lost (report each loss with Acquisition.Lost and each
// extend with Acquisition.Extended too; these are the round's totals);
// err is the round trip's error, if any.
func (h Heartbeat) End(extended, lost int, err error) {
	if h.span == nil {
		return
	}
	if h.span.IsRecording() {
		outcome := outcomeOK
		if err != nil {
			outcome = outcomeError
		}
		attrs := []attribute.KeyValue{attrExtended.Int(extended), attrLost.Int(lost), attrOutcome.String(outcome)}
		if err != nil {
			et := errorType(err)
			attrs = append(attrs, semconv.ErrorTypeKey.String(et))
			h.span.SetStatus(codes.Error, et)
		}
		h.span.SetAttributes(attrs...)
	}
	h.span.End()
}
