package manager

import "testing"

func TestFairOrderWithoutQueue(t *testing.T) { testFairOrder(t, false) }
