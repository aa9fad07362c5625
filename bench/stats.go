package main

import (
	"sort"
	"time"
)

// latencies collects per-operation durations from one worker; merge them
// after the run (no locking on the hot path).
type latencies []time.Duration

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p * float64(len(sorted)-1))
	return sorted[i]
}

func summarize(all []latencies) (n int, p50, p99, max time.Duration) {
	var merged []time.Duration
	for _, l := range all {
		merged = append(merged, l...)
	}
	sort.Slice(merged, func(i, j int) bool { return merged[i] < merged[j] })
	if len(merged) == 0 {
		return 0, 0, 0, 0
	}
	return len(merged), percentile(merged, 0.50), percentile(merged, 0.99), merged[len(merged)-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
