package deploy

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/telemetry"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// emitted runs a small fleet against a real PostgreSQL through the
// OpenTelemetry Prometheus exporter — grants, a contended wait that
// times out, readers and permits, extends, a revocation (a loss) — and
// returns the metric family names and label names a Prometheus scrape of
// it gets, and the two scrapes (while locks are held and an acquire
// waits; after the revocation). The fleet runs once per test binary.
func emitted(t *testing.T) (families, labels map[string]bool, scrapes [][]*dto.MetricFamily) {
	t.Helper()
	fleetOnce.Do(func() { fleet.families, fleet.labels, fleet.scrapes = runFleet(t) })
	if fleet.families == nil {
		t.Fatal("the fleet run failed (see the first test that ran it)")
	}
	return fleet.families, fleet.labels, fleet.scrapes
}

var (
	fleetOnce sync.Once
	fleet     struct {
		families, labels map[string]bool
		scrapes          [][]*dto.MetricFamily
	}
)

func runFleet(t *testing.T) (families, labels map[string]bool, scrapes [][]*dto.MetricFamily) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := pgtest.SchemaURL(t)
	registry := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	defer mp.Shutdown(context.Background())
	tcfg := telemetry.Config{MeterProvider: mp}
	a, err := manager.Open(ctx, url, manager.Config{Telemetry: tcfg, TTL: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	if err := a.SetupSchema(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := manager.Open(ctx, url, manager.Config{Telemetry: tcfg})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())

	held, err := a.Acquire(ctx, "jobs/nightly-export")
	if err != nil {
		t.Fatal(err)
	}
	// A contended wait that gives up.
	if _, err := b.Acquire(ctx, "jobs/nightly-export", manager.WithAcquireTimeout(300*time.Millisecond)); !errors.Is(err, pglease.ErrAcquisitionTimeout) {
		t.Fatalf("contended Acquire: %v", err)
	}
	// Readers and a permit.
	r, err := b.Acquire(ctx, "cache/catalog", manager.Shared())
	if err != nil {
		t.Fatal(err)
	}
	p, err := b.Acquire(ctx, "exports:slots", manager.WithLimit(3))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // a few extends of the 600 ms lease
	// The gauges while locks are held and an acquire waits.
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = b.Acquire(wctx, "jobs/nightly-export")
	}()
	time.Sleep(300 * time.Millisecond)
	families, labels = map[string]bool{}, map[string]bool{}
	gather := func() {
		fams, err := registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		scrapes = append(scrapes, fams)
		for _, f := range fams {
			families[f.GetName()] = true
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = true
				}
			}
		}
	}
	gather()
	wcancel()
	<-done
	// A revocation: the holder loses its lease.
	if _, _, err := b.Revoke(ctx, "jobs/nightly-export"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held.Done():
	case <-ctx.Done():
		t.Fatal("the revoked holder was never told")
	}
	for _, l := range []*manager.Lock{r, p} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	gather()
	return families, labels, scrapes
}
