package heartbeat_test

import (
	"fmt"
	"time"

	"github.com/pglease/pglease/internal/heartbeat"
)

func ExampleLease() {
	start := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC) // just before the acquire was sent
	l := heartbeat.Lease{TTL: 3 * time.Second, Start: start}
	fmt.Println("extend at:    ", l.NextExtend().Sub(start))
	fmt.Println("trusted until:", l.TrustedUntil().Sub(start))
	fmt.Println("due at 0.5s:  ", l.Due(start.Add(500*time.Millisecond)))
	fmt.Println("due at 0.8s:  ", l.Due(start.Add(800*time.Millisecond)))
	fmt.Println("trusted at 2.7s:", l.Trusted(start.Add(2700*time.Millisecond)))
	// Output:
	// extend at:     1s
	// trusted until: 2.7s
	// due at 0.5s:   false
	// due at 0.8s:   true
	// trusted at 2.7s: false
}
