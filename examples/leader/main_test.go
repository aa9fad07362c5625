package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestLeader: A leads, B waits; after A's backend is terminated B leads
// and A's lock reports LockLost (run checks the order and the cause).
func TestLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, pgtest.URL(t)); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	s := out.String()
	order := []string{"A leads", "B is waiting", "terminated", "B leads", "B steps down"}
	at := 0
	for _, want := range order {
		i := strings.Index(s[at:], want)
		if i < 0 {
			t.Fatalf("output lacks %q after position %d:\n%s", want, at, s)
		}
		at += i
	}
	if !strings.Contains(s, "A learns it lost leadership") {
		t.Fatalf("A's loss not reported:\n%s", s)
	}
}
