# pglease — the two commands a new user runs: `make test` and `make demo`.
# Both start a throwaway PostgreSQL (internal/pgtest) when DATABASE_URL is unset.

GO     ?= go
WITHPG  = $(GO) run ./internal/cmd/withpg

# staticcheck comes from the Go module proxy like every module; v0.7.0 is the
# newest release whose own go.mod allows Go 1.25 (v0.8.x need 1.26).
STATICCHECK = $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.7.0

.PHONY: test fmt vet staticcheck demo bench trace

# pg/migrations/tooltest is a module of its own (goose and golang-migrate
# apply the migration files there, kept out of pglease's go.mod).
test: fmt vet staticcheck
	$(WITHPG) -- sh -c '$(GO) test -race -count=1 -timeout 9m ./... && cd pg/migrations/tooltest && $(GO) test -race -count=1 -timeout 3m ./...'

fmt:
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

staticcheck:
	$(STATICCHECK) ./...

demo:
	@echo "make demo: compiling the demo, its worker and the PostgreSQL harness (about 30 s the first time) …"
	@$(GO) build ./examples/demo ./examples/worker ./internal/cmd/withpg
	@if [ -z "$$DATABASE_URL" ]; then echo "make demo: starting a throwaway PostgreSQL (initdb and start, a few seconds) …"; \
	else echo "make demo: using DATABASE_URL, in a schema of its own that is dropped at the end …"; fi
	$(WITHPG) -durable -- $(GO) run ./examples/demo

# make bench BENCHFLAGS="-duration 3s -docs"   (see bench/main.go for the flags)
bench:
	$(WITHPG) -durable -- $(GO) run ./bench $(BENCHFLAGS)

# make trace TRACEFLAGS="-spans spans.json"   also writes the raw spans to spans.json
trace:
	$(WITHPG) -- $(GO) run ./examples/trace $(TRACEFLAGS)
