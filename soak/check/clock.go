package check

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// The server's wall clock under the clock-step fault: the driver logs each
// step (event.ClockStep: from then on the server's clock runs V ns ahead
// of true time). Server timestamps and expiries map to the monotonic
// clock through the step in force, not only through the realtime offset.

// stepSlack is how long the driver may take between a step and its log
// line (a file rename, a write).
const stepSlack = int64(50 * time.Millisecond)

// clockSeg: from mono time t on, the server's clock ran off ns ahead.
// Audit rows numbered below sa read the clock before the step, rows above
// sb after it (0: unknown).
type clockSeg struct{ t, off, sa, sb int64 }

// stepAt is one step: the server's clock moved by d (positive: forward)
// at mono time t.
type stepAt struct{ t, d int64 }

// addClockStep records a step to offset off at mono time t; sa and sb
// bound it in the audits' sequence (0: unknown).
func (r *run) addClockStep(t, off, sa, sb int64) {
	prev := int64(0)
	if n := len(r.clock); n > 0 {
		prev = r.clock[n-1].off
	}
	if off == prev {
		return
	}
	r.clock = append(r.clock, clockSeg{t, off, sa, sb})
	r.steps = append(r.steps, stepAt{t, off - prev})
}

// offAt is the server clock's offset from true time at mono time t.
func (r *run) offAt(t int64) int64 {
	i := sort.Search(len(r.clock), func(i int) bool { return r.clock[i].t > t }) - 1
	if i < 0 {
		return 0
	}
	return r.clock[i].off
}

// serverNow is the server's clock (ns since the epoch) at mono time t.
func (r *run) serverNow(t int64) int64 { return t + r.offset + r.offAt(t) }

// atMono maps a server timestamp read at an event (clock_timestamp(), ns)
// to the mono time of the event; seq is the audit row's number (0: none).
// After a backward step the server's clock shows some times twice: the
// side of each step the row's number puts it on decides, and among what
// is left the candidate nearest hint (the mono time of the log's previous
// row, which is in commit order) is taken.
func (r *run) atMono(serverNs, hint, seq int64) int64 {
	t := serverNs - r.offset
	if len(r.clock) == 0 {
		return t
	}
	best, bestD := int64(0), int64(-1)
	consider := func(m int64) {
		d := m - hint
		if d < 0 {
			d = -d
		}
		if bestD < 0 || d < bestD {
			best, bestD = m, d
		}
	}
	// ruledOut: the row's number puts it before step i or after step
	// i+1, outside segment i (-1: before the first step).
	ruledOut := func(i int) bool {
		if seq == 0 {
			return false
		}
		if i >= 0 && r.clock[i].sa > 0 && seq < r.clock[i].sa {
			return true
		}
		return i+1 < len(r.clock) && r.clock[i+1].sb > 0 && seq > r.clock[i+1].sb
	}
	for _, bySeq := range []bool{true, false} {
		// Before the first step: offset 0.
		if t < r.clock[0].t+stepSlack && !(bySeq && ruledOut(-1)) {
			consider(t)
		}
		// A step is logged right after the driver made it: a row of the
		// moments between falls up to stepSlack outside its segment.
		for i, sg := range r.clock {
			m := t - sg.off
			end := int64(1) << 62
			if i+1 < len(r.clock) {
				end = r.clock[i+1].t + stepSlack
			}
			if m >= sg.t-stepSlack && m < end && !(bySeq && ruledOut(i)) {
				consider(m)
			}
		}
		if bestD >= 0 {
			break
		}
	}
	if bestD < 0 { // in a gap a forward step jumped over: the step's time
		for _, sg := range r.clock {
			if t-sg.off < sg.t {
				return sg.t
			}
		}
		return t
	}
	return best
}

// expMono is the first mono time from from on (when the expiry was set)
// at which the server's clock reached serverNs (an expiry, ns): from
// itself when it had already; at a forward step that jumped over it, the
// step's time. (After a backward step the clock shows some times a second
// time: an expiry set after the step is reached the second time.)
func (r *run) expMono(serverNs, from int64) int64 {
	t := serverNs - r.offset
	// Segments: before the first step (offset 0), then one per step.
	i := sort.Search(len(r.clock), func(i int) bool { return r.clock[i].t > from }) - 1
	for ; ; i++ {
		start, off, end := int64(-1<<62), int64(0), int64(1<<62)
		if i >= 0 {
			start, off = r.clock[i].t, r.clock[i].off
		}
		if i+1 < len(r.clock) {
			end = r.clock[i+1].t
		}
		start = max(start, from)
		m := t - off
		if m < start {
			return start
		}
		if m < end {
			return m
		}
	}
}

// forwardStepDuring reports whether the server's clock stepped forward by
// more than over in [from, to]: leases then end on the server earlier
// than their holders' trust windows, which S4 assumes it does not.
func (r *run) forwardStepDuring(from, to int64, over time.Duration) bool {
	for _, s := range r.steps {
		if s.t >= from && s.t <= to && s.d > int64(over) {
			return true
		}
	}
	return false
}

// backStepMax is the largest backward step of the run: a dead holder's
// lease lasts that much longer on the server, and liveness bounds grow
// by it.
func (r *run) backStepMax() time.Duration {
	var m int64
	for _, s := range r.steps {
		m = max(m, -s.d)
	}
	return time.Duration(m)
}

// margin is the workers' loss margin (Manager.Config.LossMargin: 0 is
// TTL/10, within 10 ms–5 s).
func (r *run) margin() time.Duration {
	if r.meta.Margin > 0 {
		return r.meta.Margin
	}
	return min(max(r.meta.TTL/10, 10*time.Millisecond), 5*time.Second)
}

// tolerance is the server's expiry tolerance the checks assume (1 s).
const tolerance = time.Second

// exempt reports whether a holder's grant is exempt from the checks of
// its timing (S4) from callT to to: paused (SIGSTOP) meanwhile, or the
// server's clock stepped forward by more than over (the margin for the
// loss notice; tolerance + margin for exclusivity) — what S4 assumes
// does not happen; fencing (S3) is what holds then, and is checked.
func (r *run) exempt(w int, from, to int64, over time.Duration) bool {
	return r.pausedDuring(w, from, to) || r.forwardStepDuring(from, to, over)
}

// mapServerTimes maps the rows of both lock audits (one sequence, in
// commit order) to mono times, in seq order, each row's candidate nearest
// the previous row's: after a backward step the rows of the two audits
// together are dense enough (ms apart) to tell the repeated times apart.
func (r *run) mapServerTimes() error {
	type row struct {
		Seq  int64 `json:"seq"`
		AtUs int64 `json:"at_us"`
	}
	var rows []row
	for _, name := range []string{"lock_log.jsonl", "shared_log.jsonl"} {
		f, err := os.Open(filepath.Join(r.dir, name))
		if errors.Is(err, os.ErrNotExist) && name == "shared_log.jsonl" {
			continue
		}
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var x row
			if err := json.Unmarshal(sc.Bytes(), &x); err != nil {
				f.Close()
				return err
			}
			rows = append(rows, x)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return err
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Seq < rows[j].Seq })
	r.seqT = make(map[int64]int64, len(rows))
	hint := int64(0)
	for _, x := range rows {
		hint = r.atMono(x.AtUs*1000, hint, x.Seq)
		r.seqT[x.Seq] = hint
	}
	return nil
}
