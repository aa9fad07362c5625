package telemetry

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/obs"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

func randomToken(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// secrets are the raw keys and lockIds of one run.
type secrets struct {
	keys, lockIDs []string
}

func newSecrets(t testing.TB, n int) secrets {
	var s secrets
	for i := range n {
		tag := strings.ToLower(randomToken(t, 6))
		var key string
		switch i % 4 {
		case 0:
			key = fmt.Sprintf("payment:%d:%s", i, tag)
		case 1:
			key = fmt.Sprintf("user%d.%s@example.com", i, tag)
		case 2:
			key = fmt.Sprintf("café/%d/%s", i, tag)
		default:
			key = fmt.Sprintf("秘密-%d-%s", i, tag)
		}
		s.keys = append(s.keys, key)
		s.lockIDs = append(s.lockIDs, randomToken(t, 16)) // 22 chars, as a real lockId
	}
	return s
}

// leakyErr is what a careless layer might return: its text quotes the key
// and the lockId.
func leakyErr(code pglease.Code, key, lockID string) error {
	msg := fmt.Sprintf("key %q lockId %s", key, lockID)
	if code == 0 {
		return fmt.Errorf("driver: %s", msg)
	}
	return pgerr.New(code, "test", msg, fmt.Errorf("cause: %s %s", key, lockID))
}

// exercise drives every Recorder path for every key, concurrently, with
// errors whose text contains the key and its lockId.
func exercise(t testing.TB, r *obs.Recorder, s secrets) {
	l := r.Loop()
	var wg sync.WaitGroup
	for i := range s.keys {
		wg.Go(func() {
			key, id := s.keys[i], s.lockIDs[i]
			kid := r.Key(key)
			ctx, a := r.StartAcquire(context.Background(), kid, obs.AcquireInfo{Kind: obs.LockKind(i % 2), TTL: time.Second, Try: i%7 == 0})
			a.Queued(obs.QueueInfo{Coalesced: i%3 == 0, HeldLocally: i%5 == 0, Position: i % 4})
			_, db := r.StartDB(ctx, obs.OpAcquireMany, 1+i%8, a.SpanContext())
			db.End(0, leakyErr(pglease.CodeServiceUnavailable, key, id))
			a.Attempt(db.SpanContext(), obs.AttemptFailed, time.Millisecond)
			_, db = r.StartDB(ctx, obs.OpAcquireMany, 1, trace.SpanContext{})
			db.End(1, nil)
			switch i % 6 {
			case 0:
				a.NotAcquired()
				return
			case 1:
				a.Failed(leakyErr(pglease.CodeAcquisitionTimeout, key, id))
				return
			case 2:
				a.Failed(leakyErr(0, key, id))
				return
			}
			a.Attempt(db.SpanContext(), obs.AttemptGranted, 0)
			a.Granted(pglease.Fence(i + 1))
			l.Busy()
			l.SetDepth(obs.QueueWaiters, i)
			l.Idle()
			hctx, hb := r.StartHeartbeat(context.Background(), 1)
			_, edb := r.StartDB(hctx, obs.OpExtendMany, 1, trace.SpanContext{})
			edb.End(0, leakyErr(pglease.CodeNetworkTimeout, key, id))
			a.ExtendFailed(leakyErr(pglease.CodeNetworkTimeout, key, id))
			a.Extended(time.Millisecond)
			hb.End(0, 0, leakyErr(pglease.CodeNetworkTimeout, key, id))
			if i%6 == 3 {
				a.Lost(obs.LossNotHeld, edb.SpanContext())
				return
			}
			_, rel := a.StartRelease(context.Background())
			rel.Served(edb.SpanContext())
			if i%6 == 4 {
				rel.End(leakyErr(pglease.CodeLockLost, key, id))
			} else {
				rel.End(leakyErr(pglease.CodeServiceUnavailable, key, id))
			}
		})
	}
	wg.Wait()
}

// corpus renders everything the run exported: every span's name,
// attributes, events, links and status; every metric's name and
// data-point attributes; and every log record.
func (h *harness) corpus() string {
	var b strings.Builder
	kv := func(attrs []attribute.KeyValue) {
		for _, a := range attrs {
			b.WriteString(string(a.Key))
			b.WriteByte('=')
			b.WriteString(a.Value.String())
			b.WriteByte(' ')
		}
	}
	for _, s := range h.ended() {
		b.WriteString(s.Name())
		kv(s.Attributes())
		for _, e := range s.Events() {
			b.WriteString(e.Name)
			kv(e.Attributes)
		}
		for _, l := range s.Links() {
			kv(l.Attributes)
			b.WriteString(l.SpanContext.TraceState().String())
		}
		b.WriteString(s.Status().Description)
		kv(s.Resource().Attributes())
		b.WriteByte('\n')
	}
	rm := h.collect()
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			b.WriteString(m.Name + " " + m.Description + " ")
			sets, ok := attrSets(m)
			if !ok {
				panic(fmt.Sprintf("corpus: unhandled %T", m.Data))
			}
			for _, s := range sets {
				kv(s.ToSlice())
			}
			b.WriteByte('\n')
		}
	}
	b.WriteString(h.logs.String())
	return b.String()
}

func hits(corpus string, values []string) (n int, first string) {
	for _, v := range values {
		if strings.Contains(corpus, v) {
			if n == 0 {
				first = v
			}
			n++
		}
	}
	return n, first
}

// TestNoRawKeysOrLockIDs is RELIABILITY.md §6.3's scan: a run over many
// keys, on every path, with errors that quote keys and lockIds, leaves
// none of them in any span, event, status, metric or log record.
func TestNoRawKeysOrLockIDs(t *testing.T) {
	t.Parallel()
	secret := []byte("hmac-secret-" + randomToken(t, 24))
	for _, tc := range []struct {
		name string
		opts []func(*Config)
	}{
		{"hashKey", nil},
		{"hmac", []func(*Config){func(c *Config) { c.KeySecret = secret }}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, tc.opts...)
			s := newSecrets(t, 240)
			exercise(t, h.rec, s)
			corpus := h.corpus()
			if len(h.ended()) < len(s.keys)*3 || !strings.Contains(corpus, `"msg":"pglease: lock lost"`) {
				t.Fatalf("the run recorded too little to be a meaningful scan (%d spans)", len(h.ended()))
			}
			if n, first := hits(corpus, s.keys); n != 0 {
				t.Errorf("%d raw keys found, e.g. %q", n, first)
			}
			if n, first := hits(corpus, s.lockIDs); n != 0 {
				t.Errorf("%d lockIds found, e.g. %q", n, first)
			}
			if strings.Contains(corpus, string(secret)) {
				t.Errorf("the HMAC secret was exported")
			}
			// The hashes are there instead.
			if n, _ := hits(corpus, []string{h.rec.Key(s.keys[5]).Hash(), h.rec.Key(s.keys[10]).Hash()}); n != 2 {
				t.Errorf("key hashes missing from the telemetry")
			}
		})
	}
	// Control: the scan does find raw keys when they are opted in, and
	// lockIds still never appear.
	t.Run("rawKeysControl", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, func(c *Config) { c.RawKeys = true })
		s := newSecrets(t, 40)
		exercise(t, h.rec, s)
		corpus := h.corpus()
		if n, _ := hits(corpus, s.keys); n != len(s.keys) {
			t.Errorf("RawKeys: %d of %d raw keys found, want all", n, len(s.keys))
		}
		if n, first := hits(corpus, s.lockIDs); n != 0 {
			t.Errorf("%d lockIds found with raw keys on, e.g. %q", n, first)
		}
	})
}
