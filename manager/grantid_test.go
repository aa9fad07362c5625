package manager

import (
	"testing"

	"github.com/pglease/pglease/pg"
)

// TestLockGrantID: a Lock's GrantID is pg.GrantID of its lockId (what a
// pg.FenceGuard with a grant column stores), never the lockId, and a nil
// Lock's is "".
func TestLockGrantID(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	lk, err := b.m.Acquire(ctx, "grant-id")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx) //nolint:errcheck
	if got := lk.GrantID(); got != pg.GrantID(lk.hd.ID) || len(got) != 64 || got == lk.hd.ID {
		t.Fatalf("GrantID = %q, want pg.GrantID(lockId)", got)
	}
	var nilLock *Lock
	if nilLock.GrantID() != "" {
		t.Fatal("nil Lock GrantID not empty")
	}
}
