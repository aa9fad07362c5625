package store

// WithoutHolderForTest makes s record no holder identity (p_holder NULL),
// for the cost comparison in BenchmarkHolderCost.
func WithoutHolderForTest(s *Store) { s.holder = "" }

// DBForTest returns the Store's DB, for tests that set the schema up with
// package pg/migrate (which the store cannot import).
func (s *Store) DBForTest() DB { return s.db }

// ConfigForTest returns the Store's Config.
func (s *Store) ConfigForTest() Config { return s.cfg }
