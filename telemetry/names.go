package telemetry

// ScopeName is the instrumentation scope name of every tracer and meter
// pglease creates: the module path, since pglease instruments itself.
// Filter or route pglease's spans and metrics by it.
const ScopeName = "github.com/pglease/pglease"

// version is the instrumentation version reported with ScopeName.
const version = "0.1.0"

// Version returns the instrumentation version reported with ScopeName:
// the pglease release that recorded the data, so a dashboard can tell
// which release's names and units (see the package documentation) apply.
func Version() string { return version }
