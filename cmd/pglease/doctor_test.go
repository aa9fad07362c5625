package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/pgtest"
)

// doctorFinding is one finding of `doctor --json`.
type doctorFinding struct {
	Check, Level, Found, Do string
}

// doctorJSON runs `doctor --json` and returns its exit code and findings
// by check.
func doctorJSON(t *testing.T, url string, args ...string) (int, map[string]doctorFinding, result) {
	t.Helper()
	r := run(t, url, "", append([]string{"doctor", "--json"}, args...)...)
	var rep struct {
		Level    string
		ExitCode int `json:"exit_code"`
		Findings []doctorFinding
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, r)
	}
	if rep.ExitCode != r.code {
		t.Fatalf("JSON says exit %d, the process exited %d:\n%s", rep.ExitCode, r.code, r)
	}
	out := map[string]doctorFinding{}
	for _, f := range rep.Findings {
		out[f.Check] = f
	}
	return r.code, out, r
}

func wantFinding(t *testing.T, fs map[string]doctorFinding, r result, check, level string, in ...string) {
	t.Helper()
	f, ok := fs[check]
	if !ok {
		t.Fatalf("no %q finding:\n%s", check, r)
	}
	if f.Level != level {
		t.Fatalf("%s: level %s, want %s:\n%s", check, f.Level, level, r)
	}
	for _, s := range in {
		if !strings.Contains(f.Found+" "+f.Do, s) {
			t.Fatalf("%s: finding lacks %q:\n%s", check, s, r)
		}
	}
	if level != levelOK && level != levelInfo && f.Do == "" {
		t.Fatalf("%s: a %s finding without what to do:\n%s", check, level, r)
	}
}

// TestDoctorHealthy: on a schema set up like production (owner role,
// roles.sql's runtime role) doctor finds nothing to fix and exits 0; the
// connection string's password is never printed.
func TestDoctorHealthy(t *testing.T) {
	t.Parallel()
	w := newWorld(t, true)
	code, fs, r := doctorJSON(t, w.url)
	if code != exitOK {
		t.Fatalf("doctor on a healthy schema: exit %d\n%s", code, r)
	}
	wantFinding(t, fs, r, "server", levelOK, "PostgreSQL")
	wantFinding(t, fs, r, "schema", levelOK, "current")
	wantFinding(t, fs, r, "privileges", levelOK, "every privilege")
	wantFinding(t, fs, r, "release trigger", levelInfo, "not needed")
	wantFinding(t, fs, r, "listen", levelOK)
	wantFinding(t, fs, r, "replication", levelInfo, "no standby")
	wantFinding(t, fs, r, "clock", levelOK, "server's clock")
	// The text form, and no secret in any output.
	const secret = "doctor-secret-8d1f"
	r = run(t, w.url, "", "doctor", "--listen-url", w.url+"&password="+secret)
	want(t, r, exitOK, "OK    listen", "(exit 0)")
	if strings.Contains(r.stdout+r.stderr, secret) {
		t.Fatalf("doctor printed the password:\n%s", r)
	}
}

// TestDoctorFindsWhatOperatorsGetWrong: a runtime role without DELETE on
// the shared-hold table (docs that omitted it made every acquire fail),
// one with DELETE on the fence table, a SyncGuard process's lease without
// the release trigger, and a schema not set up: each is a finding that
// says what to do, with the exit code a script tells apart.
func TestDoctorFindsWhatOperatorsGetWrong(t *testing.T) {
	t.Parallel()
	rs := pgtest.RoleSchemaForTest(t)
	admin := rs.AdminPool(t)
	c := ctx(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := admin.Exec(c, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec("REVOKE DELETE ON syncguard_locks_shared FROM " + rs.Runtime)
	code, fs, r := doctorJSON(t, rs.RuntimeURL)
	if code != exitDoctorProblem {
		t.Fatalf("missing privilege: exit %d, want %d\n%s", code, exitDoctorProblem, r)
	}
	wantFinding(t, fs, r, "privileges", levelFail, "DELETE on table", "syncguard_locks_shared", "42501", "pglease sql roles")
	// The same, checked by an administrator for the runtime role.
	code, fs, r = doctorJSON(t, rs.Admin, "--role", rs.Runtime, "--lock-table", rs.Schema+".syncguard_locks",
		"--fence-table", rs.Schema+".syncguard_fence_counters")
	if code != exitDoctorProblem {
		t.Fatalf("--role: exit %d, want %d\n%s", code, exitDoctorProblem, r)
	}
	wantFinding(t, fs, r, "privileges", levelFail, "syncguard_locks_shared")
	exec("GRANT DELETE ON syncguard_locks_shared TO " + rs.Runtime)

	// A privilege it must not have: a warning.
	exec("GRANT DELETE ON syncguard_fence_counters TO " + rs.Runtime)
	code, fs, r = doctorJSON(t, rs.RuntimeURL)
	if code != exitDoctorWarn {
		t.Fatalf("DELETE on the fence table: exit %d, want %d\n%s", code, exitDoctorWarn, r)
	}
	wantFinding(t, fs, r, "privileges", levelWarn, "DELETE on the fence counter table", "REVOKE")
	exec("REVOKE DELETE ON syncguard_fence_counters FROM " + rs.Runtime)

	// A SyncGuard holder (a lease row without a holder identity) and no
	// release trigger.
	exec(`INSERT INTO syncguard_locks (key, lock_id, expires_at_ms, acquired_at_ms, fence, user_key)
		VALUES ('sg-key', $1, 9999999999999, 0, '000000000000001', 'sg-key')`, keys.NewLockID())
	code, fs, r = doctorJSON(t, rs.RuntimeURL)
	if code != exitDoctorWarn {
		t.Fatalf("SyncGuard holder without the trigger: exit %d, want %d\n%s", code, exitDoctorWarn, r)
	}
	wantFinding(t, fs, r, "release trigger", levelWarn, "1 lease row(s) have no pglease holder identity", "SetupReleaseTrigger")
	wantFinding(t, fs, r, "privileges", levelOK)

	// No schema: exit 5, like every command.
	code, fs, r = doctorJSON(t, pgtest.SchemaURL(t))
	if code != exitSchema {
		t.Fatalf("no schema: exit %d, want %d\n%s", code, exitSchema, r)
	}
	wantFinding(t, fs, r, "schema", levelFail, "pglease setup")
}

// TestDoctorListenThroughPooler: through a real PgBouncer in transaction
// mode a LISTEN hears nothing; doctor says so and what to set (exit 7);
// with --listen-url a direct connection, the LISTEN path is fine.
func TestDoctorListenThroughPooler(t *testing.T) {
	t.Parallel()
	b := pgtest.PgBouncerForTest(t, pgtest.BouncerOptions{PoolMode: pgtest.PoolTransaction, PoolSize: 1})
	schema := pgtest.Schema(t)
	url := b.URL + "?default_query_exec_mode=exec"
	if strings.Contains(b.URL, "?") {
		url = b.URL + "&default_query_exec_mode=exec"
	}
	direct := pgtest.URL(t)
	tables := []string{"--lock-table", schema + ".syncguard_locks", "--fence-table", schema + ".syncguard_fence_counters"}
	want(t, run(t, direct, "", append([]string{"setup"}, tables...)...), exitOK)
	code, fs, r := doctorJSON(t, url, tables...)
	if code != exitDoctorProblem {
		t.Fatalf("through a transaction-mode pooler: exit %d, want %d\n%s", code, exitDoctorProblem, r)
	}
	wantFinding(t, fs, r, "listen", levelFail, "transaction-mode pooler", "ListenConnString")
	code, fs, r = doctorJSON(t, url, append(tables, "--listen-url", direct)...)
	wantFinding(t, fs, r, "listen", levelOK, "ListenConnString")
	if code == exitDoctorProblem {
		t.Fatalf("with a direct --listen-url: exit %d\n%s", code, r)
	}
}
