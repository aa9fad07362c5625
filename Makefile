# pglease — the two commands a new user runs: `make test` and `make demo`.
# Both start a throwaway PostgreSQL (internal/pgtest) when DATABASE_URL is unset.

GO     ?= go
WITHPG  = $(GO) run ./internal/cmd/withpg

.PHONY: test fmt vet demo bench trace

# pg/migrations/tooltest is a module of its own (goose and golang-migrate
# apply the migration files there, kept out of pglease's go.mod).
test: fmt vet
	$(WITHPG) -- sh -c '$(GO) test -race -count=1 -timeout 9m ./... && cd pg/migrations/tooltest && $(GO) test -race -count=1 -timeout 3m ./...'

fmt:
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

demo:
	$(WITHPG) -durable -- $(GO) run ./examples/demo

# make bench BENCHFLAGS="-duration 3s -docs"   (see bench/main.go for the flags)
bench:
	$(WITHPG) -durable -- $(GO) run ./bench $(BENCHFLAGS)

trace:
	$(WITHPG) -- $(GO) run ./examples/trace
