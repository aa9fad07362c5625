package main

import (
	"fmt"
	"strings"
	"time"
)

// Formatting shared by the text views.

func ago(d time.Duration) string {
	if d < 0 {
		return "in " + short(-d)
	}
	return short(d) + " ago"
}

func short(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	default:
		return d.Round(time.Minute).String()
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// expires says when a hold expires (ms from now), by SyncGuard's rule
// when live is the answer of that rule (expired holds within the 1 s
// tolerance are still live).
func expires(inMs int64, live bool) string {
	switch {
	case !live:
		return "expired " + short(-time.Duration(inMs)*time.Millisecond) + " ago"
	case inMs <= 0:
		return "expired, in tolerance"
	}
	return "in " + short(time.Duration(inMs)*time.Millisecond)
}

// schemaAdvice says how a schema that is not current is wrong and what
// to run.
func schemaAdvice(s *schemaView) string {
	if s.Version >= s.Needs {
		return fmt.Sprintf("schema v%d is newer than this pglease serves (it needs v%d): upgrade pglease", s.Version, s.Needs)
	}
	return fmt.Sprintf("schema v%d, this pglease needs v%d: %s", s.Version, s.Needs, howToSetup)
}

// processes lists backends as "pid application_name", comma-separated
// ("pid -" for a session without application_name).
func processes(ps []int32, apps []string) string {
	var b strings.Builder
	for i, p := range ps {
		if i > 0 {
			b.WriteString(", ")
		}
		app := ""
		if i < len(apps) {
			app = apps[i]
		}
		fmt.Fprintf(&b, "%d %s", p, dash(app))
	}
	return b.String()
}

// pids joins process ids with commas.
func pids(ps []int32) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = fmt.Sprint(p)
	}
	return strings.Join(s, ",")
}

func atoi(s string) int64 {
	var n int64
	for _, c := range s {
		n = n*10 + int64(c-'0')
	}
	return n
}

// until says when a mark ends, absolutely and relative to now.
func until(t, now time.Time) string {
	return fmt.Sprintf("%s (in %s)", t.Format("2006-01-02 15:04:05 MST"), short(t.Sub(now)))
}

// fenceNum is a 15-digit fence without its leading zeros ("0" for 0: a
// reader of a key never granted).
func fenceNum(f string) string {
	if s := strings.TrimLeft(f, "0"); s != "" {
		return s
	}
	return "0"
}

func joinGuarded(gs []guardedView) string {
	s := make([]string, len(gs))
	for i, g := range gs {
		s[i] = g.String()
	}
	return strings.Join(s, "; ")
}
