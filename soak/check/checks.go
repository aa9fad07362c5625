package check

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pglease/pglease/soak/driver"
)

// Check is the outcome of one check.
type Check struct {
	Name      string
	Guarantee string
	Checked   int // items checked
	Skipped   int // items the check does not apply to (e.g. paused holders)
	Failed    int
	Examples  []string
}

func (c *Check) fail(format string, args ...any) {
	c.Failed++
	if len(c.Examples) < 20 {
		c.Examples = append(c.Examples, fmt.Sprintf(format, args...))
	}
}

// Recovery is the liveness figure of one fault type.
type Recovery struct {
	Type     string
	Faults   int
	Measured int
	Censored int // healed too close to the end to tell
	P50, Max time.Duration
	Bound    time.Duration
	Over     int
}

// Report is the outcome of all checks on a run.
type Report struct {
	Meta         driver.Meta
	Dir          string
	LeaseGrants  int // client-observed, lease keys only (the other primitives' grants do not count)
	ServerGrants int // lease keys only
	AdvGrants    int
	Writes       int // accepted counter writes (server log)
	ResOps       int
	FaultsByType map[string]int
	Checks       []*Check
	Recoveries   []*Recovery
	Errors       map[string]int
	NoticeLeft   []time.Duration // lease left on the server at each loss notice
	Linear       LinearStats
	ClockSpan    time.Duration
	KeyGapMax    time.Duration
	AdvGapMax    time.Duration
	CloseMax     time.Duration
	Notes        []string

	// The other primitives: client-observed permits, readers and
	// exclusive grants of semaphore and reader-writer keys; the server's
	// permits and readers; sets granted and their locks; the most permits
	// of a key live at once on the server.
	Permits, Readers, PrimExclusive int
	ServerPermits, ServerReaders    int
	Sets, SetLocks                  int
	PermitsMax                      int

	// Revocations: revoke faults that revoked a live lease; how long each
	// revoked holder took to hear of it (from the delete's commit), how
	// many heard by a failed extend (ErrLockLost), how many released first.
	Revokes        int
	RevokeNotice   []time.Duration
	RevokeLost     int
	RevokeReleased int
}

// Violations is the number of failed items over all checks.
func (rep *Report) Violations() int {
	n := 0
	for _, c := range rep.Checks {
		n += c.Failed
	}
	return n
}

// FaultCount is the number of faults injected.
func (rep *Report) FaultCount() int {
	n := 0
	for _, c := range rep.FaultsByType {
		n += c
	}
	return n
}

// TargetsReached reports whether the run reached its -cycles and -faults
// targets (lease cycles as the workers saw them).
func (rep *Report) TargetsReached() bool {
	return int64(rep.LeaseGrants) >= rep.Meta.Cycles && rep.FaultCount() >= rep.Meta.Faults
}

// Check returns the check named name (nil if none).
func (rep *Report) Check(name string) *Check {
	for _, c := range rep.Checks {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Check names.
const (
	CFences       = "fences"
	CGrantsReal   = "grants-committed"
	CRegister     = "fenced-register"
	CWrites       = "writes-accounted"
	CLinear       = "linearizable"
	CHolderEnded  = "holder-ended-first"
	CNoticeTimely = "loss-notice-in-lease"
	CAdvisory     = "advisory-exclusion"
	CRecovery     = "recovery-bound"
	CStarve       = "no-key-starves"
	CClose        = "close-bounded"
	CLeftovers    = "nothing-left"
	CCoded        = "errors-coded"
	CHygiene      = "no-panic-race-leak"
	CClock        = "clock-steady"
	CSemBound     = "semaphore-bound"
	CRWExcl       = "rw-exclusion"
	CSets         = "no-partial-set"
	CSharedFences = "shared-fences"
	CRevoked      = "revoked-holder-stops"
	CFair         = "fair-order"
)

// Run loads the run in dir and runs every check.
func Run(dir string) (*Report, error) {
	r, err := load(dir)
	if err != nil {
		return nil, err
	}
	rep := &Report{Meta: r.meta, Dir: dir, FaultsByType: map[string]int{}, Errors: r.errs,
		ClockSpan: time.Duration(r.offSpan)}
	for _, g := range r.grants {
		if isLeaseKey(g.key) {
			rep.LeaseGrants++
		}
	}
	rep.AdvGrants = len(r.advs)
	for k, gs := range r.sgrants {
		if isLeaseKey(k) {
			rep.ServerGrants += len(gs)
		}
	}
	r.primStats(rep)
	rep.ResOps = len(r.resOps)
	for _, row := range r.resLog {
		if row.NewCounter != row.OldCounter {
			rep.Writes++
		}
	}
	for _, f := range r.faults {
		rep.FaultsByType[f.typ]++
	}
	rep.Checks = append(rep.Checks,
		r.checkClock(),
		r.checkFences(),
		r.checkGrantsCommitted(),
		r.checkRegister(),
		r.checkWrites(),
	)
	lc, stats := r.checkLinear()
	rep.Linear = stats
	rep.Checks = append(rep.Checks, lc,
		r.checkHolderEnded(),
		r.checkNotice(rep),
		r.checkAdvisory(),
		r.checkSemaphore(rep),
		r.checkRW(),
		r.checkSets(rep),
		r.checkSharedFences(),
		r.checkRevoked(rep),
	)
	if r.meta.Fair {
		fc, err := r.checkFair()
		if err != nil {
			return nil, err
		}
		rep.Checks = append(rep.Checks, fc)
	}
	rc, recs := r.checkRecovery()
	rep.Recoveries = recs
	rep.Checks = append(rep.Checks, rc,
		r.checkStarve(rep),
		r.checkClose(rep),
		r.checkLeftovers(),
		r.checkCoded(),
		r.checkHygiene(),
	)
	return rep, nil
}

// --- bounds, derived from the configuration -------------------------------

// slack absorbs scheduling delays of a loaded machine (and of -race).
const slack = 2 * time.Second

// recoveryBound is how long after a fault heals its target may go without
// a new lease: one dead connection costs at most one statement timeout
// (dead connections cost one bounded timeout); the key it wants may be held by a holder that was partitioned,
// paused or killed, which the server frees at expiry + 1 s (takeover after a crash, at most a
// TTL after its last extend); polling finds it within the retry cap when
// no notification comes; a goroutine whose wait ended (acquire timeout)
// starts over on another key.
func (r *run) recoveryBound() time.Duration {
	m := r.meta
	return m.StatementTO + m.AcquireTimeout + m.TTL + time.Second + m.RetryCap + slack + r.backStepMax()
}

// keyGapBound is the longest a lease key may go without a grant while the
// server is up: a long hold (≤ 3 TTL) followed by a holder lost without
// release (TTL + 1 s), plus the recovery bound for the waiters.
func (r *run) keyGapBound() time.Duration {
	m := r.meta
	return 3*m.TTL + m.TTL + time.Second + r.recoveryBound()
}

// advGapBound: a blackholed advisory holder keeps its lock until the
// server's idle_session_timeout ends its session.
func (r *run) advGapBound() time.Duration {
	m := r.meta
	return m.AdvServerTO + m.ProbeBound + m.AcquireTimeout + r.recoveryBound()
}

// closeBound: Close lets an acquire batch in flight finish (≤ statement
// timeout), then releases everything in one round trip (≤ CloseTimeout);
// the advisory session closes in parallel (≤ CloseTimeout).
func (r *run) closeBound() time.Duration {
	m := r.meta
	return m.StatementTO + m.CloseTimeout + slack
}

// --- checks ----------------------------------------------------------------

func (r *run) checkClock() *Check {
	c := &Check{Name: CClock, Guarantee: "CLOCK_REALTIME − CLOCK_MONOTONIC steady (server times map to the shared clock)", Checked: 1}
	if time.Duration(r.offSpan) > 20*time.Millisecond {
		c.fail("the realtime/monotonic offset moved by %s during the run (a clock step): server-time checks are off by that much", time.Duration(r.offSpan))
	}
	return c
}

// checkFences: fence monotonicity. Per key, the server's grants have strictly increasing
// fences in commit order; no two client grants of a key share a fence;
// a grant that returned before another was called has the lower fence;
// the fence counter is at least every fence granted.
func (r *run) checkFences() *Check {
	c := &Check{Name: CFences, Guarantee: "fence monotonicity: fences per key strictly increasing, never repeated (server order, client real-time order, across crashes)"}
	for k, gs := range r.sgrants {
		for i := 1; i < len(gs); i++ {
			c.Checked++
			if gs[i].fence <= gs[i-1].fence {
				c.fail("%s: server grant seq %d has fence %d after fence %d (seq %d)", kn(k), gs[i].seq, gs[i].fence, gs[i-1].fence, gs[i-1].seq)
			}
		}
		if len(gs) > 0 {
			if fc, ok := r.final.Fences[kn(k)]; ok && fc < gs[len(gs)-1].fence {
				c.fail("%s: fence counter %d below the last fence granted %d", kn(k), fc, gs[len(gs)-1].fence)
			}
		}
	}
	byKey := map[int][]*grant{}
	seen := map[[2]int64]*grant{}
	for _, g := range r.grants {
		byKey[g.key] = append(byKey[g.key], g)
		id := [2]int64{int64(g.key), g.fence}
		if o := seen[id]; o != nil {
			c.fail("%s: fence %d granted twice (worker %d.%d and %d.%d)", kn(g.key), g.fence, o.w, o.inc, g.w, g.inc)
		}
		seen[id] = g
	}
	for k, gs := range byKey {
		// Real-time order: sort by call; keep the returns seen so far.
		sort.Slice(gs, func(i, j int) bool { return gs[i].callT < gs[j].callT })
		byRet := append([]*grant(nil), gs...)
		sort.Slice(byRet, func(i, j int) bool { return byRet[i].okT < byRet[j].okT })
		j := 0
		var maxF int64
		var maxG *grant
		for _, g := range gs {
			for j < len(byRet) && byRet[j].okT < g.callT {
				if byRet[j].fence > maxF {
					maxF, maxG = byRet[j].fence, byRet[j]
				}
				j++
			}
			c.Checked++
			if maxG != nil && g.fence <= maxF {
				c.fail("%s: worker %d.%d got fence %d though fence %d (worker %d.%d) was granted before its Acquire began", kn(k), g.w, g.inc, g.fence, maxF, maxG.w, maxG.inc)
			}
		}
	}
	return c
}

// checkGrantsCommitted: ambiguity is never success. Every grant a worker was given is a grant the
// server committed (an ambiguous acquire is never success).
func (r *run) checkGrantsCommitted() *Check {
	c := &Check{Name: CGrantsReal, Guarantee: "ambiguity is never success: every grant a holder got is committed on the server (ambiguity is never success)"}
	have := map[[2]int64]bool{}
	for k, gs := range r.sgrants {
		for _, s := range gs {
			have[[2]int64{int64(k), s.fence}] = true
		}
	}
	for _, g := range r.grants {
		c.Checked++
		if !have[[2]int64{int64(g.key), g.fence}] {
			c.fail("worker %d.%d got %s fence %d, which the server never committed", g.w, g.inc, kn(g.key), g.fence)
		}
	}
	return c
}

// checkRegister: fenced-resource safety on the server's own log of the resource. Fences of
// accepted writes never go down, and every counter write is the previous
// value + 1 (a read-modify-write under the lock never loses an update).
func (r *run) checkRegister() *Check {
	c := &Check{Name: CRegister, Guarantee: "fenced-resource safety: the resource never accepts an older fence after a newer one; the fenced counter loses no update"}
	writes := map[int]int64{}
	for _, row := range r.resLog {
		c.Checked++
		if row.OldFence != nil && (row.NewFence == nil || *row.NewFence < *row.OldFence) {
			nf := int64(-1)
			if row.NewFence != nil {
				nf = *row.NewFence
			}
			c.fail("key %d: write (seq %d) accepted with fence %d after fence %d", row.Key, row.Seq, nf, *row.OldFence)
		}
		if row.NewCounter != row.OldCounter {
			writes[row.Key]++
			if row.NewCounter != row.OldCounter+1 {
				c.fail("key %d: lost update: counter %d → %d (seq %d): the writer read a stale value", row.Key, row.OldCounter, row.NewCounter, row.Seq)
			}
		}
	}
	for k, n := range writes {
		if got := r.final.Counters[k]; got != n {
			c.fail("key %d: final counter %d but %d increments logged", k, got, n)
		}
	}
	return c
}

// checkWrites: no accepted write missing. Every write a worker saw
// accepted is in the server's log and every logged write comes from a
// worker op that was not told "refused"; and a holder that was not paused
// never has a fenced write refused before it was told of the loss.
func (r *run) checkWrites() *Check {
	c := &Check{Name: CWrites, Guarantee: "fenced-resource safety: every accepted write is on the server, no refused one is; a live holder's writes are accepted"}
	applied := map[int64]bool{}
	for _, row := range r.resLog {
		if row.Op == nil {
			continue
		}
		applied[*row.Op] = true
		op := r.resOps[*row.Op]
		c.Checked++
		switch {
		case op == nil:
			c.fail("key %d: a write (seq %d) by an op no worker logged", row.Key, row.Seq)
		case op.result == "refused":
			c.fail("key %d: worker %d.%d was told its %s was refused, but the server applied it (seq %d)", row.Key, op.w, op.inc, op.kind, row.Seq)
		}
	}
	for _, op := range r.resOps {
		if op.kind == "read" {
			continue
		}
		c.Checked++
		if op.result == "ok" && !applied[op.op] {
			c.fail("key %d: worker %d.%d was told its %s (fence %d) was accepted, but the server has no such write", op.key, op.w, op.inc, op.kind, op.fence)
		}
		if op.result != "refused" {
			continue
		}
		g := r.grants[op.grant]
		if g == nil || r.exempt(op.w, g.callT, max(op.retT, op.callT), r.margin()) {
			continue
		}
		// A refused write is fine after the loss notice (the lease may be
		// gone), and at Close (Close releases at once, so a write still
		// in flight may meet the next holder's). Before a notice, the
		// server still had the lease until at least margin + 1 s later,
		// so nobody could have written a newer fence.
		_, rv := r.revoked(g)
		switch {
		case rv: // a revoke frees the key at once: the next holder's claim may come before the notice
		case g.endCode == "Closed":
		case g.endCode == "LockLost" && op.callT >= g.endT:
		default:
			c.fail("key %d: worker %d.%d holding fence %d had its %s with fence %d refused before any loss notice (end %q)", op.key, op.w, op.inc, g.fence, op.kind, op.fence, g.endCode)
		}
	}
	return c
}

// nextServerGrant returns the server grant of key k that followed the one
// with fence f.
func (r *run) nextServerGrant(k int, f int64) *serverGrant {
	gs := r.sgrants[k]
	i := sort.Search(len(gs), func(i int) bool { return gs[i].fence > f })
	if i < len(gs) {
		return gs[i]
	}
	return nil
}

func (r *run) serverGrant(k int, f int64) *serverGrant {
	gs := r.sgrants[k]
	i := sort.Search(len(gs), func(i int) bool { return gs[i].fence >= f })
	if i < len(gs) && gs[i].fence == f {
		return gs[i]
	}
	return nil
}

// checkHolderEnded: server-time exclusivity and the timely loss signal as a user sees them. Every holder that was not
// paused stopped working on its grant (released, or was told of the loss,
// and made no resource call after) before the server granted the key to
// the next holder.
func (r *run) checkHolderEnded() *Check {
	c := &Check{Name: CHolderEnded, Guarantee: "server-time exclusivity and timely loss signal: every holder not paused stopped (release or loss notice) before the next grant of its key"}
	for _, g := range r.grants {
		next := r.nextServerGrant(g.key, g.fence)
		if next == nil {
			continue
		}
		if _, rv := r.revoked(g); rv {
			// A revoke frees the key at once: the holder hears of it as
			// the next grant may be made (revoked-holder-stops checks it).
			c.Skipped++
			continue
		}
		stop, ok := g.stopped()
		if r.exempt(g.w, g.callT, max(stop, next.atT), tolerance+r.margin()) {
			c.Skipped++
			continue
		}
		c.Checked++
		if !ok {
			c.fail("%s: worker %d.%d (fence %d) never stopped, yet fence %d was granted", kn(g.key), g.w, g.inc, g.fence, next.fence)
			continue
		}
		if stop >= next.atT {
			c.fail("%s: worker %d.%d (fence %d) stopped %s after fence %d was granted (end %q)", kn(g.key), g.w, g.inc, g.fence,
				time.Duration(stop-next.atT).Round(time.Microsecond), next.fence, g.endCode)
		}
	}
	return c
}

// checkNotice: timely loss signal. A loss notice comes while the server still has the
// lease (before the expiry in force at that moment, and before any
// release or takeover), unless the holder was paused.
func (r *run) checkNotice(rep *Report) *Check {
	c := &Check{Name: CNoticeTimely, Guarantee: "timely loss signal: a loss notice comes while the server still has the lease"}
	for _, g := range r.grants {
		if g.endCode != "LockLost" {
			continue
		}
		if _, rv := r.revoked(g); rv {
			continue // a revoked holder that missed the notice hears of it at its next extend, after the delete (revoked-holder-stops)
		}
		if r.exempt(g.w, g.callT, g.endT, r.margin()) {
			c.Skipped++
			continue
		}
		s := r.serverGrant(g.key, g.fence)
		if s == nil {
			continue // grants-committed reports it
		}
		c.Checked++
		alive, left := s.aliveAt(g.endT, r)
		if alive {
			rep.NoticeLeft = append(rep.NoticeLeft, time.Duration(left))
			continue
		}
		if s.deletedT > 0 && g.endT >= s.deletedT {
			c.fail("%s: worker %d.%d (fence %d) heard of the loss %s after the server deleted the lease", kn(g.key), g.w, g.inc, g.fence,
				time.Duration(g.endT-s.deletedT).Round(time.Microsecond))
		} else {
			c.fail("%s: worker %d.%d (fence %d) heard of the loss %s after the lease expired on the server", kn(g.key), g.w, g.inc, g.fence,
				time.Duration(-left).Round(time.Microsecond))
		}
	}
	sort.Slice(rep.NoticeLeft, func(i, j int) bool { return rep.NoticeLeft[i] < rep.NoticeLeft[j] })
	return c
}

// checkAdvisory: advisory locks are weaker. Two holders of one advisory key overlap only when the
// earlier one's session was lost (the server freed its lock) and then for
// no longer than its probe bound.
func (r *run) checkAdvisory() *Check {
	c := &Check{Name: CAdvisory, Guarantee: "advisory locks are weaker: advisory holders overlap only after a lost session, for at most ProbeInterval+ProbeTimeout (+1 s)"}
	bound := r.meta.ProbeBound + slack/2
	byKey := map[int][]*advGrant{}
	for _, a := range r.advs {
		byKey[a.key] = append(byKey[a.key], a)
	}
	for k, as := range byKey {
		sort.Slice(as, func(i, j int) bool { return as[i].okT < as[j].okT })
		for i, a := range as {
			stop, ok := a.stopped()
			if !ok {
				stop = r.endT
			}
			paused := r.pausedDuring(a.w, a.okT, stop)
			for _, b := range as[i+1:] {
				if b.okT >= stop {
					break
				}
				if paused {
					c.Skipped++
					continue
				}
				overlap := time.Duration(stop - b.okT)
				if overlap <= bound && (a.endCode == "LockLost" || r.sessionFault(a.w, a.okT-int64(time.Second), stop)) {
					continue
				}
				c.fail("advisory key %d: worker %d.%d got it %s before worker %d.%d stopped holding it (end %q)", k, b.w, b.inc,
					overlap.Round(time.Microsecond), a.w, a.inc, a.endCode)
			}
			if i+1 < len(as) {
				c.Checked++
			}
		}
	}
	return c
}

// sessionFault reports whether a fault that ends server sessions hit
// worker w (or the server) in [from, to]: the server then frees the
// session's advisory locks at once, and the holder may release before its
// probe notices.
func (r *run) sessionFault(w int, from, to int64) bool {
	for _, f := range r.faults {
		if f.w != w && f.w != -1 {
			continue
		}
		switch f.typ {
		case driver.FTerminateAdv, driver.FTerminatePool, driver.FCut, driver.FHalfOpen, driver.FCrash, driver.FRestart:
		default:
			continue
		}
		end := f.healT
		if end == 0 {
			end = r.endT
		}
		if f.startT <= to && end >= from {
			return true
		}
	}
	return false
}

// nextFaultOn returns when the first fault after f that hits worker w
// (its own, or a server fault) started; 0 if none.
func (r *run) nextFaultOn(w int, f *fault) int64 {
	for _, g := range r.faults { // in start order
		if g != f && g.startT > f.startT && (g.w == w || g.w == -1) {
			return g.startT
		}
	}
	return 0
}

// checkRecovery: takeover after a crash, reconnection, dead connections
// cost one bounded timeout (docs/guarantees.md). After each fault heals, its target gets a
// lease again within recoveryBound.
func (r *run) checkRecovery() (*Check, []*Recovery) {
	bound := r.recoveryBound()
	c := &Check{Name: CRecovery, Guarantee: fmt.Sprintf("takeover, reconnection, dead connections cost one bounded timeout: each fault's target gets a lease again within %s of the heal", bound)}
	okTimes := map[int][]int64{} // per worker, sorted grant times (lease keys)
	for _, g := range r.grants {
		if isLeaseKey(g.key) {
			okTimes[g.w] = append(okTimes[g.w], g.okT)
		}
	}
	for _, ts := range okTimes {
		sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
	}
	byType := map[string][]time.Duration{}
	recs := map[string]*Recovery{}
	for _, t := range driver.FaultTypes {
		recs[t] = &Recovery{Type: t, Bound: bound}
	}
	end := r.meta.StopAt
	var tsv strings.Builder
	tsv.WriteString("fault\ttype\tworker\tstart_s\theal_s\trecovery_ms\n")
	row := func(f *fault, w int, rec string) {
		fmt.Fprintf(&tsv, "%d\t%s\t%d\t%.3f\t%.3f\t%s\n", f.id, f.typ, w, float64(f.startT-r.readyT)/1e9, float64(f.healT-r.readyT)/1e9, rec)
	}
	defer func() { _ = os.WriteFile(filepath.Join(r.dir, "recovery.tsv"), []byte(tsv.String()), 0o644) }()
	measure := func(f *fault, w int) {
		rc := recs[f.typ]
		from := f.healT
		if from == 0 {
			rc.Censored++
			row(f, w, "censored")
			return
		}
		ts := okTimes[w]
		i := sort.Search(len(ts), func(i int) bool { return ts[i] > from })
		// The window in which this fault alone is to blame: until the
		// next fault on the same target (or the server), or the end.
		horizon := end
		if nf := r.nextFaultOn(w, f); nf > 0 && nf < horizon {
			horizon = nf
		}
		if i < len(ts) && ts[i] <= horizon {
			d := time.Duration(max(0, ts[i]-from))
			row(f, w, strconv.FormatInt(d.Milliseconds(), 10))
			byType[f.typ] = append(byType[f.typ], d)
			rc.Measured++
			c.Checked++
			if d > bound {
				rc.Over++
				c.fail("%s on worker %d (fault %d): first lease %s after the heal", f.typ, w, f.id, d.Round(time.Millisecond))
			}
			return
		}
		if time.Duration(horizon-from) < bound {
			rc.Censored++
			row(f, w, "censored")
			return
		}
		row(f, w, "none")
		rc.Measured++
		rc.Over++
		c.Checked++
		byType[f.typ] = append(byType[f.typ], time.Duration(horizon-from))
		c.fail("%s on worker %d (fault %d): no lease in the %s after the heal", f.typ, w, f.id, time.Duration(horizon-from).Round(time.Millisecond))
	}
	for _, f := range r.faults {
		recs[f.typ].Faults++
		if f.w >= 0 {
			measure(f, f.w)
			continue
		}
		for w := range r.meta.Workers {
			// A pooler's fault: its target is the workers behind it.
			if slices.Contains([]string{driver.FPoolPause, driver.FPoolReconnect, driver.FPoolRestart}, f.typ) &&
				!driver.PooledWorker(w, r.meta.Workers, r.meta.Pooled) {
				continue
			}
			measure(f, w)
		}
	}
	var out []*Recovery
	for _, t := range driver.FaultTypes {
		rc := recs[t]
		ds := byType[t]
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		if len(ds) > 0 {
			rc.P50, rc.Max = ds[(len(ds)-1)/2], ds[len(ds)-1]
		}
		if rc.Faults > 0 {
			out = append(out, rc)
		}
	}
	return c, out
}

// checkStarve: no key starves. Every lease key is granted at least once
// in every window of keyGapBound while the server is up (advisory keys:
// advGapBound).
func (r *run) checkStarve(rep *Report) *Check {
	kb, ab := r.keyGapBound(), r.advGapBound()
	c := &Check{Name: CStarve, Guarantee: fmt.Sprintf("liveness: no lease key goes %s, no advisory key %s, without a grant (server up)", kb, ab)}
	from, to := r.readyT, r.meta.StopAt
	if from == 0 || to <= from {
		return c
	}
	gap := func(ts []int64, bound time.Duration, what string, k int) time.Duration {
		sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
		prev := from
		var worst time.Duration
		for _, t := range append(ts, to) {
			if t < from || t > to {
				continue
			}
			g := time.Duration(t-prev) - r.downWithin(prev, t)
			worst = max(worst, g)
			c.Checked++
			if g > bound {
				c.fail("%s key %d: no grant for %s (server up)", what, k, g.Round(time.Millisecond))
			}
			prev = t
		}
		return worst
	}
	for k := range r.meta.Keys {
		var ts []int64
		for _, s := range r.sgrants[k] {
			ts = append(ts, s.atT)
		}
		rep.KeyGapMax = max(rep.KeyGapMax, gap(ts, kb, "lease", k))
	}
	if r.meta.AdvG > 0 {
		byKey := map[int][]int64{}
		for _, a := range r.advs {
			byKey[a.key] = append(byKey[a.key], a.okT)
		}
		for k := range r.meta.AdvKeys {
			rep.AdvGapMax = max(rep.AdvGapMax, gap(byKey[k], ab, "advisory", k))
		}
	}
	return c
}

func (r *run) downWithin(from, to int64) time.Duration {
	var d int64
	for _, iv := range r.srvDown {
		lo, hi := max(iv.from, from), min(iv.to, to)
		if hi > lo {
			d += hi - lo
		}
	}
	return time.Duration(d)
}

// checkClose: close is bounded. Every worker told to stop closes its Manager within
// closeBound.
func (r *run) checkClose(rep *Report) *Check {
	bound := r.closeBound()
	c := &Check{Name: CClose, Guarantee: fmt.Sprintf("close is bounded: Close returns within %s", bound)}
	for wi, d := range r.deaths {
		if d.t < r.meta.StopAt {
			continue // killed by a fault, not told to stop
		}
		c.Checked++
		dur, ok := r.closes[wi]
		if !ok {
			c.fail("worker %d.%d exited (%s) without finishing Close", wi[0], wi[1], d.status)
			continue
		}
		rep.CloseMax = max(rep.CloseMax, time.Duration(dur))
		if time.Duration(dur) > bound {
			c.fail("worker %d.%d: Close took %s", wi[0], wi[1], time.Duration(dur).Round(time.Millisecond))
		}
	}
	return c
}

// checkLeftovers: close is bounded. Close releases what it holds: every lease still
// held when its worker was told to stop is deleted on the server (not
// left to expire), and after every worker closed no live lease row and no
// advisory lock is left.
func (r *run) checkLeftovers() *Check {
	c := &Check{Name: CLeftovers, Guarantee: "close is bounded: Close releases every lease and shared hold it holds; afterwards no live lease row, shared hold, advisory lock or (with -fair) queue ticket is left", Checked: 3}
	if r.final.LiveRows > 0 {
		c.fail("%d unexpired lease rows left after every worker closed", r.final.LiveRows)
	}
	if r.final.LiveShared > 0 {
		c.fail("%d unexpired shared holds left after every worker closed", r.final.LiveShared)
	}
	if r.final.AdvisoryLocks > 0 {
		c.fail("%d advisory locks still held after every worker closed", r.final.AdvisoryLocks)
	}
	if r.meta.Fair {
		// A waiter that gives up, and Close, leave their tickets; a
		// ticket left would hold its key's later waiters up to its life.
		c.Checked++
		if r.final.LiveTickets > 0 {
			c.fail("%d unexpired fair-queue tickets left after every worker closed", r.final.LiveTickets)
		}
	}
	for _, g := range r.grants {
		if g.endT != 0 && g.endT < r.meta.StopAt || g.okT >= r.meta.StopAt {
			continue // ended before the stop
		}
		if d, ok := r.deaths[[2]int{g.w, g.inc}]; ok && d.t < r.meta.StopAt {
			continue // killed before the stop: its lease expires
		}
		s := r.serverGrant(g.key, g.fence)
		if s == nil {
			continue
		}
		c.Checked++
		// Released: deleted, or handed over (a local handoff is one
		// UPDATE that releases and grants) before it expired; not a
		// takeover of an expired lease.
		released := s.deletedBy == "D"
		if s.deletedBy == "U" {
			released, _ = s.aliveAt(s.deletedT-1, r)
		}
		if !released {
			c.fail("%s: worker %d.%d held fence %d at the stop and its Close did not release it", kn(g.key), g.w, g.inc, g.fence)
		}
	}
	r.sharedLeftovers(c)
	return c
}

// checkCoded: every error a worker got from pglease is a *pglease.Error.
func (r *run) checkCoded() *Check {
	c := &Check{Name: CCoded, Guarantee: "every error is a *pglease.Error with a code"}
	for code, n := range r.errs {
		c.Checked += n
		if strings.HasPrefix(code, "uncoded") {
			for range n {
				c.fail("error without a pglease code: %s", code)
			}
		}
	}
	return c
}

// checkHygiene: no panic, no data race, no goroutine left after Close, no
// worker that died by itself.
func (r *run) checkHygiene() *Check {
	c := &Check{Name: CHygiene, Guarantee: "no panic, no data race (-race workers), no goroutine leak, no worker died by itself"}
	for _, s := range r.stderr {
		c.fail("%s", s)
	}
	for _, l := range r.leaks {
		c.fail("goroutine leak: %s", l)
	}
	for wi, d := range r.deaths {
		c.Checked++
		if d.reason != "killed" {
			c.fail("worker %d.%d died by itself: %s", wi[0], wi[1], d.status)
		} else if d.t >= r.meta.StopAt && d.status != "0" {
			c.fail("worker %d.%d exited with %s after the stop", wi[0], wi[1], d.status)
		}
	}
	return c
}
