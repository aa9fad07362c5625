package pgleasetest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pgleasetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFakeConformance(t *testing.T) {
	t.Parallel()
	pgleasetest.Conformance(t, func(t *testing.T, ttl time.Duration) pglease.Locker { return pgleasetest.NewFake(ttl) })
}

func TestManagerConformance(t *testing.T) {
	t.Parallel()
	// readme:begin conformance
	m, _ := pgleasetest.Start(t, manager.Config{})
	pgleasetest.Conformance(t, func(t *testing.T, ttl time.Duration) pglease.Locker {
		if ttl == 0 {
			return m.Locker() // leases extended until released, lost or revoked
		}
		return m.Locker(manager.WithTTL(ttl), manager.WithoutAutoExtend())
	})
	// readme:end conformance
}

func TestFakeBadTTL(t *testing.T) {
	ctx := context.Background()
	for _, ttl := range []time.Duration{-time.Second, 1500 * time.Microsecond} {
		l := pgleasetest.NewFake(ttl)
		if _, err := l.Acquire(ctx, "k"); !errors.Is(err, pglease.ErrInvalidArgument) {
			t.Errorf("NewFake(%v).Acquire = %v, want InvalidArgument", ttl, err)
		}
	}
}

// TestConformanceCatchesBrokenLockers runs the suite on Lockers that each
// break one rule (in a child test process, since the suite fails its t)
// and wants each run to fail in the subtest of that rule: the suite can
// fail.
func TestConformanceCatchesBrokenLockers(t *testing.T) {
	if os.Getenv("PGLEASETEST_BROKEN") != "" {
		t.Skip("in the child")
	}
	if testing.Short() {
		t.Skip("-short: the suite's own check needs no database and takes a minute (its TTL control waits out the suite's bound)")
	}
	t.Parallel()
	for broken, subtest := range map[string]string{
		"fence": "Fences", "cause": "Release", "try": "OneHolder", "ttl": "TTL", "nilctx": "BadInput",
		"dorevoke": "DoRevoke",
	} {
		t.Run(broken, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenLockerChild$", "-test.v")
			cmd.Env = append(os.Environ(), "PGLEASETEST_BROKEN="+broken)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a Locker that breaks %q:\n%s", broken, out)
			}
			if !strings.Contains(string(out), "--- FAIL: TestBrokenLockerChild/"+subtest+" ") {
				t.Errorf("the suite did not fail %s for a Locker that breaks %q:\n%s", subtest, broken, out)
			}
		})
	}
}

func TestBrokenLockerChild(t *testing.T) {
	broken := os.Getenv("PGLEASETEST_BROKEN")
	if broken == "" {
		t.Skip("run by TestConformanceCatchesBrokenLockers")
	}
	pgleasetest.Conformance(t, func(t *testing.T, ttl time.Duration) pglease.Locker {
		if broken == "ttl" {
			ttl = 0
		}
		return &brokenLocker{Locker: pgleasetest.NewFake(ttl), broken: broken}
	})
}

// brokenLocker breaks one rule of the Locker it wraps.
type brokenLocker struct {
	pglease.Locker
	broken string
}

type brokenLease struct {
	pglease.Lease
	l *brokenLocker
}

func (l *brokenLocker) wrap(lease pglease.Lease) pglease.Lease {
	if lease == nil {
		return nil
	}
	return brokenLease{lease, l}
}

func (l *brokenLocker) Acquire(ctx context.Context, key string) (pglease.Lease, error) {
	if l.broken == "nilctx" && ctx == nil {
		return nil, errors.New("an untyped error")
	}
	lease, err := l.Locker.Acquire(ctx, key)
	return l.wrap(lease), err
}

func (l *brokenLocker) TryAcquire(ctx context.Context, key string) (pglease.Lease, bool, error) {
	lease, ok, err := l.Locker.TryAcquire(ctx, key)
	if l.broken == "try" && !ok && err == nil {
		return nil, true, nil
	}
	return l.wrap(lease), ok, err
}

// Revoke is the fake's, so the suite's revocation subtests run.
func (l *brokenLocker) Revoke(ctx context.Context, key string) (bool, error) {
	return l.Locker.(interface {
		Revoke(ctx context.Context, key string) (bool, error)
	}).Revoke(ctx, key)
}

func (l *brokenLocker) Do(ctx context.Context, key string, fn func(ctx context.Context, lease pglease.Lease) error) error {
	err := l.Locker.Do(ctx, key, fn)
	if l.broken == "dorevoke" && errors.Is(err, pglease.ErrRevoked) {
		return nil // a lease revoked under a successful fn passes unseen
	}
	return err
}

func (b brokenLease) Fence() pglease.Fence {
	if b.l.broken == "fence" {
		return 1
	}
	return b.Lease.Fence()
}

func (b brokenLease) Err() error {
	if b.l.broken == "cause" && b.Lease.Err() != nil {
		return errors.New("ended")
	}
	return b.Lease.Err()
}
