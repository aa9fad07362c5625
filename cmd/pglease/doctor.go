package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg/migrate"
)

// doctor's exit codes beside exitOK, exitFailed (it could not connect)
// and exitSchema (the schema is missing or not current, and nothing else
// is wrong): a script tells "fine", "look at this" and "broken" apart.
const (
	exitDoctorWarn    = 6 // a finding worth a look (warn), none broken
	exitDoctorProblem = 7 // something operators must fix (fail)
)

// Finding levels, in order of gravity.
const (
	levelOK   = "ok"
	levelInfo = "info"
	levelWarn = "warn"
	levelFail = "fail"
)

// finding is one check's result: what doctor found and, unless all is
// well, what to do. It never holds a connection string or a raw key.
type finding struct {
	Check string `json:"check"`
	Level string `json:"level"`
	Found string `json:"found"`
	Do    string `json:"do,omitempty"`
}

// doctorReport is doctor's output: each check's finding, and the worst.
type doctorReport struct {
	Time     time.Time `json:"time"`
	Level    string    `json:"level"`
	ExitCode int       `json:"exit_code"`
	Findings []finding `json:"findings"`
}

func gravity(level string) int {
	switch level {
	case levelInfo:
		return 1
	case levelWarn:
		return 2
	case levelFail:
		return 3
	}
	return 0
}

// fenceNever are the fence table's privileges the runtime role must not
// have: fence counters are never deleted.
var fenceNever = []string{"DELETE", "TRUNCATE"}

// doctorCmd is pglease doctor: the checks, and what to do for each.
type doctorCmd struct {
	a                        *app
	role, channel, listenURL string
	asJSON                   bool
}

func doctorFlags(a *app, fs *flag.FlagSet) runFunc {
	c := &doctorCmd{a: a}
	fs.StringVar(&c.role, "role", "", "check the privileges of this `ROLE` (default: the role the connection string logs in as, which should be the runtime role)")
	fs.StringVar(&c.channel, "notify-channel", manager.DefaultNotifyChannel, "the Managers' notify channel (manager.Config.NotifyChannel), for the release trigger's check")
	fs.Var(secretString{&c.listenURL}, "listen-url", "the Managers' manager.Config.ListenConnString, if they set one: the LISTEN path is checked through it too (never printed)")
	fs.BoolVar(&c.asJSON, "json", false, "print the findings as JSON")
	return c.run
}

// check checks doctor's flags and arguments, without any I/O; it parses
// --listen-url (nil without it).
func (c *doctorCmd) check(args []string) (*pgx.ConnConfig, error) {
	if len(args) != 0 {
		return nil, fail(exitUsage, "doctor takes no arguments (got %q)", args[0])
	}
	if err := store.CheckChannel("pglease doctor", c.channel); err != nil {
		return nil, fail(exitUsage, "bad --notify-channel: %v", err)
	}
	if len(c.role) > 63 || strings.ContainsAny(c.role, "\x00") {
		return nil, fail(exitUsage, "bad --role: at most 63 bytes")
	}
	if c.listenURL == "" {
		return nil, nil
	}
	if err := checkAuthority(c.listenURL); err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(c.listenURL)
	if err != nil {
		return nil, fail(exitUsage, "bad --listen-url: %s", parseReason(err))
	}
	return cfg, nil
}

func (c *doctorCmd) run(ctx context.Context, args []string) error {
	a := c.a
	listenCfg, err := c.check(args)
	if err != nil {
		return err
	}
	pool, st, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	dctx, cancel := a.withTimeout(ctx)
	defer cancel()
	mg, err := migrate.New(pool, a.c.config())
	if err != nil {
		return err
	}
	d := &doctorRun{pool: pool, st: st, mg: mg, n: st.Names(), role: c.role, channel: c.channel, listenCfg: listenCfg,
		secrets: append(passwords(a.c.url), passwords(c.listenURL)...)}
	rep := d.run(dctx)
	if c.asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printDoctor(a.stdout, rep)
	}
	if rep.ExitCode != exitOK {
		return &exitError{code: rep.ExitCode}
	}
	return nil
}

// doctorRun is one run of the checks.
type doctorRun struct {
	pool      *pgxpool.Pool
	st        *store.Store
	mg        *migrate.Migrator
	n         store.Names
	role      string
	channel   string
	listenCfg *pgx.ConnConfig
	secrets   []string
	findings  []finding
	version   int  // server_version_num
	schemaOK  bool // the schema is current
}

func (d *doctorRun) add(check, level, found, do string) {
	d.findings = append(d.findings, finding{Check: check, Level: level, Found: scrub(found, d.secrets), Do: scrub(do, d.secrets)})
}

// errf is a check that could not run: a warning with the cause, never
// a silent pass.
func (d *doctorRun) errf(check string, err error) {
	d.add(check, levelWarn, "could not check: "+err.Error(), "run doctor again; if it keeps failing, check this by hand (docs/operations.md)")
}

func (d *doctorRun) run(ctx context.Context) doctorReport {
	d.server(ctx)
	d.schema(ctx)
	d.privileges(ctx)
	d.trigger(ctx)
	d.listen(ctx)
	d.failover(ctx)
	d.clock(ctx)
	rep := doctorReport{Time: time.Now().UTC(), Level: levelOK, Findings: d.findings}
	schemaOnly := true
	for _, f := range d.findings {
		if gravity(f.Level) > gravity(rep.Level) {
			rep.Level = f.Level
		}
		if f.Level == levelFail && f.Check != "schema" {
			schemaOnly = false
		}
	}
	switch rep.Level {
	case levelFail:
		rep.ExitCode = exitDoctorProblem
		if schemaOnly {
			rep.ExitCode = exitSchema
		}
	case levelWarn:
		rep.ExitCode = exitDoctorWarn
	}
	return rep
}

// server: the server's version and the features pglease uses.
func (d *doctorRun) server(ctx context.Context) {
	var ver string
	var inRecovery bool
	err := d.pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('server_version'), pg_is_in_recovery()").
		Scan(&d.version, &ver, &inRecovery)
	if err != nil {
		d.errf("server", err)
		return
	}
	switch {
	case inRecovery:
		d.add("server", levelFail, "PostgreSQL "+ver+" is a standby (in recovery): no lock can be taken on it",
			"point the connection string at the primary (with several hosts, add target_session_attrs=read-write)")
	case d.version < 130000:
		d.add("server", levelFail, "PostgreSQL "+ver+": pglease needs PostgreSQL 13 or later",
			"upgrade the server")
	case d.version < 140000:
		d.add("server", levelWarn, "PostgreSQL "+ver+": no idle_session_timeout (14+), so behind a proxy the sessions of vanished "+
			"advisory-lock holders are not freed by the server, and status cannot show when a wait started (pg_locks.waitstart, 14+)",
			"upgrade to PostgreSQL 14 or later")
	default:
		d.add("server", levelOK, "PostgreSQL "+ver+" (every feature pglease uses)", "")
	}
}

// schema: the schema version against the one this pglease needs.
func (d *doctorRun) schema(ctx context.Context) {
	ver, from, err := d.st.ReadVersion(ctx, "migrate.Version")
	if err != nil {
		if m, ok := schemaProblem(err); ok {
			d.add("schema", levelFail, m, howToSetup)
			return
		}
		d.errf("schema", err)
		return
	}
	switch {
	case ver == 0:
		d.add("schema", levelFail, "no pglease schema (tables or functions missing)", howToSetup)
	case ver < migrate.Latest:
		d.add("schema", levelFail, fmt.Sprintf("schema version %d, this pglease needs %d", ver, migrate.Latest), howToSetup)
	case from > migrate.Latest:
		d.add("schema", levelFail, fmt.Sprintf("schema version %d, newer than this pglease serves (%d)", ver, migrate.Latest),
			"upgrade pglease (the CLI and every service) to a release that serves it")
	default:
		d.schemaOK = true
		d.add("schema", levelOK, fmt.Sprintf("schema version %d (current)", ver), "")
	}
}

// privileges: the runtime role's grants against what every Manager needs
// (pg/migrate/sql/roles.sql, step 2), and what it should not have.
func (d *doctorRun) privileges(ctx context.Context) {
	const check = "privileges"
	role := d.role
	if role == "" {
		if err := d.pool.QueryRow(ctx, "SELECT current_user").Scan(&role); err != nil {
			d.errf(check, err)
			return
		}
	}
	var super, exists bool
	err := d.pool.QueryRow(ctx, "SELECT count(*) > 0, coalesce(bool_or(rolsuper), false) FROM pg_roles WHERE rolname = $1", role).Scan(&exists, &super)
	if err != nil {
		d.errf(check, err)
		return
	}
	if !exists {
		d.add(check, levelFail, fmt.Sprintf("no role %q", role), "give --role the runtime role's exact name")
		return
	}
	grantFix := "grant the runtime role's privileges: `pglease sql roles --owner OWNER --runtime " + role +
		" --schema SCHEMA --database DB` prints the script (run its step 2 as an administrator after setup)"
	if super {
		d.add(check, levelWarn, fmt.Sprintf("role %q is a superuser: it passes every privilege check, and may delete fence counters", role),
			"connect the services as a runtime role without superuser ("+strings.TrimPrefix(grantFix, "grant the runtime role's privileges: ")+")")
		return
	}
	// What roles.sql grants the runtime role (migrate's one list, checked
	// against the script by a test): the SQL API's functions and views are
	// for SQL callers and monitoring, everything else every Manager needs.
	lacks, err := d.mg.MissingPrivileges(ctx, role)
	if err != nil {
		if !d.schemaOK {
			return // the schema check tells
		}
		d.errf(check, err)
		return
	}
	api := apiObjects(d.n)
	var missing, optional []string
	for _, l := range lacks {
		if api(l) {
			optional = append(optional, l)
		} else {
			missing = append(missing, l)
		}
	}
	extra, err := d.fenceExtras(ctx, role)
	if err != nil {
		d.errf(check, err)
		return
	}
	switch {
	case len(missing) > 0:
		d.add(check, levelFail, fmt.Sprintf("role %q lacks what every acquire needs (it fails with AuthFailed, SQLSTATE 42501): %s",
			role, strings.Join(missing, ", ")), grantFix)
	case len(extra) > 0:
		d.add(check, levelWarn, fmt.Sprintf("role %q has %s: fence counters could be deleted, and a fence handed out again",
			role, strings.Join(extra, ", ")), "REVOKE DELETE, TRUNCATE ON the fence counter table FROM the runtime role (roles.sql never grants them)")
	case len(optional) > 0:
		d.add(check, levelWarn, fmt.Sprintf("role %q has what the Manager needs, but not %s (SQL callers such as psql or pg_cron, and monitoring, need them)",
			role, strings.Join(optional, ", ")), grantFix)
	default:
		d.add(check, levelOK, fmt.Sprintf("role %q has every privilege pglease needs (pg/migrate/sql/roles.sql), and no DELETE or TRUNCATE on the fence counter table", role), "")
	}
}

// fenceExtras are the privileges on the fence counter table (when it
// exists) that role must not have (fenceNever).
func (d *doctorRun) fenceExtras(ctx context.Context, role string) ([]string, error) {
	var extra []string
	if ok, err := d.regclass(ctx, d.n.Fence); err != nil || !ok {
		return nil, nil
	}
	for _, p := range fenceNever {
		var has bool
		if err := d.pool.QueryRow(ctx, "SELECT has_table_privilege($1, $2, $3)", role, d.n.Fence, p).Scan(&has); err != nil {
			return nil, err
		}
		if has {
			extra = append(extra, p+" on the fence counter table "+d.n.Fence)
		}
	}
	return extra, nil
}

// apiObjects reports whether a line of MissingPrivileges names one of
// the SQL API's functions or views (unqualified, unquoted names).
func apiObjects(n store.Names) func(line string) bool {
	var names []string
	for _, f := range []string{n.APIAcquire, n.APIRelease, n.APIExtend, n.APIStatus, n.APIRevoke, n.APIRequestRelease,
		n.ViewLeases, n.ViewWaiters, n.ViewAdvisory} {
		if i := strings.LastIndexByte(f, '.'); i >= 0 {
			f = f[i+1:]
		}
		names = append(names, strings.Trim(f, `"`))
	}
	return func(line string) bool {
		_, obj, _ := strings.Cut(line, " on ")
		_, obj, _ = strings.Cut(obj, " ") // "function x(…)" / "table x"
		obj, _, _ = strings.Cut(obj, "(")
		if i := strings.LastIndexByte(obj, '.'); i >= 0 {
			obj = obj[i+1:]
		}
		return slices.Contains(names, strings.Trim(obj, `"`))
	}
}

func (d *doctorRun) regclass(ctx context.Context, name string) (bool, error) {
	var ok bool
	err := d.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", name).Scan(&ok)
	return ok, err
}

// trigger: whether the release trigger is needed (SyncGuard processes, or
// SQL callers without a holder identity, hold keys) and installed.
func (d *doctorRun) trigger(ctx context.Context) {
	const check = "release trigger"
	if ok, err := d.regclass(ctx, d.n.Lock); err != nil || !ok {
		if err != nil {
			d.errf(check, err)
		}
		return
	}
	installed, err := d.st.ReleaseTriggerInstalled(ctx, d.channel)
	if err != nil {
		d.errf(check, err)
		return
	}
	var foreign int
	q := "SELECT count(*) FROM " + d.n.Lock + " AS l"
	if ok, err := d.regclass(ctx, d.n.Holders); err == nil && ok {
		q += " LEFT JOIN " + d.n.Holders + " AS h ON h.key = l.key AND h.lock_id = l.lock_id WHERE h.key IS NULL"
	}
	if err := d.pool.QueryRow(ctx, q).Scan(&foreign); err != nil {
		d.errf(check, err)
		return
	}
	switch {
	case installed:
		d.add(check, levelOK, "installed for channel "+d.channel, "")
	case foreign > 0:
		d.add(check, levelWarn, fmt.Sprintf("not installed for channel %s, and %d lease row(s) have no pglease holder identity "+
			"(taken by SyncGuard processes, or by SQL callers): their releases wake pglease waiters only by polling", d.channel, foreign),
			"install it as the table owner: migrate.Migrator.SetupReleaseTrigger(ctx, \""+d.channel+"\")")
	default:
		d.add(check, levelInfo, "not installed for channel "+d.channel+"; not needed: every lease row was taken by pglease "+
			"(it matters only when SyncGuard processes share the tables)", "")
	}
}

// listen: whether a LISTEN through the pool's connection string (and
// --listen-url) hears a NOTIFY sent on another connection, as a
// Manager's listener must.
func (d *doctorRun) listen(ctx context.Context) {
	const check = "listen"
	poolOK, err := listenRoundTrip(ctx, d.pool.Config().ConnConfig)
	if err != nil {
		d.errf(check, err)
		return
	}
	if d.listenCfg != nil {
		direct, err := listenRoundTrip(ctx, d.listenCfg)
		switch {
		case err != nil:
			d.add(check, levelFail, "the --listen-url connection failed: "+err.Error(),
				"fix manager.Config.ListenConnString: a direct connection (or a session-mode pooler) to the same database")
		case direct:
			d.add(check, levelOK, "a LISTEN through the --listen-url connection hears notifications (set it as manager.Config.ListenConnString)", "")
		default:
			d.add(check, levelFail, "a LISTEN through the --listen-url connection hears no notification",
				"make manager.Config.ListenConnString a direct connection to PostgreSQL (or through a session-mode pooler)")
		}
		return
	}
	if poolOK {
		d.add(check, levelOK, "a LISTEN through the connection string hears notifications sent on another connection", "")
		return
	}
	d.add(check, levelFail, "a LISTEN through the connection string heard no notification sent on another connection: "+
		"a transaction-mode pooler (PgBouncer pool_mode=transaction, a managed pooler) is in the way, so Managers poll: "+
		"a release elsewhere reaches waiters only at their next retry, and revocations and watch events are late",
		"set manager.Config.ListenConnString to a direct connection to the same database (docs/poolers.md), and run doctor with --listen-url to check it")
}

// listenRoundTrip LISTENs on a fresh connection of cfg, NOTIFYs on
// another, and reports whether the first heard it within 3 s.
func listenRoundTrip(ctx context.Context, cfg *pgx.ConnConfig) (bool, error) {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	ch := "pglease_doctor_" + hex.EncodeToString(b)
	c := cfg.Copy()
	if c.RuntimeParams == nil {
		c.RuntimeParams = map[string]string{}
	}
	if _, ok := c.RuntimeParams["application_name"]; !ok {
		c.RuntimeParams["application_name"] = "pglease-doctor"
	}
	l, err := pgx.ConnectConfig(ctx, c)
	if err != nil {
		return false, err
	}
	defer l.Close(context.Background())
	if _, err := l.Exec(ctx, "LISTEN "+ch); err != nil {
		return false, err
	}
	s, err := pgx.ConnectConfig(ctx, c)
	if err != nil {
		return false, err
	}
	defer s.Close(context.Background())
	if _, err := s.Exec(ctx, "SELECT pg_notify($1, 'doctor')", ch); err != nil {
		return false, err
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	for {
		n, err := l.WaitForNotification(wctx)
		if err != nil {
			if wctx.Err() != nil && ctx.Err() == nil {
				return false, nil
			}
			return false, err
		}
		if n.Channel == ch {
			return true, nil
		}
	}
}

// failover: synchronous_commit and replication, which decide whether an
// acknowledged grant survives a failover (docs/failover.md).
func (d *doctorRun) failover(ctx context.Context) {
	const check = "replication"
	var syncCommit, names string
	var standbys, syncStandbys int
	err := d.pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
		(SELECT count(*) FROM pg_stat_replication), (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))`).
		Scan(&syncCommit, &names, &standbys, &syncStandbys)
	if err != nil {
		d.errf(check, err)
		return
	}
	note := ""
	if syncCommit != "on" && syncCommit != "remote_apply" {
		note = "; synchronous_commit is " + syncCommit + " by default, which pglease overrides for its own acquires and extends"
	}
	switch {
	case names != "" && syncStandbys > 0:
		d.add(check, levelOK, fmt.Sprintf("synchronous replication (synchronous_standby_names %q, %d synchronous of %d standby(s)): "+
			"acknowledged grants survive a failover to a synchronous standby%s", names, syncStandbys, standbys, note), "")
	case names != "":
		d.add(check, levelWarn, fmt.Sprintf("synchronous_standby_names is %q but no synchronous standby is connected: "+
			"commits wait, so acquires fail with retryable errors until one is back%s", names, note),
			"bring the synchronous standby back (docs/failover.md)")
	case standbys > 0:
		d.add(check, levelWarn, fmt.Sprintf("%d asynchronous standby(s): a failover to one can lose acknowledged grants and hand a fence out again%s", standbys, note),
			"name the standby that may be promoted in synchronous_standby_names, or read docs/failover.md for what to do after an asynchronous failover")
	default:
		d.add(check, levelInfo, "no standby seen (pg_stat_replication is empty, or this role may not see it)"+note+
			": if the provider fails over to a replica, check that it is synchronous (docs/failover.md)", "")
	}
}

// clock: the server's clock against this host's, which pglease's
// lease expiry does not depend on (server time) but timestamps and
// SyncGuard-era tooling do.
func (d *doctorRun) clock(ctx context.Context) {
	const check = "clock"
	best, offset := time.Duration(math.MaxInt64), time.Duration(0)
	for range 5 {
		t0 := time.Now()
		var ms float64
		if err := d.pool.QueryRow(ctx, "SELECT extract(epoch FROM clock_timestamp()) * 1000").Scan(&ms); err != nil {
			d.errf(check, err)
			return
		}
		t1 := time.Now()
		rtt := t1.Sub(t0)
		if rtt < best {
			mid := t0.Add(rtt / 2)
			best, offset = rtt, time.UnixMicro(int64(ms*1000)).Sub(mid)
		}
	}
	abs := max(offset, -offset)
	found := fmt.Sprintf("the server's clock is %s %s this host's (± %s, half the best round trip)",
		abs.Round(time.Millisecond), map[bool]string{true: "ahead of", false: "behind"}[offset >= 0], (best / 2).Round(time.Millisecond))
	switch {
	case abs-best/2 > keys.TimeTolerance:
		d.add(check, levelWarn, found+": more than the 1 s tolerance; leases expire on the server's clock, so locks stay safe, "+
			"but this host's timestamps (logs, traces, status ages) disagree with the server's by that much",
			"synchronise both clocks (NTP, chrony)")
	default:
		d.add(check, levelOK, found+" (leases expire on the server's clock)", "")
	}
}

func printDoctor(w io.Writer, rep doctorReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, f := range rep.Findings {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", strings.ToUpper(f.Level), f.Check, f.Found)
		if f.Do != "" {
			fmt.Fprintf(tw, "\t\tdo: %s\n", f.Do)
		}
	}
	tw.Flush()
	fmt.Fprintf(w, "\ndoctor: %s (exit %d)\n", rep.Level, rep.ExitCode)
}
