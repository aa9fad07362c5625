package manager

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pglease/pglease/manager/internal/kernel"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/migrate"
)

// TestReleaseTriggerReportedQuietly: a Manager tells whether the lock
// table has the release trigger for its channel, as the metric
// pglease.release_trigger.installed (1 or 0). The trigger matters only
// when SyncGuard processes share the tables, so a Manager without it
// starts quietly: nothing at Info or above, one Debug record naming the
// fix (an Info one follows only when a SyncGuard holder is met:
// TestForeignHolderNamesMissingTrigger). With the trigger installed: no
// record about it at all.
func TestReleaseTriggerReportedQuietly(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := ctxT(t)
	mg, err := migrate.New(b.admin, pg.Config{}) // the trigger needs the table owner
	if err != nil {
		t.Fatal(err)
	}
	if err := mg.SetupReleaseTrigger(ctx, DefaultNotifyChannel); err != nil {
		t.Fatal(err)
	}
	start := func(pool *pgxpool.Pool) (*rig, *kernel.Signals) {
		t.Helper()
		r := newRig(t)
		sig := &kernel.Signals{}
		sig.Init()
		m, err := newManager("test", pool, false, Config{Telemetry: r.opts}, func(m *Manager) { m.k.Sig = sig })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close(context.Background()) })
		return r, sig
	}
	const note = "no release trigger on the lock table"
	installedMetric := func(r *rig) (int64, bool) {
		t.Helper()
		m, ok := r.metrics(t)["pglease.release_trigger.installed"]
		if !ok {
			return 0, false
		}
		return sumOf(t, m), true
	}

	r, sig := start(b.pool)
	if installed := wait(t, &sig.TriggerChecked); !installed {
		t.Fatal("the trigger was installed, the Manager says it is not")
	}
	if strings.Contains(r.logs.String(), note) {
		t.Fatalf("logged about the trigger although it is installed:\n%s", r.logs)
	}
	if v, ok := installedMetric(r); !ok || v != 1 {
		t.Fatalf("%s = %d (reported %v), want 1", "pglease.release_trigger.installed", v, ok)
	}
	// Another channel than the trigger's: missing for that Manager.
	r2 := newRig(t)
	sig2 := &kernel.Signals{}
	sig2.Init()
	m2, err := newManager("test", b.pool, false, Config{Telemetry: r2.opts, Config: pg.Config{NotifyChannel: "other_channel"}}, func(m *Manager) { m.k.Sig = sig2 })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m2.Close(context.Background()) })
	if installed := wait(t, &sig2.TriggerChecked); installed {
		t.Fatal("the trigger notifies another channel, the Manager says it is installed")
	}

	if err := mg.DropReleaseTrigger(ctx); err != nil {
		t.Fatal(err)
	}
	r, sig = start(b.pool)
	if installed := wait(t, &sig.TriggerChecked); installed {
		t.Fatal("the trigger was dropped, the Manager says it is installed")
	}
	var notes int
	for line := range strings.Lines(r.logs.String()) {
		var rec struct{ Level, Msg string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Level == "WARN" || rec.Level == "ERROR" || rec.Level == "INFO" {
			t.Errorf("a Manager without the trigger logged at %s: %s", rec.Level, rec.Msg)
		}
		if strings.Contains(rec.Msg, note) {
			notes++
			if rec.Level != "DEBUG" || !strings.Contains(rec.Msg, "SetupReleaseTrigger") {
				t.Errorf("the record about the missing trigger is at %s or does not name the fix: %s", rec.Level, rec.Msg)
			}
		}
	}
	if notes != 1 {
		t.Fatalf("%d records about the missing trigger, want 1:\n%s", notes, r.logs)
	}
	if v, ok := installedMetric(r); !ok || v != 0 {
		t.Fatalf("%s = %d (reported %v), want 0", "pglease.release_trigger.installed", v, ok)
	}
}

// TestForeignHolderNamesMissingTrigger: without the release trigger, a
// Manager says so at Info level only once it meets a SyncGuard holder (a
// lease without a pglease holder identity), and only once.
func TestForeignHolderNamesMissingTrigger(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	b := setup(t, setupOpts{cfg: Config{Telemetry: r.opts}})
	ctx := ctxT(t)
	if installed := wait(t, &b.sig.TriggerChecked); installed {
		t.Fatal("a fresh schema has the release trigger")
	}
	infos := func() int {
		n := 0
		for line := range strings.Lines(r.logs.String()) {
			var rec struct{ Level, Msg string }
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatal(err)
			}
			if rec.Level == "INFO" && strings.Contains(rec.Msg, "SyncGuard process") {
				if !strings.Contains(rec.Msg, "SetupReleaseTrigger") {
					t.Errorf("the record does not name the fix: %s", rec.Msg)
				}
				n++
			}
		}
		return n
	}
	if _, ok, err := b.m.TryAcquire(ctx, "fh/pglease-held"); err != nil || !ok {
		t.Fatalf("TryAcquire = %v, %v", ok, err)
	}
	if n := infos(); n != 0 {
		t.Fatalf("%d Info records before any SyncGuard holder:\n%s", n, r.logs)
	}
	for _, k := range []string{"fh/sg-1", "fh/sg-2"} {
		if id, err := sgAcquire(ctx, b.admin, k); err != nil || id == "" {
			t.Fatalf("SyncGuard acquire of %s: %q, %v", k, id, err)
		}
		if _, ok, err := b.m.TryAcquire(ctx, k); err != nil || ok {
			t.Fatalf("TryAcquire of a SyncGuard-held key = %v, %v", ok, err)
		}
	}
	if n := infos(); n != 1 {
		t.Fatalf("%d Info records after meeting SyncGuard holders, want 1:\n%s", n, r.logs)
	}
	if _, err := b.admin.Exec(ctx, "DELETE FROM syncguard_locks WHERE key LIKE 'fh/sg-%'"); err != nil {
		t.Fatal(err)
	}
}
