package telemetry

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/pglease/pglease/internal/obs"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// dbSpan is one database round trip, its client span begun at start (the
// fields of an obs.DBSpan).
type dbSpan struct {
	r     *recorder
	span  trace.Span
	op    obs.DBOperation
	batch int
	start time.Time
}

// StartDB starts the client span of one round trip carrying batch items.
// Call it in the worker goroutine, right before the SQL, and pass the
// returned ctx to pgx. The parent is:
//   - parent, when valid: the span of the operation the round trip is
//     made for (the acquire span of the one key's head waiter, the one
//     release it carries), so a caller's round trips are in its trace;
//   - otherwise the span in ctx (e.g. a heartbeat's), or none: a batch
//     carrying several keys or releases is a root span.
//
// served are the spans of the operations the round trip serves (every
// waiter of every key it carries, the releases, the held locks it
// extends): the span links to each valid one other than its parent, from
// its start, as the messaging conventions link a batch to the messages it
// processes. So every caller's trace reaches every round trip made for it,
// as a child or through a link; the operation spans also link to the
// round trip (acquisition.Attempt, ReleaseServed). At most obs.MaxLinks.
func (r *recorder) StartDB(ctx context.Context, op obs.DBOperation, batch int, parent trace.SpanContext, served ...trace.SpanContext) (context.Context, obs.DBSpan) {
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
	return ctx, obs.NewDBSpan(r, span, op, batch, time.Now())
}

// servedLinks returns a link to each valid span context of served other
// than parent, each once, at most obs.MaxLinks; nil (no allocation) when
// there is none.
func servedLinks(served []trace.SpanContext, parent trace.SpanContext) []trace.Link {
	var links []trace.Link
	for _, sc := range served {
		if len(links) == obs.MaxLinks {
			break
		}
		if !sc.IsValid() || sc.Equal(parent) || slices.ContainsFunc(links, func(l trace.Link) bool { return l.SpanContext.Equal(sc) }) {
			continue
		}
		links = append(links, trace.Link{SpanContext: sc})
	}
	return links
}

// End ends the round trip: ok is how many items succeeded (granted,
// extended, released; for a contended acquire batch, fewer than the batch
// size), err the round trip's error (nil when it completed, whatever the
// per-item answers). Records db.client.operation.duration and
// pglease.db.batch.size.
func (r *recorder) EndDB(span trace.Span, op obs.DBOperation, batch int, start time.Time, ok int, err error) {
	dbSpan{r: r, span: span, op: op, batch: batch, start: start}.end(ok, err)
}

func (d dbSpan) end(ok int, err error) {
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

// StartHeartbeat starts a pglease.heartbeat span for a round extending due
// locks, and returns ctx carrying it: pass that ctx to StartDB (with an
// invalid parent) so the extend round trip is its child. Loop or worker.
func (r *recorder) StartHeartbeat(ctx context.Context, due int) (context.Context, obs.Heartbeat) {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, span := r.tracer.Start(ctx, spanHeartbeat, startInternal...)
	if span.IsRecording() {
		span.SetAttributes(attrDue.Int(due))
	}
	return ctx, obs.NewHeartbeat(r, span)
}

// End ends the round: extended and lost count the locks extended and the
// locks found lost (report each loss with acquisition.Lost and each
// extend with acquisition.Extended too; these are the round's totals);
// err is the round trip's error, if any.
func (r *recorder) EndHeartbeat(span trace.Span, extended, lost int, err error) {
	if span == nil {
		return
	}
	if span.IsRecording() {
		outcome := outcomeOK
		if err != nil {
			outcome = outcomeError
		}
		attrs := []attribute.KeyValue{attrExtended.Int(extended), attrLost.Int(lost), attrOutcome.String(outcome)}
		if err != nil {
			et := errorType(err)
			attrs = append(attrs, semconv.ErrorTypeKey.String(et))
			span.SetStatus(codes.Error, et)
		}
		span.SetAttributes(attrs...)
	}
	span.End()
}
