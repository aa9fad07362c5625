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

// TestLeader: A leads and writes with fence 1, B sees A lead; A resigns
// and B leads with fence 2; B shuts down and A leads with fence 3; the
// work table holds three fenced writes, the last with fence 3 by A.
func TestLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, pgtest.SchemaURL(t)); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	s := out.String()
	// Lines of one candidate, and lines one causes in the other, come in
	// order; the two candidates' other lines may interleave. (A's "term
	// ended" comes after its release, which may already have let B lead.)
	for _, order := range [][]string{
		{"A leads with fence 1", "A's fenced write: 1 row(s) updated", "B leads with fence 2", "B shuts down",
			"A leads with fence 3", "work table: fence 3, 3 writes, last by A"},
		{"B sees A lead", "B leads with fence 2"},
		{"A's fenced write: 1 row(s) updated", "A's term (fence 1) ended: resigned", "A sees B lead", "B shuts down"},
		{"B leads with fence 2", "B's fenced write: 1 row(s) updated", "B's term (fence 2) ended"},
	} {
		at := 0
		for _, want := range order {
			i := strings.Index(s[at:], want)
			if i < 0 {
				t.Fatalf("output lacks %q after position %d:\n%s", want, at, s)
			}
			at += i
		}
	}
	t.Log("\n" + s)
}
