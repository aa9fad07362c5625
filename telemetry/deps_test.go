package telemetry

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestAPIOnly enforces the contrib rule (depguard no-sdk-instrumentation):
// non-test files of this package and of internal/obs (the handles the
// Manager holds) import the OpenTelemetry API, never the SDK or an
// exporter.
func TestAPIOnly(t *testing.T) {
	t.Parallel()
	for _, dir := range []string{".", "../internal/obs"} {
		checkAPIOnly(t, dir)
	}
}

func checkAPIOnly(t *testing.T, dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	allowed := []string{
		"go.opentelemetry.io/otel", "go.opentelemetry.io/otel/attribute", "go.opentelemetry.io/otel/codes",
		"go.opentelemetry.io/otel/metric", "go.opentelemetry.io/otel/metric/noop",
		"go.opentelemetry.io/otel/trace", "go.opentelemetry.io/otel/semconv/v1.40.0",
	}
	checked := 0
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, name), nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if !strings.HasPrefix(path, "go.opentelemetry.io/") {
				continue
			}
			ok := false
			for _, a := range allowed {
				ok = ok || path == a
			}
			if !ok {
				t.Errorf("%s imports %s: only the OpenTelemetry API is allowed outside tests", name, path)
			}
		}
	}
	if checked == 0 {
		t.Fatalf("no source files checked in %s", dir)
	}
}
