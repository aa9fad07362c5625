package check

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

func ms(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	case d < 10*time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	default:
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
}

// Markdown renders the report as the table docs/soak.md carries, and
// writes every violation's details to violations.txt in the run
// directory.
func (rep *Report) Markdown() string {
	var b strings.Builder
	m := rep.Meta
	faults := rep.FaultCount()
	fmt.Fprintf(&b, "### Soak run %s\n\n", m.Started.UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "`%s`\n\n", m.Cmdline)
	fmt.Fprintf(&b, "seed %d · %s · %d workers × (%d lease + %d advisory goroutines) · %d lease keys, %d advisory keys · TTL %s · margin %s · race %v",
		m.Seed, m.Elapsed.Round(time.Second), m.Workers, m.LeaseG, m.AdvG, m.Keys, m.AdvKeys, m.TTL, marginOf(m.Margin, m.TTL), m.Race)
	if m.Machine != "" {
		fmt.Fprintf(&b, " · %s", m.Machine)
	}
	b.WriteString("\n\n")
	if m.Cycles > 0 || m.Faults > 0 {
		verdict := "reached"
		if !rep.TargetsReached() {
			verdict = "**NOT reached**"
		}
		fmt.Fprintf(&b, "Targets: %d lease cycles, %d faults, within %s: %s.\n\n", m.Cycles, m.Faults, m.Duration, verdict)
	}
	if m.Pooled > 0 {
		fmt.Fprintf(&b, "%d workers' pools go through PgBouncer (transaction mode; their LISTEN and advisory sessions go to the server).\n\n", m.Pooled)
	}
	if len(m.NotRun) > 0 {
		var nr []string
		for ft, why := range m.NotRun {
			nr = append(nr, fmt.Sprintf("%s (%s)", ft, why))
		}
		sort.Strings(nr)
		fmt.Fprintf(&b, "Not run on this machine: %s.\n\n", strings.Join(nr, "; "))
	}
	if m.Broken != "" {
		fmt.Fprintf(&b, "**negative control: broken mode %q**\n\n", m.Broken)
	}
	fmt.Fprintf(&b, "| lease cycles (client grants) | server grants | advisory cycles | resource ops | counter writes | faults | violations |\n|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(&b, "| %d | %d | %d | %d | %d | %d | %d |\n\n", rep.LeaseGrants, rep.ServerGrants, rep.AdvGrants, rep.ResOps, rep.Writes, faults, rep.Violations())
	if m.PrimG > 0 {
		fmt.Fprintf(&b, "Other primitives (%d goroutines per worker; %d semaphore keys of %d, %d reader-writer keys with %.0f %% writers, sets of 2–3 of %d keys; holds < %s):\n\n",
			m.PrimG, m.SemKeys, m.SemLimit, m.RWKeys, 100*m.RWWriters, m.SetKeys, m.PrimHold)
		fmt.Fprintf(&b, "| permits (client / server) | most live permits of a key (server) | readers (client / server) | exclusive grants of semaphore and reader-writer keys | sets granted (locks) |\n|---|---|---|---|---|\n")
		fmt.Fprintf(&b, "| %d / %d | %d | %d / %d | %d | %d (%d) |\n\n", rep.Permits, rep.ServerPermits, rep.PermitsMax, rep.Readers, rep.ServerReaders,
			rep.PrimExclusive, rep.Sets, rep.SetLocks)
	}

	fmt.Fprintf(&b, "| fault | count | recovery p50 | recovery max | bound | over bound | censored |\n|---|---|---|---|---|---|---|\n")
	for _, rc := range rep.Recoveries {
		p50, mx := ms(rc.P50), ms(rc.Max)
		if rc.Measured == 0 { // every one censored: nothing measured, not 0
			p50, mx = "–", "–"
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %d | %d |\n", rc.Type, rc.Faults, p50, mx, ms(rc.Bound), rc.Over, rc.Censored)
	}
	b.WriteString("\nRecovery: from the heal (proxy back to pass, SIGCONT, new process, server up; at once for terminate) to the target's next lease; server faults count every worker, PgBouncer's the workers behind it. Censored: healed too close to the end to tell, or another fault hit the target (or the server) before it recovered.\n\n")

	fmt.Fprintf(&b, "| check | guarantee | checked | skipped | violations |\n|---|---|---|---|---|\n")
	for _, c := range rep.Checks {
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d |\n", c.Name, c.Guarantee, c.Checked, c.Skipped, c.Failed)
	}
	b.WriteString("\n")
	if n := len(rep.NoticeLeft); n > 0 {
		fmt.Fprintf(&b, "Loss notices: %d, lease left on the server at the notice: min %s, p50 %s.  ", n, ms(rep.NoticeLeft[0]), ms(rep.NoticeLeft[n/2]))
	}
	if rep.Revokes > 0 {
		fmt.Fprintf(&b, "Revocations: %d live leases revoked; holders told after", rep.Revokes)
		if n := len(rep.RevokeNotice); n > 0 {
			fmt.Fprintf(&b, " p50 %s, max %s (%d by a failed extend, ErrLockLost)", ms(rep.RevokeNotice[n/2]), ms(rep.RevokeNotice[n-1]), rep.RevokeLost)
		} else {
			b.WriteString(" –")
		}
		fmt.Fprintf(&b, "; %d released before they heard.  ", rep.RevokeReleased)
	}
	fmt.Fprintf(&b, "Longest lease-key gap %s, advisory-key gap %s; slowest Close %s; porcupine: %d ops in %d segments, %d illegal, %d timed out, %d ambiguous writes resolved applied / %d not (%s).\n\n",
		ms(rep.KeyGapMax), ms(rep.AdvGapMax), ms(rep.CloseMax), rep.Linear.Ops, rep.Linear.Segments, rep.Linear.Illegal, rep.Linear.Unknown,
		rep.Linear.Resolved, rep.Linear.Dropped, rep.Linear.Elapsed.Round(time.Millisecond))

	codes := make([]string, 0, len(rep.Errors))
	for c := range rep.Errors {
		codes = append(codes, c)
	}
	sort.Slice(codes, func(i, j int) bool {
		return rep.Errors[codes[i]] > rep.Errors[codes[j]] || rep.Errors[codes[i]] == rep.Errors[codes[j]] && codes[i] < codes[j]
	})
	b.WriteString("Error codes seen by the workers (acquire, release, resource, loss causes, Close): ")
	for i, c := range codes {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", c, rep.Errors[c])
	}
	b.WriteString("\n")

	var v strings.Builder
	for _, c := range rep.Checks {
		if c.Failed == 0 {
			continue
		}
		fmt.Fprintf(&v, "== %s (%d): %s\n", c.Name, c.Failed, c.Guarantee)
		for _, e := range c.Examples {
			fmt.Fprintf(&v, "  %s\n", e)
		}
	}
	if rep.Dir != "" {
		_ = os.WriteFile(filepath.Join(rep.Dir, "violations.txt"), []byte(v.String()), 0o644)
	}
	if v.Len() > 0 {
		b.WriteString("\n```\n" + v.String() + "```\n")
	}
	return b.String()
}

func marginOf(margin, ttl time.Duration) string {
	if margin > 0 {
		return margin.String()
	}
	return fmt.Sprintf("%s (default TTL/10)", min(max(ttl/10, 10*time.Millisecond), 5*time.Second))
}
