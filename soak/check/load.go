// Package check verifies a finished soak run (package driver's run
// directory) against pglease's guarantees (docs/guarantees.md):
// fences, the fenced resource (including its linearizability, checked
// with porcupine), holders' ends against the server's grants, loss
// notices against the server's leases, advisory exclusion, liveness after
// every fault, Close, leftovers, error codes, panics, races and leaks.
//
// Times: workers and the driver stamp events with CLOCK_MONOTONIC, shared
// by every process of the machine; server timestamps (clock_timestamp(),
// lease expiries) are on CLOCK_REALTIME of the same machine and are
// mapped to the monotonic clock with the offset the driver sampled once a
// second (the checks fail if it moved: a clock step).
package check

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/pglease/pglease/soak/driver"
	"github.com/pglease/pglease/soak/event"
	"github.com/pglease/pglease/soak/worker"
)

// grant is one grant as a worker saw it: a lease (r.grants: lease keys,
// writers, exclusive grants of semaphore keys, a set's locks) or a shared
// hold (r.shared: readers, permits).
type grant struct {
	op        int64
	w, inc, g int
	key       int
	fence     int64
	kind      string // event.Kind*
	lim       int    // a permit's limit
	grantID   string // pg.GrantID of the lockId ("" for a permit that was never granted)
	set       int64  // a set's lock: the set's op id
	callT     int64  // Acquire called
	okT       int64  // Acquire returned
	endT      int64  // Context ended (0: never logged)
	endCode   string
	stopT     int64 // broken workers: when they stopped working (0: none)
	relT      int64 // Release called (0: never)
	relRetT   int64
	relCode   string
	deathT    int64 // the process died (killed) while holding (0: no)
	lastOpT   int64 // last resource op called
	ops       []*resOp
}

// stopped is when the holder stopped working on the grant (see
// checkHolderEnded), and whether that is known.
func (g *grant) stopped() (int64, bool) {
	t := int64(0)
	pick := func(x int64) {
		if x > 0 && (t == 0 || x < t) {
			t = x
		}
	}
	pick(g.relT)
	if g.endCode != "" && g.endCode != "Released" {
		pick(g.endT)
	}
	pick(g.deathT)
	if g.stopT > 0 {
		t = max(t, g.stopT)
	}
	if t == 0 {
		return 0, false
	}
	return max(t, g.lastOpT), true
}

type resOp struct {
	op, grant int64
	w, inc, g int
	key       int
	fence     int64
	kind      string
	value     int64
	callT     int64
	retT      int64 // 0: no return logged (process killed)
	result    string
	readC     int64
	readF     int64
}

type advGrant struct {
	op      int64
	w, inc  int
	key     int
	okT     int64
	endT    int64
	endCode string
	relT    int64
	deathT  int64
}

func (a *advGrant) stopped() (int64, bool) {
	t := int64(0)
	for _, x := range []int64{a.relT, a.endT, a.deathT} {
		if x > 0 && (t == 0 || x < t) {
			t = x
		}
	}
	return t, t > 0
}

// fault is one fault from the driver's log.
type fault struct {
	id     int64
	typ    string
	w      int // -1: the server
	startT int64
	healT  int64 // 0: never healed (run ended)
	dur    int64
}

type interval struct{ from, to int64 }

// setCall is one AcquireAll as a worker saw it.
type setCall struct {
	op        int64
	w, inc, g int
	asked     []int // key indexes asked
	got       []int // key indexes of the locks returned (SetOK)
	n         int   // locks returned
	callT     int64
	okT       int64 // 0: no SetOK (failed, or the process died)
	locks     []*grant
}

// serverGrant is one grant as the server's audit log has it.
type serverGrant struct {
	key       int
	fence     int64
	idHash    string
	seq       int64
	atT       int64   // mono time of the grant's row change
	acqMs     int64   // acquired_at_ms
	expires   []int64 // expires_at_ms in force after each change (first: the grant's)
	changeT   []int64 // mono time of each change
	deletedT  int64   // mono time of its release/cleanup/takeover (0: still there)
	deletedBy string  // "D": deleted (release, cleanup); "U": taken over (a local handoff, or after expiry)
	xid       int64   // the granting transaction
	deletedTx bool    // deleted by the transaction that granted it (never committed as a grant)
	revokedT  int64   // mono time of its delete by the driver's revoking Manager (0: not revoked)
	revokeExp int64   // mono time of its expiry in force then
}

// liveEnd is the mono time from which the grant is no longer live on the
// server: its deletion or takeover, or its last expiry + the 1 s
// tolerance, whichever comes first (an expired lease cannot be extended,
// so its expiry in force only grows while it lives).
func (s *serverGrant) liveEnd(r *run) int64 {
	end := r.expMono((s.expires[len(s.expires)-1]+1000)*1e6, s.changeT[len(s.changeT)-1])
	if s.deletedT > 0 {
		end = min(end, s.deletedT)
	}
	return end
}

// revoked reports whether client grant g's lease was revoked (deleted by
// the driver's revoking Manager) and returns its server record.
func (r *run) revoked(g *grant) (*serverGrant, bool) {
	s := r.serverGrant(g.key, g.fence)
	return s, s != nil && s.revokedT > 0
}

// serverShared is one shared hold (a reader or a permit) as the server's
// audit log of the shared-hold table has it.
type serverShared struct {
	key      int
	lim      int
	fence    int64
	grantID  string
	seq      int64
	xid      int64
	app      string
	atT      int64   // mono time of its insert
	expires  []int64 // expires_at_ms after each change
	lastT    int64   // mono time of its last change (insert or extend)
	deletedT int64   // mono time of its delete (release, cleanup of an expired row; 0: still there)
}

func (s *serverShared) liveEnd(r *run) int64 {
	end := r.expMono((s.expires[len(s.expires)-1]+1000)*1e6, s.lastT)
	if s.deletedT > 0 {
		end = min(end, s.deletedT)
	}
	return end
}

// aliveAt reports whether the lease was live on the server at mono time t
// (before its expiry in force at t, and not deleted or taken over), and
// how much of it was left (ns).
func (s *serverGrant) aliveAt(t int64, r *run) (bool, int64) {
	if s.deletedT > 0 && t >= s.deletedT {
		return false, 0
	}
	i := sort.Search(len(s.changeT), func(i int) bool { return s.changeT[i] > t }) - 1
	if i < 0 {
		i = 0
	}
	left := s.expires[i]*1e6 - r.serverNow(t)
	return left > 0, left
}

type lockLogRow struct {
	Seq          int64  `json:"seq"`
	Tg           string `json:"tg"`
	UserKey      string `json:"user_key"`
	IDHash       string `json:"id_hash"`
	OldIDHash    string `json:"old_id_hash"`
	Fence        int64  `json:"fence"`
	OldFence     int64  `json:"old_fence"`
	AcquiredMs   int64  `json:"acquired_ms"`
	ExpiresMs    int64  `json:"expires_ms"`
	OldExpiresMs int64  `json:"old_expires_ms"`
	AtUs         int64  `json:"at_us"`
	Xid          int64  `json:"xid"`
	App          string `json:"app"`
}

type sharedLogRow struct {
	Seq        int64  `json:"seq"`
	Tg         string `json:"tg"`
	UserKey    string `json:"user_key"`
	GrantID    string `json:"grant_id"`
	Lim        int    `json:"lim"`
	Fence      int64  `json:"fence"`
	AcquiredMs int64  `json:"acquired_ms"`
	ExpiresMs  int64  `json:"expires_ms"`
	AtUs       int64  `json:"at_us"`
	Xid        int64  `json:"xid"`
	App        string `json:"app"`
}

type resLogRow struct {
	Seq        int64  `json:"seq"`
	Key        int    `json:"key"`
	OldFence   *int64 `json:"old_fence"`
	NewFence   *int64 `json:"new_fence"`
	OldCounter int64  `json:"old_counter"`
	NewCounter int64  `json:"new_counter"`
	Op         *int64 `json:"op"`
	AtUs       int64  `json:"at_us"`
}

// run is everything loaded from a run directory.
type run struct {
	dir     string
	meta    driver.Meta
	final   driver.Final
	offset  int64
	offSpan int64

	grants  map[int64]*grant // by op id
	shared  map[int64]*grant // readers and permits, by op id
	sets    map[int64]*setCall
	resOps  map[int64]*resOp
	advs    map[int64]*advGrant
	faults  []*fault
	revokes []event.Event      // the revoke faults' outcomes
	pauses  map[int][]interval // SIGSTOP periods per worker
	srvDown []interval
	seqT    map[int64]int64 // mono time of each row of the two lock audits, by seq
	clock   []clockSeg      // the server clock's steps (clock-step faults)
	steps   []stepAt
	spawns  map[[2]int]int64 // (w, inc) → spawn time
	deaths  map[[2]int]deathInfo
	closes  map[[2]int]int64 // Close duration
	leaks   []string
	errs    map[string]int // error code histogram
	stderr  []string       // panics / races / fatal errors found
	readyT  int64
	endT    int64 // last event
	lastEvT map[[2]int]int64

	lockLog   []lockLogRow
	resLog    []resLogRow
	sgrants   map[int][]*serverGrant // per key, in grant order
	sharedLog []sharedLogRow
	sshared   map[int][]*serverShared // per key, in grant order
}

// grantOf returns the grant (lease or shared hold) of op id.
func (r *run) grantOf(op int64) *grant {
	if g := r.grants[op]; g != nil {
		return g
	}
	return r.shared[op]
}

type deathInfo struct {
	t      int64
	status string
	reason string
}

var workerLogRe = regexp.MustCompile(`^w(\d+)\.(\d+)\.jsonl$`)
var stderrRe = regexp.MustCompile(`^w(\d+)\.(\d+)\.stderr$`)

func load(dir string) (*run, error) {
	r := &run{dir: dir, grants: map[int64]*grant{}, shared: map[int64]*grant{}, sets: map[int64]*setCall{}, sshared: map[int][]*serverShared{}, resOps: map[int64]*resOp{}, advs: map[int64]*advGrant{},
		pauses: map[int][]interval{}, spawns: map[[2]int]int64{}, deaths: map[[2]int]deathInfo{},
		closes: map[[2]int]int64{}, errs: map[string]int{}, lastEvT: map[[2]int]int64{}, sgrants: map[int][]*serverGrant{}}
	if err := readJSON(filepath.Join(dir, "meta.json"), &r.meta); err != nil {
		return nil, err
	}
	if err := readJSON(filepath.Join(dir, "final.json"), &r.final); err != nil {
		return nil, err
	}
	if err := r.loadDriver(); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if m := workerLogRe.FindStringSubmatch(e.Name()); m != nil {
			if err := r.loadWorker(filepath.Join(dir, e.Name())); err != nil {
				return nil, err
			}
		}
		if m := stderrRe.FindStringSubmatch(e.Name()); m != nil {
			r.scanStderr(filepath.Join(dir, e.Name()), e.Name())
		}
	}
	r.attachDeaths()
	if err := r.loadServer(); err != nil {
		return nil, err
	}
	return r, nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func (r *run) loadDriver() error {
	var offs []int64
	open := map[int64]*fault{}
	var downFrom int64
	err := event.ReadFile(filepath.Join(r.dir, "driver.jsonl"), func(e event.Event) {
		r.endT = max(r.endT, e.T)
		switch e.E {
		case event.Offset:
			offs = append(offs, e.V)
		case event.Fault:
			f := &fault{id: e.O, typ: e.M, w: e.W, startT: e.T, dur: e.V}
			r.faults = append(r.faults, f)
			open[e.O] = f
		case event.Heal:
			if f := open[e.O]; f != nil {
				f.healT = e.T
				if f.typ == driver.FStop {
					r.pauses[f.w] = append(r.pauses[f.w], interval{f.startT, e.T})
				}
			}
		case event.ServerDown:
			downFrom = e.T
		case event.ServerUp:
			if downFrom > 0 {
				r.srvDown = append(r.srvDown, interval{downFrom, e.T})
				downFrom = 0
			}
		case event.Revoke:
			r.revokes = append(r.revokes, e)
		case event.ClockStep:
			r.addClockStep(e.T, e.V, e.SA, e.SB)
		case event.Spawn:
			r.spawns[[2]int{e.W, e.I}] = e.T
		case event.Died:
			r.deaths[[2]int{e.W, e.I}] = deathInfo{t: e.T, status: e.C, reason: e.M}
		}
	})
	if err != nil {
		return err
	}
	// A fault still open at the end (run interrupted) is paused to the end.
	for _, f := range open {
		if f.healT == 0 && f.typ == driver.FStop {
			r.pauses[f.w] = append(r.pauses[f.w], interval{f.startT, r.endT})
		}
	}
	if len(offs) == 0 {
		return fmt.Errorf("driver log has no clock offset")
	}
	sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
	r.offset = offs[len(offs)/2]
	r.offSpan = offs[len(offs)-1] - offs[0]
	return nil
}

func (r *run) loadWorker(path string) error {
	pending := map[int64]int64{} // AcqCall/AdvCall op → call time
	return event.ReadFile(path, func(e event.Event) {
		wi := [2]int{e.W, e.I}
		r.lastEvT[wi] = max(r.lastEvT[wi], e.T)
		r.endT = max(r.endT, e.T)
		code := func() {
			if e.C != "" {
				r.errs[e.C]++
			}
		}
		switch e.E {
		case event.Ready:
			if r.readyT == 0 || e.T < r.readyT {
				r.readyT = e.T
			}
		case event.AcqCall, event.AdvCall:
			pending[e.O] = e.T
		case event.AcqOK:
			call := pending[e.O]
			if e.P != 0 {
				call = pending[e.P]
			}
			g := &grant{op: e.O, w: e.W, inc: e.I, g: e.G, key: e.K, fence: e.F, kind: e.M, lim: e.L, grantID: e.X, set: e.P,
				callT: call, okT: e.T}
			switch e.M {
			case event.KindReader, event.KindPermit:
				r.shared[e.O] = g
			default:
				r.grants[e.O] = g
			}
			if s := r.sets[e.P]; s != nil && e.P != 0 {
				s.locks = append(s.locks, g)
			}
		case event.AcqErr, event.AdvErr, event.SetErr:
			code()
		case event.SetCall:
			pending[e.O] = e.T
			r.sets[e.O] = &setCall{op: e.O, w: e.W, inc: e.I, g: e.G, asked: parseInts(e.M), callT: e.T}
		case event.SetOK:
			if s := r.sets[e.O]; s != nil {
				s.okT, s.n, s.got = e.T, int(e.V), parseInts(e.M)
			}
		case event.End:
			if g := r.grantOf(e.O); g != nil {
				g.endT, g.endCode = e.T, e.C
			}
			if e.C != "Released" {
				code()
			}
		case event.Stop:
			if g := r.grantOf(e.O); g != nil {
				g.stopT = e.T
			}
		case event.RelCall:
			if g := r.grantOf(e.O); g != nil {
				g.relT = e.T
			}
		case event.RelRet:
			if g := r.grantOf(e.O); g != nil {
				g.relRetT, g.relCode = e.T, e.C
			}
			code()
		case event.ResCall:
			op := &resOp{op: e.O, grant: e.P, w: e.W, inc: e.I, g: e.G, key: e.K, fence: e.F, kind: e.M, value: e.V, callT: e.T}
			r.resOps[e.O] = op
			if g := r.grants[e.P]; g != nil {
				g.ops = append(g.ops, op)
				g.lastOpT = max(g.lastOpT, e.T)
			}
		case event.ResRet:
			if op := r.resOps[e.O]; op != nil {
				op.retT, op.result, op.readC, op.readF = e.T, e.C, e.V, e.V2
			}
			if e.C != "ok" && e.C != "refused" {
				code()
			}
		case event.AdvOK:
			r.advs[e.O] = &advGrant{op: e.O, w: e.W, inc: e.I, key: e.K, okT: e.T}
		case event.AdvEnd:
			if a := r.advs[e.O]; a != nil {
				a.endT, a.endCode = e.T, e.C
			}
			if e.C != "Released" {
				code()
			}
		case event.AdvRel:
			if a := r.advs[e.O]; a != nil {
				a.relT = e.T
			}
		case event.AdvRet:
			code()
		case event.CloseRet:
			r.closes[wi] = e.V
			code()
		case event.Leak:
			r.leaks = append(r.leaks, fmt.Sprintf("worker %d.%d: %d goroutines: %s", e.W, e.I, e.V, firstLines(e.M, 6)))
		case event.ErrEv:
			code()
		}
	})
}

func parseInts(s string) []int {
	var xs []int
	for _, f := range strings.Split(s, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil {
			xs = append(xs, n)
		}
	}
	return xs
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, " | ")
}

func (r *run) scanStderr(path, name string) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "panic:"), strings.HasPrefix(line, "fatal error:"),
			strings.Contains(line, "WARNING: DATA RACE"):
			r.stderr = append(r.stderr, name+": "+line)
		}
	}
}

// attachDeaths marks grants whose process died (killed, or by itself)
// while they were held, with the time of death.
func (r *run) attachDeaths() {
	for _, gs := range []map[int64]*grant{r.grants, r.shared} {
		for _, g := range gs {
			if d, ok := r.deaths[[2]int{g.w, g.inc}]; ok && g.relT == 0 && g.endT == 0 {
				g.deathT = d.t
			}
		}
	}
	for _, a := range r.advs {
		if d, ok := r.deaths[[2]int{a.w, a.inc}]; ok && a.relT == 0 && a.endT == 0 {
			a.deathT = d.t
		}
	}
}

func keyIndex(userKey string) (int, bool) { return worker.KeyIndex(userKey) }

// kn names key index k in messages.
func kn(k int) string { return worker.KeyName(k) }

func (r *run) loadServer() error {
	f, err := os.Open(filepath.Join(r.dir, "lock_log.jsonl"))
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	if err := r.mapServerTimes(); err != nil {
		return err
	}
	byID := map[string]*serverGrant{}
	for sc.Scan() {
		var row lockLogRow
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			return err
		}
		r.lockLog = append(r.lockLog, row)
		k, ok := keyIndex(row.UserKey)
		if !ok {
			continue
		}
		t := r.seqT[row.Seq]
		newGrant := func() {
			s := &serverGrant{key: k, fence: row.Fence, idHash: row.IDHash, seq: row.Seq, atT: t, acqMs: row.AcquiredMs,
				expires: []int64{row.ExpiresMs}, changeT: []int64{t}, xid: row.Xid}
			byID[row.IDHash] = s
			r.sgrants[k] = append(r.sgrants[k], s)
		}
		switch row.Tg {
		case "I":
			newGrant()
		case "U":
			if row.OldIDHash != row.IDHash { // takeover: the old lease ends, a new grant begins
				if old := byID[row.OldIDHash]; old != nil && old.deletedT == 0 {
					old.deletedT, old.deletedBy = t, "U"
				}
				newGrant()
			} else if s := byID[row.IDHash]; s != nil {
				s.expires = append(s.expires, row.ExpiresMs)
				s.changeT = append(s.changeT, t)
			}
		case "D":
			if s := byID[row.IDHash]; s != nil && s.deletedT == 0 {
				s.deletedT, s.deletedBy = t, "D"
				s.deletedTx = row.Xid != 0 && row.Xid == s.xid
				// A revoke, or an operator's DELETE FROM the lock table:
				// the key is free at once, its holder hears of it later
				// (revoked-holder-stops checks when).
				if row.App == driver.RevokerApp || row.App == driver.OperatorApp {
					s.revokedT = t
					s.revokeExp = r.expMono(row.ExpiresMs*1e6, t)
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if err := r.loadShared(); err != nil {
		return err
	}
	rf, err := os.Open(filepath.Join(r.dir, "res_log.jsonl"))
	if err != nil {
		return err
	}
	defer rf.Close()
	sc = bufio.NewScanner(rf)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var row resLogRow
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			return err
		}
		r.resLog = append(r.resLog, row)
	}
	return sc.Err()
}

// loadShared reads the shared-hold table's audit log (absent in runs made
// before the soak ran the other primitives: nothing to load).
func (r *run) loadShared() error {
	f, err := os.Open(filepath.Join(r.dir, "shared_log.jsonl"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	byID := map[string]*serverShared{}
	for sc.Scan() {
		var row sharedLogRow
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			return err
		}
		r.sharedLog = append(r.sharedLog, row)
		k, ok := keyIndex(row.UserKey)
		if !ok {
			continue
		}
		t := r.seqT[row.Seq]
		switch row.Tg {
		case "I":
			s := &serverShared{key: k, lim: row.Lim, fence: row.Fence, grantID: row.GrantID, seq: row.Seq, xid: row.Xid, app: row.App,
				atT: t, lastT: t, expires: []int64{row.ExpiresMs}}
			byID[row.GrantID] = s
			r.sshared[k] = append(r.sshared[k], s)
		case "U":
			if s := byID[row.GrantID]; s != nil {
				s.expires = append(s.expires, row.ExpiresMs)
				s.lastT = t
			}
		case "D":
			if s := byID[row.GrantID]; s != nil && s.deletedT == 0 {
				s.deletedT = t
			}
		}
	}
	return sc.Err()
}

// pausedDuring reports whether worker w was stopped (SIGSTOP) at any time
// in [from, to].
func (r *run) pausedDuring(w int, from, to int64) bool {
	for _, p := range r.pauses[w] {
		if p.from <= to && p.to >= from {
			return true
		}
	}
	return false
}
