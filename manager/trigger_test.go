package manager

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/pg"
)

// TestReleaseTriggerMissingWarnsOnce (issue 9.8): a Manager tells whether
// the lock table has the release trigger for its channel. With it: no
// warning. Without it (dropped): one Warn log record naming the fix, and
// pglease.release_trigger.missing = 1.
func TestReleaseTriggerMissingWarnsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	store, err := pg.New(b.admin, pg.Config{}) // the trigger needs the table owner
	if err != nil {
		t.Fatal(err)
	}
	if err := store.SetupReleaseTrigger(ctx, DefaultNotifyChannel); err != nil {
		t.Fatal(err)
	}
	start := func(pool *pgxpool.Pool) (*rig, *signals) {
		t.Helper()
		r := newRig(t)
		sig := &signals{}
		sig.init()
		m, err := newManager("test", pool, false, Config{Telemetry: r.opts}, func(m *Manager) { m.sig = sig })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close(context.Background()) })
		return r, sig
	}
	const warning = "no release trigger on the lock table"

	r, sig := start(b.pool)
	if installed := wait(t, &sig.triggerChecked); !installed {
		t.Fatal("the trigger was installed, the Manager says it is not")
	}
	if strings.Contains(r.logs.String(), warning) {
		t.Fatalf("warned with the trigger installed:\n%s", r.logs)
	}
	// Another channel than the trigger's: missing for that Manager.
	r2 := newRig(t)
	sig2 := &signals{}
	sig2.init()
	m2, err := newManager("test", b.pool, false, Config{Telemetry: r2.opts, NotifyChannel: "other_channel"}, func(m *Manager) { m.sig = sig2 })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m2.Close(context.Background()) })
	if installed := wait(t, &sig2.triggerChecked); installed {
		t.Fatal("the trigger notifies another channel, the Manager says it is installed")
	}

	if err := store.DropReleaseTrigger(ctx); err != nil {
		t.Fatal(err)
	}
	r, sig = start(b.pool)
	if installed := wait(t, &sig.triggerChecked); installed {
		t.Fatal("the trigger was dropped, the Manager says it is installed")
	}
	if n := strings.Count(r.logs.String(), warning); n != 1 {
		t.Fatalf("%d warnings about the missing trigger, want 1:\n%s", n, r.logs)
	}
	if !strings.Contains(r.logs.String(), "SetupReleaseTrigger") {
		t.Fatalf("the warning does not name the fix:\n%s", r.logs)
	}
	if got := sumOf(t, r.metrics(t)["pglease.release_trigger.missing"]); got != 1 {
		t.Fatalf("pglease.release_trigger.missing = %d, want 1", got)
	}
}
