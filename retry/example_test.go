package retry_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/retry"
)

// A fixed delay: a Multiplier of 1 keeps every attempt Base after the
// last one, and NoJitter makes it exact.
func ExamplePolicy_fixed() {
	cfg := manager.Config{Retry: retry.Policy{Base: 250 * time.Millisecond, Multiplier: 1, Jitter: retry.NoJitter}}
	_ = cfg // manager.New(pool, cfg)
}

// The schedule the Manager runs for a contended key, for code that
// retries something itself: here without jitter, to show the delays,
// and with backoff.Retry, bounded by a context, where the schedule
// itself never gives up.
func ExamplePolicy_NewBackOff() {
	b, err := retry.Policy{Base: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond, Jitter: retry.NoJitter}.NewBackOff()
	if err != nil {
		panic(err)
	}
	fmt.Println(b.NextBackOff(), b.NextBackOff(), b.NextBackOff(), b.NextBackOff())

	b.Reset()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	tries := 0
	err = backoff.Retry(func() error {
		if tries++; tries < 3 {
			return errors.New("busy")
		}
		return nil
	}, backoff.WithContext(b, ctx))
	fmt.Println("tries:", tries, "err:", err)
	// Output:
	// 10ms 20ms 40ms 50ms
	// tries: 3 err: <nil>
}
