// Package event is the soak's event log: one JSON object per line, written
// by the driver and by every worker process, each stamped with
// CLOCK_MONOTONIC (Now), which all processes of one machine share. Go's
// own monotonic clock reading (time.Now's hidden part) is per process and
// cannot be compared across processes; CLOCK_MONOTONIC can.
package event

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Now returns CLOCK_MONOTONIC in nanoseconds.
func Now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err) // cannot happen on Linux
	}
	return ts.Nano()
}

// RealtimeOffset returns CLOCK_REALTIME − CLOCK_MONOTONIC in nanoseconds,
// read back to back (the smaller of three tries' spans), so that a server
// timestamp on this machine's clock (PostgreSQL's clock_timestamp()) maps
// to the shared monotonic clock as real − offset.
func RealtimeOffset() int64 {
	best, bestSpan := int64(0), int64(1<<62)
	for range 3 {
		var a, r, b unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &a)
		_ = unix.ClockGettime(unix.CLOCK_REALTIME, &r)
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &b)
		if span := b.Nano() - a.Nano(); span < bestSpan {
			bestSpan = span
			best = r.Nano() - (a.Nano()+b.Nano())/2
		}
	}
	return best
}

// Event kinds. Worker events carry W (worker id), I (incarnation: 0 for
// the first process of a worker id, +1 per restart) and G (goroutine).
const (
	// worker life
	Start     = "start"  // V = pid
	Ready     = "ready"  // the Manager is up
	CloseCall = "close"  // Close called
	CloseRet  = "closed" // Close returned; V = duration ns, C = code or ""
	Leak      = "leak"   // goroutines left after Close; M = summary
	Exit      = "exit"   // the worker is about to exit normally
	ErrEv     = "err"    // an error outside a lock cycle; C = code, M = text

	// lease cycle (O = the cycle's op id, K = key index). The primitives'
	// holds use the same events, with M the hold's kind (see Kind*) and,
	// for a set's locks, P the set's op id.
	AcqCall = "acq"     // Acquire called; M = kind, L = limit (permits)
	AcqOK   = "acq_ok"  // granted: F = fence, V = server acquired_at ms, V2 = server expires_at ms, M = kind, L = limit, X = grant id
	AcqErr  = "acq_err" // C = code
	End     = "end"     // the lock's Context ended (AfterFunc): C = cause code, V2 = ExpiresAt ms
	Stop    = "stop"    // the holder stopped working on this grant (broken workers log it late)
	RelCall = "rel"     // Release called
	RelRet  = "rel_ret" // C = "" or code

	// resource ops (O = op id, P = the grant's op id, F = fence used, K)
	ResCall = "res"     // M = "claim" | "read" | "write"; V = value written
	ResRet  = "res_ret" // C = "ok" | "refused" | code (CodeAmbiguous: maybe applied); V = counter read, V2 = fence read

	// all-or-nothing sets (O = the set's op id; each lock is an AcqOK with
	// P = O, M = KindSet)
	SetCall = "set"     // AcquireAll called; M = the key indexes asked, comma-separated
	SetOK   = "set_ok"  // V = locks returned, M = their keys' indexes (Lock.Key), comma-separated
	SetErr  = "set_err" // C = code

	// advisory cycle
	AdvCall = "adv" // LockAdvisory called
	AdvOK   = "adv_ok"
	AdvErr  = "adv_err" // C = code
	AdvEnd  = "adv_end" // C = cause code
	AdvRel  = "adv_rel"
	AdvRet  = "adv_rel_ret"

	// driver events (W = target worker, -1 = the server / everyone)
	Fault      = "fault"  // M = fault type, V = planned duration ns, O = fault id
	Heal       = "heal"   // O = fault id: the fault's effect was undone (proxy pass, SIGCONT, restart, server up)
	Spawn      = "spawn"  // a worker process started: I, V = pid
	Died       = "died"   // a worker process exited: I, C = exit status, M = reason
	Offset     = "offset" // V = CLOCK_REALTIME − CLOCK_MONOTONIC ns
	ServerUp   = "server_up"
	ServerDown = "server_down"
	RunEnd     = "run_end"    // faults stopped; the quiet tail begins
	StopAll    = "stop_all"   // workers told to close
	ClockStep  = "clock_step" // the server's wall clock now runs V ns ahead of true time (negative: behind), from this event on
	Revoke     = "revoke"     // a revoke fault's Manager.Revoke returned: O = fault id, W = target, M = key, V = 1 if a live lease was revoked, C = code
)

// Kinds of a hold (M of AcqCall and AcqOK).
const (
	KindExclusive = ""  // Acquire: an exclusive lease (lease keys, writers, exclusive grants of semaphore keys)
	KindReader    = "r" // Acquire with manager.Shared()
	KindPermit    = "p" // Acquire with manager.WithLimit(L)
	KindSet       = "s" // one lock of an AcquireAll (exclusive)
)

// Event is one line of a log. Unused fields are omitted.
type Event struct {
	T  int64  `json:"t"`           // CLOCK_MONOTONIC ns
	E  string `json:"e"`           // kind
	W  int    `json:"w"`           // worker id; -1 for the driver's server events
	I  int    `json:"i,omitempty"` // incarnation
	G  int    `json:"g,omitempty"` // goroutine
	K  int    `json:"k,omitempty"` // key index (lease keys from 0, advisory keys too)
	O  int64  `json:"o,omitempty"` // op id
	P  int64  `json:"p,omitempty"` // parent op id (grant)
	F  int64  `json:"f,omitempty"` // fence
	V  int64  `json:"v,omitempty"`
	V2 int64  `json:"v2,omitempty"`
	C  string `json:"c,omitempty"` // code / result
	M  string `json:"m,omitempty"` // text
	L  int    `json:"l,omitempty"` // a permit's limit
	X  string `json:"x,omitempty"` // a grant's id (pg.GrantID: a hash of the lockId, safe to log)
	// SA and SB bound a clock step in the audits' sequence: the driver
	// drew SA just before the step and SB just after it, so an audit row
	// numbered below SA read the clock before the step, one above SB
	// after it (0: not drawn).
	SA int64 `json:"sa,omitempty"`
	SB int64 `json:"sb,omitempty"`
}

// Writer appends events to a file with one write(2) per event, so a
// process killed with SIGKILL loses no event it logged. Safe for
// concurrent use.
type Writer struct {
	mu  sync.Mutex
	f   *os.File
	buf []byte
	err error
}

// Create opens path for appending (creating it).
func Create(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &Writer{f: f}, nil
}

// Log stamps e with Now (unless e.T is set) and writes it.
func (w *Writer) Log(e Event) {
	if e.T == 0 {
		e.T = Now()
	}
	b, err := json.Marshal(e)
	if err != nil {
		panic(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(append(w.buf[:0], b...), '\n')
	if _, err := w.f.Write(w.buf); err != nil && w.err == nil {
		w.err = err
	}
}

// Close closes the file and returns the first write error.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.f.Close(); err != nil && w.err == nil {
		w.err = err
	}
	return w.err
}

// Read decodes a log. A last line cut short (a process killed while
// writing cannot cut a line, but a full disk can) is ignored.
func Read(r io.Reader, fn func(Event)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return fmt.Errorf("event log line %d: %w", line, err)
		}
		fn(e)
	}
	return sc.Err()
}

// ReadFile is Read on a file.
func ReadFile(path string, fn func(Event)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return Read(f, fn)
}
