package obs_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease/internal/obs"
	"github.com/pglease/pglease/telemetry"
)

// A contended acquire as it appears in a trace: the caller's
// pglease.acquire span holds one pglease.attempt event per database
// attempt and one client span per round trip; the first two attempts find
// the key held by another process and back off, the third is granted.
// The calls below are the ones the Manager makes.
func Example_contendedAcquire() {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	rec := obs.New(telemetry.Config{TracerProvider: tp}, obs.Database{})
	defer rec.Close()

	// Caller goroutine: Manager.Acquire(ctx, "payment:123", WithTTL(30s)).
	key := rec.Key("payment:123")
	_, acq := rec.StartAcquire(context.Background(), key,
		obs.AcquireInfo{Kind: obs.KindLease, TTL: 30 * time.Second})
	// Loop: the request joins the key's FIFO; no one else waits here.
	acq.Queued(obs.QueueInfo{})
	for i, outcome := range []obs.AttemptOutcome{
		obs.AttemptContended, obs.AttemptContended, obs.AttemptGranted,
	} {
		// Worker goroutine: one round trip, serving only this caller.
		_, db := rec.StartDB(context.Background(), obs.OpAcquireMany, 1, acq.SpanContext())
		ok := 0
		if outcome == obs.AttemptGranted {
			ok = 1
		}
		db.End(ok, nil)
		// Loop: the result arrives; schedule the next try with backoff.
		var retryIn time.Duration
		if outcome == obs.AttemptContended {
			retryIn = 100 * time.Millisecond << i
		}
		acq.Attempt(db.SpanContext(), outcome, retryIn)
	}
	acq.Granted(42) // loop, before replying to the caller

	printTree(spans.Ended())
	// Output:
	// pglease.acquire [internal] pglease.key.hash=a422dabee27fcc7ad506f372 pglease.lock.kind=lease pglease.outcome=granted pglease.acquire.attempts=3 pglease.acquire.contended=true pglease.acquire.coalesced=false pglease.fence=42 links=3
	//   event pglease.queued pglease.queue.position=0
	//   event pglease.attempt 1 contended retry_in=0.1s
	//   event pglease.attempt 2 contended retry_in=0.2s
	//   event pglease.attempt 3 granted
	//   pglease.acquire_many [client] db.system.name=postgresql pglease.batch.size=1 pglease.batch.ok=0
	//   pglease.acquire_many [client] db.system.name=postgresql pglease.batch.size=1 pglease.batch.ok=0
	//   pglease.acquire_many [client] db.system.name=postgresql pglease.batch.size=1 pglease.batch.ok=1
}

func printTree(spans []sdktrace.ReadOnlySpan) {
	sort.SliceStable(spans, func(i, j int) bool { return spans[i].StartTime().Before(spans[j].StartTime()) })
	get := func(attrs []attribute.KeyValue, k string) string {
		for _, kv := range attrs {
			if string(kv.Key) == k {
				return kv.Value.String()
			}
		}
		return "?"
	}
	show := func(s sdktrace.ReadOnlySpan, keys ...string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "%s [%s]", s.Name(), s.SpanKind())
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%s", k, get(s.Attributes(), k))
		}
		return b.String()
	}
	for _, root := range spans {
		if root.Name() != "pglease.acquire" {
			continue
		}
		fmt.Println(show(root, "pglease.key.hash", "pglease.lock.kind", "pglease.outcome",
			"pglease.acquire.attempts", "pglease.acquire.contended", "pglease.acquire.coalesced",
			"pglease.fence") + fmt.Sprintf(" links=%d", len(root.Links())))
		for _, e := range root.Events() {
			if e.Name == "pglease.queued" {
				fmt.Printf("  event %s pglease.queue.position=%s\n", e.Name, get(e.Attributes, "pglease.queue.position"))
				continue
			}
			line := fmt.Sprintf("  event %s %s %s", e.Name, get(e.Attributes, "pglease.attempt"), get(e.Attributes, "pglease.outcome"))
			if r := get(e.Attributes, "pglease.attempt.retry_in"); r != "?" {
				line += " retry_in=" + r + "s"
			}
			fmt.Println(line)
		}
		for _, s := range spans {
			if s.Parent().SpanID() == root.SpanContext().SpanID() && s.SpanKind() == trace.SpanKindClient {
				fmt.Println("  " + show(s, "db.system.name", "pglease.batch.size", "pglease.batch.ok"))
			}
		}
	}
}
