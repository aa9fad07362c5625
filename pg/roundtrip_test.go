package pg_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pg"
)

// Each operation of pg.Store is one query, one network write (= one round
// trip) and no prepare once pgx's statement cache is warm, as the
// statements of the store underneath are.
func TestStoreOneRoundTripPerOperation(t *testing.T) {
	t.Parallel()
	cnt := &pgtest.Recorder{}
	s, _, _ := newStore(t, pg.Config{NotifyChannel: "pglease_test"}, cnt.Configure, maxConns(1))
	c := ctx(t)
	var id string
	ops := []struct {
		name string
		fn   func() error
	}{
		{"Acquire", func() error {
			r, err := s.Acquire(c, "rt", time.Minute)
			if err == nil && !r.OK {
				err = errors.New("not acquired")
			}
			id = r.LockID
			return err
		}},
		{"Extend", func() error { _, err := s.Extend(c, id, time.Minute); return err }},
		{"IsLocked", func() error { _, err := s.IsLocked(c, "rt"); return err }},
		{"Lookup", func() error {
			info, err := s.Lookup(c, "rt")
			if err == nil && info == nil {
				err = errors.New("no lock found")
			}
			return err
		}},
		{"Release", func() error { _, err := s.Release(c, id); return err }},
	}
	for round := 0; round < 3; round++ {
		for _, op := range ops {
			cnt.Reset()
			if err := op.fn(); err != nil {
				t.Fatalf("%s: %v", op.name, err)
			}
			if round == 0 {
				continue // warm-up: pgx prepares each statement once per connection, the Store checks the schema once
			}
			if q, p, w := cnt.Queries(), cnt.Prepares(), cnt.Writes(); q != 1 || p != 0 || w != 1 {
				t.Errorf("%s: %d queries, %d prepares, %d writes; want 1, 0, 1", op.name, q, p, w)
			}
		}
	}
}
