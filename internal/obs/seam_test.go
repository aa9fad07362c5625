package obs

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
)

// The tests below replace the registered recorder (package telemetry's,
// linked by the Example) and put it back when they end; they do not run
// in parallel, since they share the registration.

// unregister removes the registered recorder until t ends.
func unregister(t *testing.T) {
	prev := registered.Load()
	registered.Store(nil)
	t.Cleanup(func() { registered.Store(prev) })
}

// TestNewWithoutRecorderPanics: a program that builds a Recorder without
// linking package telemetry fails at once, loudly, instead of recording
// nothing.
func TestNewWithoutRecorderPanics(t *testing.T) {
	unregister(t)
	msg := panicOf(t, func() { New(struct{}{}, Database{}) })
	if !strings.Contains(msg, "github.com/pglease/pglease/telemetry") {
		t.Fatalf("panic %q does not say which package to link", msg)
	}
	// A recorder registered for another configuration type is no recorder
	// for this one.
	Register(func(int, Database) RecorderImpl { return &fake{} })
	if msg := panicOf(t, func() { New("config", Database{}) }); !strings.Contains(msg, "string") {
		t.Fatalf("panic %q does not name the configuration type", msg)
	}
}

func panicOf(t *testing.T, f func()) (msg string) {
	t.Helper()
	defer func() {
		r := recover()
		if r == nil {
			t.Fatal("no panic")
		}
		msg, _ = r.(string)
	}()
	f()
	return ""
}

// TestHandlesForward drives every handle method once and checks that each
// reached the registered recorder with its arguments: the handles hold no
// logic of their own, so a forward that drops or swaps a call would lose
// telemetry silently.
func TestHandlesForward(t *testing.T) {
	unregister(t)
	f := &fake{}
	var gotDB Database
	Register(func(c int, db Database) RecorderImpl {
		if c != 7 {
			t.Errorf("config %d, want 7", c)
		}
		gotDB = db
		return f
	})
	r := New(7, Database{Address: "db", Port: 5432})
	if gotDB.Address != "db" || gotDB.Port != 5432 {
		t.Errorf("database %+v not passed", gotDB)
	}
	if r.Impl() != f || r.Loop().Impl() != f {
		t.Fatal("Impl does not return the registered recorder")
	}
	ctx := context.Background()
	if k := r.Key("k"); k.Hash() != "h(k)" || r.KeyHashed("k", "given").Hash() != "given" {
		t.Errorf("Key/KeyHashed: %q", k.Hash())
	}
	_, a := r.StartAcquire(ctx, NewKeyID("h", ""), AcquireInfo{Kind: KindShared})
	if _, ok := a.Impl().(*fakeAcq); !ok || a.Key().Hash() != "h" {
		t.Fatal("StartAcquire did not return the recorder's acquisition")
	}
	a.Queued(QueueInfo{Position: 2})
	a.Ticket(3)
	a.Attempt(trace.SpanContext{}, AttemptContended, time.Second)
	a.Waiting(WaitHolder, "x")
	a.Granted(9)
	a.NotAcquired()
	a.Failed(errors.New("e"))
	FailedSet([]*Acquisition{nil, a}, errors.New("e"))
	a.Extended(time.Millisecond)
	a.ExtendFailed(errors.New("e"))
	a.Lost(LossRevoked, trace.SpanContext{})
	_, rel := a.StartRelease(ctx)
	rel.Served(trace.SpanContext{})
	rel.End(nil)
	_, db := r.StartDB(ctx, OpRevoke, 4, trace.SpanContext{})
	db.End(3, nil)
	_, hb := r.StartHeartbeat(ctx, 5)
	hb.End(4, 1, nil)
	r.Loop().Busy()
	r.Loop().Idle()
	r.Loop().SetDepth(QueueDue, 6)
	r.ListenerPolling("p")
	r.ConfigWarning("w")
	r.ReleaseTrigger(true, "c")
	r.ForeignHolder()
	r.ListenerUp(true)
	r.Overload(true, OverloadInfo{Op: OpExtendMany})
	r.Close()
	want := "Key KeyHashed StartAcquire Key Queued(2) Ticket(3) Attempt(contended) Waiting(holder,x) Granted(9) " +
		"NotAcquired Failed FailedSet(2) Extended ExtendFailed Lost(revoked) StartRelease ReleaseServed EndRelease " +
		"StartDB(pglease.revoke,4) EndDB(pglease.revoke,4,3) StartHeartbeat(5) EndHeartbeat(4,1) Busy Idle SetDepth(due,6) " +
		"ListenerPolling ConfigWarning ReleaseTrigger ForeignHolder ListenerUp Overload(pglease.extend_many) Close"
	if got := strings.Join(f.calls, " "); got != want {
		t.Errorf("calls:\n got %s\nwant %s", got, want)
	}
}

// TestNilHandlesRecordNothing: a nil Recorder, a nil Acquisition, a nil
// Loop and the zero DBSpan, Heartbeat and Release accept every call.
func TestNilHandlesRecordNothing(t *testing.T) {
	var r *Recorder
	ctx := context.Background()
	if r.Impl() != nil || r.Key("k") != (KeyID{}) || r.KeyHashed("k", "h") != (KeyID{}) || r.Loop() != nil {
		t.Fatal("a nil Recorder returned something")
	}
	c, a := r.StartAcquire(ctx, KeyID{}, AcquireInfo{})
	if c != ctx || a != nil || a.Impl() != nil || a.SpanContext().IsValid() {
		t.Fatal("a nil Recorder started an acquisition")
	}
	a.Queued(QueueInfo{})
	a.Ticket(1)
	a.Attempt(trace.SpanContext{}, AttemptGranted, 0)
	a.Waiting(WaitHolder, "")
	a.Granted(1)
	a.NotAcquired()
	a.Failed(nil)
	FailedSet([]*Acquisition{nil, a}, nil)
	a.Extended(0)
	a.ExtendFailed(nil)
	a.Lost(LossExpired, trace.SpanContext{})
	_, rel := a.StartRelease(ctx)
	rel.Served(trace.SpanContext{})
	rel.End(nil)
	_, db := r.StartDB(ctx, OpAcquireMany, 1, trace.SpanContext{})
	db.End(1, nil)
	_, hb := r.StartHeartbeat(ctx, 1)
	hb.End(1, 0, nil)
	if db.SpanContext().IsValid() || hb.SpanContext().IsValid() {
		t.Fatal("zero handles have a span")
	}
	var l *Loop
	l.Busy()
	l.Idle()
	l.SetDepth(QueueWaiters, 1)
	r.ListenerPolling("")
	r.ConfigWarning("")
	r.ReleaseTrigger(false, "")
	r.ForeignHolder()
	r.ListenerUp(false)
	r.Overload(false, OverloadInfo{})
	r.Close()
}

// fake is a RecorderImpl and LoopImpl that writes down each call; its
// acquisitions are fakeAcqs writing to the same list.
type fake struct{ calls []string }

func (f *fake) add(s string) { f.calls = append(f.calls, s) }

func (f *fake) Key(key string) KeyID { f.add("Key"); return NewKeyID("h("+key+")", "") }

func (f *fake) KeyHashed(_, hash string) KeyID { f.add("KeyHashed"); return NewKeyID(hash, "") }

func (f *fake) StartAcquire(ctx context.Context, key KeyID, _ AcquireInfo) (context.Context, *Acquisition) {
	f.add("StartAcquire")
	fa := &fakeAcq{f: f, key: key}
	fa.pub = NewAcquisition(fa)
	return ctx, &fa.pub
}

func (f *fake) StartDB(ctx context.Context, op DBOperation, batch int, _ trace.SpanContext, _ ...trace.SpanContext) (context.Context, DBSpan) {
	f.add("StartDB(" + string(op) + "," + itoa(batch) + ")")
	return ctx, NewDBSpan(f, nil, op, batch, time.Now())
}

func (f *fake) EndDB(_ trace.Span, op DBOperation, batch int, _ time.Time, ok int, _ error) {
	f.add("EndDB(" + string(op) + "," + itoa(batch) + "," + itoa(ok) + ")")
}

func (f *fake) StartHeartbeat(ctx context.Context, due int) (context.Context, Heartbeat) {
	f.add("StartHeartbeat(" + itoa(due) + ")")
	return ctx, NewHeartbeat(f, nil)
}

func (f *fake) EndHeartbeat(_ trace.Span, extended, lost int, _ error) {
	f.add("EndHeartbeat(" + itoa(extended) + "," + itoa(lost) + ")")
}

func (f *fake) Loop() LoopImpl                     { return f }
func (f *fake) ListenerPolling(string)             { f.add("ListenerPolling") }
func (f *fake) ConfigWarning(string)               { f.add("ConfigWarning") }
func (f *fake) ReleaseTrigger(bool, string)        { f.add("ReleaseTrigger") }
func (f *fake) ForeignHolder()                     { f.add("ForeignHolder") }
func (f *fake) ListenerUp(bool)                    { f.add("ListenerUp") }
func (f *fake) Overload(_ bool, info OverloadInfo) { f.add("Overload(" + string(info.Op) + ")") }
func (f *fake) Close()                             { f.add("Close") }
func (f *fake) Busy()                              { f.add("Busy") }
func (f *fake) Idle()                              { f.add("Idle") }
func (f *fake) SetDepth(q Queue, n int)            { f.add("SetDepth(" + q.String() + "," + itoa(n) + ")") }

type fakeAcq struct {
	pub Acquisition
	f   *fake
	key KeyID
}

func (a *fakeAcq) Key() KeyID                     { a.f.add("Key"); return a.key }
func (a *fakeAcq) SpanContext() trace.SpanContext { return trace.SpanContext{} }
func (a *fakeAcq) Queued(q QueueInfo)             { a.f.add("Queued(" + itoa(q.Position) + ")") }
func (a *fakeAcq) Ticket(position int)            { a.f.add("Ticket(" + itoa(position) + ")") }
func (a *fakeAcq) Granted(fence pglease.Fence)    { a.f.add("Granted(" + itoa(int(fence)) + ")") }
func (a *fakeAcq) NotAcquired()                   { a.f.add("NotAcquired") }
func (a *fakeAcq) Failed(error)                   { a.f.add("Failed") }
func (a *fakeAcq) Extended(time.Duration)         { a.f.add("Extended") }
func (a *fakeAcq) ExtendFailed(error)             { a.f.add("ExtendFailed") }

func (a *fakeAcq) FailedSet(acqs []*Acquisition, _ error) {
	a.f.add("FailedSet(" + itoa(len(acqs)) + ")")
}

func (a *fakeAcq) Lost(c LossCause, _ trace.SpanContext) { a.f.add("Lost(" + c.String() + ")") }

func (a *fakeAcq) Attempt(_ trace.SpanContext, o AttemptOutcome, _ time.Duration) {
	a.f.add("Attempt(" + o.String() + ")")
}

func (a *fakeAcq) Waiting(reason WaitReason, holder string) {
	a.f.add("Waiting(" + reason.String() + "," + holder + ")")
}

func (a *fakeAcq) StartRelease(ctx context.Context) (context.Context, Release) {
	a.f.add("StartRelease")
	return ctx, NewRelease(a, nil, time.Now())
}

func (a *fakeAcq) ReleaseServed(trace.Span, trace.SpanContext) { a.f.add("ReleaseServed") }
func (a *fakeAcq) EndRelease(trace.Span, time.Time, error)     { a.f.add("EndRelease") }

func itoa(n int) string { return strconv.Itoa(n) }
