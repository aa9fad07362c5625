package check

import (
	"fmt"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The fenced register: per key, the resource row (fence, counter). A
// claim(f) or write(f, v) is accepted iff f ≥ the stored fence (NULL = 0)
// and then stores f (and v); a read returns the row. Porcupine checks the
// histories the workers observed (call and return on the shared clock)
// against this sequential specification.

type regState struct{ fence, counter int64 }

type regIn struct {
	kind  string // claim | write | read
	fence int64
	value int64
}

type regOut struct {
	result string // ok | refused (claim/write); ok (read)
	fence  int64
	count  int64
}

func registerModel(init regState) porcupine.Model {
	return porcupine.Model{
		Init: func() interface{} { return init },
		Step: func(state, input, output interface{}) (bool, interface{}) {
			s := state.(regState)
			in := input.(regIn)
			out := output.(regOut)
			switch in.kind {
			case "read":
				return out.fence == s.fence && out.count == s.counter, s
			default:
				accept := in.fence >= s.fence
				if accept != (out.result == "ok") {
					return false, s
				}
				if accept {
					s.fence = in.fence
					if in.kind == "write" {
						s.counter = in.value
					}
				}
				return true, s
			}
		},
		Equal: func(a, b interface{}) bool { return a.(regState) == b.(regState) },
		DescribeOperation: func(input, output interface{}) string {
			in, out := input.(regIn), output.(regOut)
			if in.kind == "read" {
				return fmt.Sprintf("read() -> (%d, %d)", out.fence, out.count)
			}
			return fmt.Sprintf("%s(%d, %d) -> %s", in.kind, in.fence, in.value, out.result)
		},
	}
}

// LinearStats summarises the porcupine check.
type LinearStats struct {
	Ops, Segments, Illegal, Unknown int
	Resolved, Dropped               int // ambiguous writes resolved from the server log: applied / not applied
	Elapsed                         time.Duration
}

// checkLinear checks each key's history of resource operations for
// linearizability. Operations whose outcome the worker did not learn (an
// error after sending, or a process killed mid-call) are resolved from the
// server's write log, white-box: not applied → dropped (an operation with
// no effect and no observed answer is as if never made); applied → kept as
// accepted, its return placed at the next write the server logged on the
// key (that write waited for its commit on the row lock) or the end. The
// history is cut where no operation is pending across the cut, and each
// segment starts from the state the server's log has at that point.
func (r *run) checkLinear() (*Check, LinearStats) {
	c := &Check{Name: CLinear, Guarantee: "fenced-resource safety: the fenced register is linearizable (porcupine, per key, client-observed histories)"}
	var st LinearStats
	start := time.Now()
	// Server log per key, with mono times and an index by op.
	type logged struct {
		t     int64
		state regState
	}
	logs := map[int][]logged{}
	byOp := map[int64]int{} // op → index in logs[key]
	hint := int64(0)
	for _, row := range r.resLog {
		nf := int64(0)
		if row.NewFence != nil {
			nf = *row.NewFence
		}
		hint = r.atMono(row.AtUs*1000, hint, row.Seq)
		l := logged{t: hint, state: regState{nf, row.NewCounter}}
		logs[row.Key] = append(logs[row.Key], l)
		if row.Op != nil {
			byOp[*row.Op] = len(logs[row.Key]) - 1
		}
	}
	histories := map[int][]porcupine.Operation{}
	end := r.endT
	for _, op := range r.resOps {
		in := regIn{kind: op.kind, fence: op.fence, value: op.value}
		known := op.retT > 0 && (op.result == "ok" || op.result == "refused")
		if op.kind == "read" {
			if !known || op.result != "ok" {
				continue // a read without an answer constrains nothing
			}
			histories[op.key] = append(histories[op.key], porcupine.Operation{ClientId: op.w, Input: in,
				Call: op.callT, Return: op.retT, Output: regOut{result: "ok", fence: op.readF, count: op.readC}, Metadata: op.op})
			continue
		}
		if known {
			histories[op.key] = append(histories[op.key], porcupine.Operation{ClientId: op.w, Input: in,
				Call: op.callT, Return: op.retT, Output: regOut{result: op.result}, Metadata: op.op})
			continue
		}
		i, applied := byOp[op.op]
		if !applied {
			st.Dropped++
			continue
		}
		st.Resolved++
		ret := end
		if kl := logs[op.key]; i+1 < len(kl) {
			ret = kl[i+1].t
		}
		ret = max(ret, op.retT, op.callT)
		histories[op.key] = append(histories[op.key], porcupine.Operation{ClientId: op.w, Input: in,
			Call: op.callT, Return: ret, Output: regOut{result: "ok"}, Metadata: op.op})
	}
	for k, ops := range histories {
		sort.Slice(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
		st.Ops += len(ops)
		// The server state after the last logged write of ops before a
		// cut: the highest log index among them.
		segStart := 0
		state := regState{}
		lastIdx := -1
		var maxRet int64
		flush := func(to int) {
			seg := ops[segStart:to]
			if len(seg) == 0 {
				return
			}
			st.Segments++
			res := porcupine.CheckOperationsTimeout(registerModel(state), seg, 20*time.Second)
			switch res {
			case porcupine.Illegal:
				st.Illegal++
				c.fail("key %d: %d operations from %s are not linearizable: %s", k, len(seg),
					time.Duration(seg[0].Call-r.readyT).Round(time.Millisecond), describe(seg))
			case porcupine.Unknown:
				st.Unknown++
			}
			c.Checked += len(seg)
		}
		for i, op := range ops {
			if i > segStart && op.Call > maxRet && i-segStart >= 64 {
				flush(i)
				segStart = i
				if lastIdx >= 0 {
					state = logs[k][lastIdx].state
				}
			}
			maxRet = max(maxRet, op.Return)
			in := op.Input.(regIn)
			if in.kind != "read" {
				// the op's own log entry, if it was applied
				if idx, ok := byOp[op.Metadata.(int64)]; ok && idx > lastIdx {
					lastIdx = idx
				}
			}
		}
		flush(len(ops))
	}
	st.Elapsed = time.Since(start)
	return c, st
}

func describe(seg []porcupine.Operation) string {
	m := registerModel(regState{})
	s := ""
	for i, op := range seg {
		if i == 8 {
			s += " …"
			break
		}
		if i > 0 {
			s += "; "
		}
		s += fmt.Sprintf("w%d %s", op.ClientId, m.DescribeOperation(op.Input, op.Output))
	}
	return s
}
