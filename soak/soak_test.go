package soak_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/soak/check"
	"github.com/pglease/pglease/soak/driver"
)

var controls = flag.Bool("soak.controls", false, "also run the negative controls (a deliberately broken worker per check; make soak-controls)")

// buildSoak builds the soak binary; with race, workers run under the race
// detector.
func buildSoak(t *testing.T, race bool) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "soak")
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/soak")
	cmd := exec.Command("go", args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func needPostgres(t *testing.T) {
	t.Helper()
	if _, err := pgtest.FindBinDir(); errors.Is(err, pgtest.ErrNoPostgres) {
		if os.Getenv("PGLEASE_REQUIRE_POSTGRES") != "" || os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// runDir returns a directory for a run's logs, kept (and named in the
// log) when the test fails.
func runDir(t *testing.T, name string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pglease-soak-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("run directory kept: %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	return dir
}

// smokeFaultTypes are the fault types of the smoke: those of the default
// mix that need nothing of the machine beyond the server, plus the clock
// steps (libfaketime under the server). table-lock, the pooler's, the
// disk's, VACUUM FULL and statement_timeout run in make soak only (a
// PgBouncer and a mount more, and each server fault a second or two of the
// smoke's 32, in which every type must occur).
func smokeFaultTypes() []string {
	skip := map[string]bool{driver.FTableLock: true, driver.FPoolPause: true, driver.FPoolReconnect: true, driver.FPoolRestart: true,
		driver.FDiskFull: true, driver.FVacuumFull: true, driver.FStmtTimeout: true}
	var out []string
	for _, ft := range driver.FaultTypes {
		if !skip[ft] {
			out = append(out, ft)
		}
	}
	return out
}

func smokeOptions(dir, bin string, seed uint64) driver.Options {
	mix := map[string]int{}
	for _, ft := range smokeFaultTypes() {
		mix[ft] = 1
	}
	return driver.Options{
		Dir: dir, Bin: bin, Seed: seed,
		Duration: 32 * time.Second, Tail: 4 * time.Second,
		Workers: 3, Keys: 3, AdvKeys: 2, LeaseG: 2, AdvG: 1,
		// TTL 1 s keeps the faults short; the 300 ms loss margin is what a
		// loaded 2-core CI machine with -race workers may delay a timer by.
		TTL: time.Second, Margin: 300 * time.Millisecond,
		AcquireTimeout: 3 * time.Second, CloseTimeout: 5 * time.Second,
		MaxHold: 20 * time.Millisecond, LongHold: 0.05,
		FaultEvery: 1100 * time.Millisecond, Mix: mix, RoundRobin: true,
		// One goroutine per worker on the other primitives: a semaphore
		// of 2 (three holders can contend for it), a reader-writer key,
		// sets from a pool of 4.
		PrimG: 1, SemKeys: 1, SemLimit: 2, RWKeys: 1, RWWriters: 0.2, SetKeys: 4,
		PrimHold: 200 * time.Millisecond, PrimPause: 100 * time.Millisecond,
	}
}

// TestSmoke is the soak in small: three -race worker processes, every
// fault type in turn for about 30 s, then every check. It fails on any
// violation, and when a fault type did not occur or the run did too
// little to mean anything.
func TestSmoke(t *testing.T) {
	needPostgres(t)
	bin := buildSoak(t, true)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	dir := runDir(t, "smoke")
	o := smokeOptions(dir, bin, seed)
	o.Log = t.Logf
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	meta, err := driver.Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if !meta.Race {
		t.Error("the workers were not built with -race")
	}
	rep, err := check.Run(dir)
	if err != nil {
		t.Fatal(err)
	}
	md := rep.Markdown()
	t.Log("\n" + md)
	v := rep.Violations()
	if v > 0 {
		t.Errorf("%d violations (seed %d)", v, seed)
	}
	for _, ft := range smokeFaultTypes() {
		if why, ok := meta.NotRun[ft]; ok {
			t.Logf("fault type %s not run on this machine: %s", ft, why)
			continue
		}
		if rep.FaultsByType[ft] == 0 {
			t.Errorf("fault type %s never ran", ft)
		}
	}
	if rep.LeaseGrants < 50 || rep.AdvGrants < 10 || rep.Writes < 50 {
		t.Errorf("too little happened: %d lease grants, %d advisory grants, %d counter writes", rep.LeaseGrants, rep.AdvGrants, rep.Writes)
	}
	if rep.Permits < 5 || rep.Readers < 5 || rep.PrimExclusive < 2 || rep.Sets < 5 {
		t.Errorf("too few of the other primitives: %d permits, %d readers, %d exclusive grants of their keys, %d sets", rep.Permits, rep.Readers, rep.PrimExclusive, rep.Sets)
	}
	for _, c := range []string{check.CFences, check.CRegister, check.CLinear, check.CHolderEnded, check.CRecovery, check.CClose,
		check.CSemBound, check.CRWExcl, check.CSets, check.CSharedFences} {
		if rep.Check(c).Checked == 0 {
			t.Errorf("check %s checked nothing", c)
		}
	}
	// A smoke revokes only a few live leases, and a revoked holder that
	// another fault paused or killed is skipped (with its reason): the
	// check must have examined a revoked lease, checked or skipped.
	if rv := rep.Check(check.CRevoked); rep.Revokes == 0 || rv.Checked+rv.Skipped == 0 {
		t.Errorf("check %s examined no revoked lease (%d revoked)", check.CRevoked, rep.Revokes)
	}
}

// control is one negative control: a broken mode and the checks that must
// catch it.
type control struct {
	name     string // default: broken
	broken   string
	mix      string
	race     bool
	dur      time.Duration // default 15 s
	every    time.Duration // mean interval between faults; default 1.1 s
	longHold float64       // default 0.02
	regular  bool          // faults every `every` exactly
	targets  []int         // worker faults only on these
	opts     func(*driver.Options)
	want     []string
	// wantSeen, when set, must be in an example of every check of want
	// (e.g. "(server)": the failure was seen in the server's log).
	wantSeen string
}

var controlList = []control{
	{broken: "no-fence:0", mix: "sigstop=1,blackhole=1", want: []string{check.CRegister, check.CLinear}},
	// Faults on worker 0 only, long holds: the worker that ignores its
	// loss is still working when the key is granted again (short holds
	// often ended by themselves first, and the control passed by chance).
	{broken: "ignore-loss:0", mix: "blackhole=1", longHold: 0.5, targets: []int{0}, want: []string{check.CHolderEnded}},
	{broken: "old-fence:0", mix: "blackhole=1,cut=1", want: []string{check.CWrites}},
	{broken: "fence-rollback", mix: "blackhole=1", want: []string{check.CFences, check.CSharedFences}},
	// Long holds, so that leases are live when the driver moves their
	// expiry back.
	{broken: "clock-jump", mix: "blackhole=1", longHold: 0.5, want: []string{check.CNoticeTimely, check.CHolderEnded}},
	// The liveness bounds are 14 s (recovery) and 19 s (key gap) here, so
	// these runs are longer.
	// One fault on worker 0 at 18 s, the next 18 s later (more than the
	// 14 s bound): a recovery cut short by the next fault on the same
	// worker within the bound would not count.
	{broken: "stall:0", mix: "cut=1", dur: 40 * time.Second, every: 18 * time.Second, regular: true, targets: []int{0}, want: []string{check.CRecovery}},
	{broken: "hog:0", mix: "terminate-listen=1", dur: 30 * time.Second, want: []string{check.CStarve}},
	{broken: "slow-close:0", mix: "cut=1", want: []string{check.CClose}},
	{broken: "no-close:0", mix: "cut=1", want: []string{check.CLeftovers, check.CClose}},
	{broken: "uncoded:0", mix: "cut=1,blackhole=1", want: []string{check.CCoded}},
	{broken: "panic:0", mix: "cut=1", want: []string{check.CHygiene}},
	{broken: "race:0", mix: "cut=1", race: true, want: []string{check.CHygiene}},
	{broken: "leak:0", mix: "cut=1", want: []string{check.CHygiene}},
	// The primitives' controls. Worker 0 runs two goroutines of only the
	// broken primitive, so that it breaks it even with nobody else there:
	// with a semaphore of 1, each of its permits is refused while its
	// other goroutine holds one; its two readers, logged as writers,
	// overlap.
	{broken: "fake-permit:0", mix: "cut=1", opts: func(o *driver.Options) { o.PrimG, o.SemLimit = 2, 1 }, want: []string{check.CSemBound}},
	{broken: "reader-as-writer:0", mix: "cut=1", opts: func(o *driver.Options) { o.PrimG = 2 }, want: []string{check.CRWExcl}},
	{broken: "partial-set", mix: "cut=1", want: []string{check.CSets}},
	// The server side of the semaphore and reader-writer checks: the
	// driver's triggers commit a permit nobody holds next to each permit,
	// a reader nobody holds next to each writer.
	{broken: "extra-permit", mix: "cut=1", want: []string{check.CSemBound}, wantSeen: "(server)"},
	{broken: "reader-with-writer", mix: "cut=1", want: []string{check.CRWExcl}, wantSeen: "(server)"},
	// Revokes of worker 0's leases, which it ignores: it works on (fenced)
	// for 4 TTL.
	{broken: "ignore-revoke:0", mix: "revoke=1", targets: []int{0}, want: []string{check.CRevoked}, wantSeen: "after it was told of the revoke"},
	// The faults of the server, the pooler and the operator. Under clock
	// steps (forward by up to 3 TTL: leases end on the server before their
	// holders' windows), a writer without the fence lands stale writes:
	// the fence, not time, is what keeps them out.
	{name: "clock-step/no-fence:0", broken: "no-fence:0", mix: "clock-step=1", every: 2 * time.Second, longHold: 0.3, want: []string{check.CRegister, check.CLinear}},
	// Behind a pooler that PAUSEs longer than the TTL (every worker behind
	// it), a worker that keeps working after its loss notice: the others
	// are granted its keys after RESUME while it works on.
	{name: "pool-pause/ignore-loss:0", broken: "ignore-loss:0", mix: "pool-pause=1", dur: 30 * time.Second, every: 3 * time.Second, longHold: 0.5,
		opts: func(o *driver.Options) { o.Pooled = o.Workers }, want: []string{check.CHolderEnded}},
	// DELETE FROM the lock table: a holder that works on (fenced, past
	// refusals) for 4 TTL past the loss its next extend reveals.
	{name: "delete-rows/ignore-delete:0", broken: "ignore-delete:0", mix: "delete-rows=1", every: 2 * time.Second,
		want: []string{check.CRevoked}, wantSeen: "after it was told of the revoke"},
	// A full disk: a client that reports a failed acquire as a grant.
	{name: "disk-full/fake-grant:0", broken: "fake-grant:0", mix: "disk-full=1", every: 2 * time.Second, want: []string{check.CGrantsReal}},
	// The fair queue: every worker runs with FairQueue but worker 0, whose
	// Manager has no queue and which polls keys with TryAcquire, taking
	// them ahead of the others' tickets. Long holds make waits longer than
	// fair-order's tolerance; the few faults hit worker 2 only.
	{broken: "jump-queue:0", mix: "cut=1", every: 5 * time.Second, regular: true, targets: []int{2}, longHold: 0.2,
		opts: func(o *driver.Options) { o.Fair = true }, want: []string{check.CFair}},
}

// TestControls runs a short soak per broken mode and checks that the
// checks meant to catch it fail (make soak-controls).
func TestControls(t *testing.T) {
	if !*controls {
		t.Skip("negative controls run with -soak.controls (make soak-controls)")
	}
	needPostgres(t)
	bins := map[bool]string{false: buildSoak(t, false), true: buildSoak(t, true)}
	for _, c := range controlList {
		name := c.name
		if name == "" {
			name = c.broken
		}
		t.Run(strings.ReplaceAll(name, ":", "_"), func(t *testing.T) {
			dir := runDir(t, "control")
			mix, err := driver.ParseMix(c.mix)
			if err != nil {
				t.Fatal(err)
			}
			o := smokeOptions(dir, bins[c.race], uint64(time.Now().UnixNano()))
			o.Duration, o.Workers, o.Keys, o.Mix, o.RoundRobin, o.Broken = 15*time.Second, 3, 2, mix, false, c.broken
			if c.dur > 0 {
				o.Duration = c.dur
			}
			o.LongHold = 0.02
			if c.longHold > 0 {
				o.LongHold = c.longHold
			}
			if c.every > 0 {
				o.FaultEvery = c.every
			}
			o.Regular, o.Targets = c.regular, c.targets
			if c.opts != nil {
				c.opts(&o)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			if _, err := driver.Run(ctx, o); err != nil {
				t.Fatal(err)
			}
			rep, err := check.Run(dir)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, ch := range rep.Checks {
				if ch.Failed > 0 {
					got = append(got, fmt.Sprintf("%s=%d", ch.Name, ch.Failed))
				}
			}
			t.Logf("%s: failed checks %v", c.broken, got)
			for _, ch := range rep.Checks {
				if ch.Failed > 0 && !slices.Contains(c.want, ch.Name) {
					t.Logf("also %s: %s", ch.Name, strings.Join(ch.Examples[:min(3, len(ch.Examples))], "; "))
				}
			}
			for _, w := range c.want {
				t.Logf("%s: %d checked, %d skipped, %d failed", w, rep.Check(w).Checked, rep.Check(w).Skipped, rep.Check(w).Failed)
				if rep.Check(w).Failed == 0 {
					t.Errorf("%s: check %s did not fail", c.broken, w)
				} else if c.wantSeen != "" && !slices.ContainsFunc(rep.Check(w).Examples, func(e string) bool { return strings.Contains(e, c.wantSeen) }) {
					t.Errorf("%s: check %s failed, but no example has %q: %v", c.broken, w, c.wantSeen, rep.Check(w).Examples[:min(3, len(rep.Check(w).Examples))])
				}
			}
		})
	}
}
