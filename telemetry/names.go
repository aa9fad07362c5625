package telemetry

// ScopeName is the instrumentation scope name of every tracer and meter
// pglease creates: the module path, since pglease instruments itself.
// Filter or route pglease's spans and metrics by it.
const ScopeName = "github.com/pglease/pglease"
