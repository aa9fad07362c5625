package manager_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/manager"
)

func ExampleManager_Revoke() {
	ctx := context.Background()
	m, _, done := exampleManager(ctx)
	defer done()

	// readme:begin revoke
	lk, err := m.Acquire(ctx, "example:stuck-job", manager.WithLockDelay(2*time.Second))
	if err != nil {
		panic(err)
	}

	// An operator, or any process with a Manager on the same tables:
	revoked, notBefore, err := m.Revoke(ctx, "example:stuck-job")
	if err != nil {
		panic(err)
	}
	fmt.Println("revoked:", revoked, "delay until set:", !notBefore.IsZero())

	<-lk.Done() // the holder is told at once, wherever it runs
	fmt.Println("holder:", errors.Is(lk.Err(), pglease.ErrRevoked))
	fmt.Println("its release:", errors.Is(lk.Release(ctx), pglease.ErrRevoked))

	// The lease's lock delay keeps the key free for 2 s after the revoke.
	_, ok, err := m.TryAcquire(ctx, "example:stuck-job")
	fmt.Println("taken within the delay:", ok, err)

	// Readers and semaphore permits too: all of a key's, or the ones named
	// by their grant ids (Lock.GrantID, which a holder may log).
	hung, err := m.Acquire(ctx, "example:slots", manager.WithLimit(3))
	if err != nil {
		panic(err)
	}
	busy, err := m.Acquire(ctx, "example:slots", manager.WithLimit(3))
	if err != nil {
		panic(err)
	}
	revoked, _, err = m.Revoke(ctx, "example:slots", hung.GrantID())
	if err != nil {
		panic(err)
	}
	<-hung.Done()
	fmt.Println("permits revoked:", revoked, errors.Is(hung.Err(), pglease.ErrRevoked), busy.Err())
	// readme:end revoke
	busy.Release(ctx)

	// Output:
	// revoked: 1 delay until set: true
	// holder: true
	// its release: true
	// taken within the delay: false <nil>
	// permits revoked: 1 true <nil>
}

func ExampleLock_ReleaseRequested() {
	ctx := context.Background()
	m, _, done := exampleManager(ctx)
	defer done()

	// readme:begin request
	lk, err := m.Acquire(ctx, "example:report")
	if err != nil {
		panic(err)
	}

	// Another process (or this one) asks for the key; nothing is taken.
	if err := m.RequestRelease(ctx, "example:report"); err != nil {
		panic(err)
	}

	select {
	case <-lk.ReleaseRequested(): // the holder decides: here, it lets go
		fmt.Println("asked to release")
		lk.Release(ctx)
	case <-lk.Done():
	}
	// readme:end request

	// Output:
	// asked to release
}

func ExampleManager_Watch() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, _, done := exampleManager(ctx)
	defer done()

	// readme:begin watch
	events, err := m.Watch(ctx, "example:leader") // closed when ctx ends
	if err != nil {
		panic(err)
	}
	ev := <-events // the key's state first
	fmt.Println(ev.Kind)

	lk, err := m.Acquire(ctx, "example:leader") // here, or in any process
	if err != nil {
		panic(err)
	}
	ev = <-events
	fmt.Println(ev.Kind, ev.Fence == lk.Fence(), ev.Holder != "")

	lk.Release(ctx)
	ev = <-events
	fmt.Println(ev.Kind, ev.Fence == lk.Fence())
	// readme:end watch

	// Output:
	// released
	// granted true true
	// released true
}
