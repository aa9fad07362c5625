package manager

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestAbandonedWriterMarkLapses: a writer of another Manager, refused by
// a reader, marks the key (writer preference) and then gives up (its
// context is cancelled right after a refused attempt). A new reader of a
// third Manager gets the key once the mark lapses: 2 s after the writer's
// last attempt (5 s before), asserted with slack as under 3.5 s from the
// cancel.
func TestAbandonedWriterMarkLapses(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	const key = "rw:abandoned-writer"
	ttl := WithTTL(time.Minute)
	r1, err := b.m.Acquire(ctx, key, Shared(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	writer, wsig := b.newPeer(t, Config{})
	reader, _ := b.newPeer(t, Config{})
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	werr := make(chan error, 1)
	go func() {
		lk, err := writer.Acquire(wctx, key, ttl)
		if err == nil {
			_ = lk.Release(ctx)
			err = errors.New("the writer got the key while a reader held it")
		}
		werr <- err
	}()
	waitFor(t, &wsig.Retrying, func(k string) bool { return k == key }) // refused by r1: the key is marked
	cancel()
	t0 := time.Now()
	if err := <-werr; !errors.Is(err, context.Canceled) {
		t.Fatalf("writer: %v, want context.Canceled", err)
	}
	r2, err := reader.Acquire(ctx, key, Shared(), ttl)
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(t0)
	t.Logf("a new reader got the key %v after the waiting writer gave up", waited)
	if waited > 3500*time.Millisecond {
		t.Errorf("a new reader waited %v after the writer gave up; want the mark to lapse within 2 s of its last attempt", waited)
	}
	for _, lk := range []*Lock{r1, r2} {
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
