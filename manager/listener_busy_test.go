package manager

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease/manager/internal/kernel"
)

// TestListenerBusyKeepsSession: a Manager that only receives
// notifications (here 20 a second, as when others wait on busy keys) and
// never sends a statement of its own keeps its listening session: the
// server's idle_session_timeout that pglease sets on it (shortened to
// 4 s) counts statements, not notifications received, so the listener
// must probe on its schedule whatever it receives. Over three timeouts'
// worth the listener never subscribes again.
func TestListenerBusyKeepsSession(t *testing.T) {
	t.Parallel()
	const idle = 4 * time.Second
	b := setup(t, setupOpts{hooks: kernel.TestHooks{ListenIdleTimeout: idle}})
	ctx := ctxT(t)
	wait(t, &b.sig.Listening)
	channel := b.m.cfg.NotifyChannel

	nctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-nctx.Done():
				return
			case <-tick.C:
			}
			// A wake-up for a key nobody here waits for: the loop ignores it.
			_, _ = b.admin.Exec(nctx, "SELECT pg_notify($1, 'busy-key-hash')", channel)
		}
	}()
	time.Sleep(3 * idle)
	stop()
	wg.Wait()
	n := 0
	for {
		select {
		case <-b.sig.Listening.Ch:
			n++
			continue
		default:
		}
		break
	}
	if n > 0 {
		t.Fatalf("the listening session was replaced %d times in %v while only receiving (idle_session_timeout %v)", n, 3*idle, idle)
	}
}
