package pg

// WithoutHolderForTest makes s record no holder identity (p_holder NULL),
// for the cost comparison in BenchmarkHolderCost.
func WithoutHolderForTest(s *Store) { s.holder = "" }
