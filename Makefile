# pglease — the two commands a new user runs: `make test` and `make demo`.
# Both start a throwaway PostgreSQL (internal/pgtest) when DATABASE_URL is unset.

GO     ?= go
WITHPG  = $(GO) run ./internal/cmd/withpg

.PHONY: test fmt vet demo bench trace

test: fmt vet
	$(WITHPG) -- $(GO) test -race -count=1 -timeout 9m ./...

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
