package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/pglease/pglease/internal/store"
	"github.com/pglease/pglease/manager"
	"github.com/pglease/pglease/pg"
	"github.com/pglease/pglease/pg/advisory"
	"github.com/pglease/pglease/pg/migrate"
)

// multiFlag collects a repeatable flag.
type multiFlag []string

func (m *multiFlag) String() string { return strings.Join(*m, ",") }

func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// viewOpts are the flags of status and inspect.
type viewOpts struct {
	json, showKeys bool
	registry       string
	names, derive  multiFlag
	deriveStdin    string // a pattern name: one input per line of stdin
	deriveSep      string // splits an input into the pattern's parts
	limit          int
	notifyChannel  string // the release trigger's channel
}

func (a *app) viewFlags(fs *flag.FlagSet, o *viewOpts) {
	fs.BoolVar(&o.json, "json", false, "print JSON (for scripts)")
	fs.BoolVar(&o.showKeys, "show-keys", false, "show keys as stored (user_key) instead of their hashes")
	fs.StringVar(&o.registry, "registry", "", "advisory lock registry file (JSON, see advisory.LoadRegistry) to name advisory locks")
	fs.Var(&o.names, "name", "name an advisory key: NAME=int64:N or NAME=pair:A,B (repeatable)")
	fs.Var(&o.derive, "derive", "name the key a registry pattern derives from an input: NAME=INPUT (repeatable; the input is not shown).\n"+
		"For a pattern of several placeholders, INPUT is the parts joined by the template's text between them\n"+
		"(booking=t1:2025-01-15 for {tenantId}:{date}), or joined by --derive-sep")
	fs.StringVar(&o.deriveStdin, "derive-stdin", "", "like --derive NAME=INPUT for each line of stdin (one input per line), so that inputs\n"+
		"such as e-mail addresses stay out of the command line (ps, shell history)")
	fs.StringVar(&o.deriveSep, "derive-sep", "", "split each --derive/--derive-stdin INPUT into the pattern's parts on this separator")
	fs.IntVar(&o.limit, "limit", 100, fmt.Sprintf("show at most this many leases (live first), shared holds and queued tickets, 1..%d", store.MaxBatch))
	fs.StringVar(&o.notifyChannel, "notify-channel", manager.DefaultNotifyChannel, "the channel the Managers listen on (manager.Config.NotifyChannel), for the release trigger's check")
}

// check checks the flags of status and inspect, without any I/O.
func (o *viewOpts) check(c *common) error {
	if o.limit < 1 || o.limit > store.MaxBatch {
		return fail(exitUsage, "--limit must be 1..%d", store.MaxBatch)
	}
	if _, err := migrate.SQL(pg.Config{LockTable: c.lockTable, FenceTable: c.fenceTable, NotifyChannel: o.notifyChannel}); err != nil {
		return fail(exitUsage, "--notify-channel: %v", err)
	}
	return nil
}

// loadRegistry builds the registry status and inspect name advisory locks
// with; --derive-stdin reads its inputs from stdin (a hint goes to stderr
// when stdin is a terminal).
func (a *app) loadRegistry(o *viewOpts) (*advisory.Registry, error) {
	reg := advisory.NewRegistry()
	if o.registry != "" {
		f, err := os.Open(o.registry)
		if err != nil {
			return nil, fail(exitUsage, "--registry: %v", err)
		}
		defer f.Close()
		if reg, err = advisory.LoadRegistry(f); err != nil {
			return nil, fail(exitUsage, "--registry: %v", err)
		}
	}
	for _, n := range o.names {
		name, key, ok := strings.Cut(n, "=")
		if !ok {
			return nil, fail(exitUsage, "--name wants NAME=KEY, e.g. scheduler=int64:42424242")
		}
		k, err := advisory.ParseKey(key)
		if err != nil {
			return nil, fail(exitUsage, "--name %s: %v", name, err)
		}
		if err := reg.Fixed(name, k, ""); err != nil {
			return nil, fail(exitUsage, "--name %s: %v", name, err)
		}
	}
	for _, d := range o.derive {
		name, input, ok := strings.Cut(d, "=")
		if !ok {
			return nil, fail(exitUsage, "--derive wants NAME=INPUT for a pattern of the registry")
		}
		if err := derive(reg, name, input, o.deriveSep); err != nil {
			return nil, fail(exitUsage, "--derive %s: %v", name, err)
		}
	}
	if o.deriveStdin != "" {
		if err := a.deriveStdin(reg, o.deriveStdin, o.deriveSep); err != nil {
			return nil, err
		}
	}
	return reg, nil
}

// deriveStdin derives, for the pattern name, the key of each line of
// stdin (a hint goes to stderr when stdin is a terminal).
func (a *app) deriveStdin(reg *advisory.Registry, name, sep string) error {
	if a.stdinTerminal {
		fmt.Fprintf(a.stderr, "reading inputs for %s from stdin, one per line; end with Ctrl-D\n", name)
	}
	sc := bufio.NewScanner(a.stdin)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	n := 0
	for line := 1; sc.Scan(); line++ {
		input := strings.TrimSuffix(sc.Text(), "\r")
		if input == "" {
			continue
		}
		if err := derive(reg, name, input, sep); err != nil {
			return fail(exitUsage, "--derive-stdin %s: line %d: %v", name, line, err)
		}
		n++
	}
	if err := sc.Err(); err != nil {
		return fail(exitUsage, "--derive-stdin %s: reading stdin: %v", name, err)
	}
	if n == 0 {
		return fail(exitUsage, "--derive-stdin %s: no input on stdin (one per line)", name)
	}
	return nil
}

// derive names in reg the key the pattern name derives from input: the
// pattern's parts split on sep, or, without sep, split on the template's
// text between its placeholders (any split of input on it gives the same
// key: the pattern hashes the filled-in template). Errors never contain
// the input.
func derive(reg *advisory.Registry, name, input, sep string) error {
	e, ok := reg.Lookup(name)
	if !ok {
		return errors.New("no such name in the registry (--registry FILE)")
	}
	if e.Template == "" {
		return errors.New("is a fixed key, not a pattern")
	}
	between := templateSeparators(e.Template)
	var parts []string
	switch {
	case sep != "":
		parts = strings.Split(input, sep)
		if len(parts) != len(between)+1 {
			return fmt.Errorf("%d parts split on --derive-sep for the %d placeholders of %s", len(parts), len(between)+1, e.Template)
		}
	default:
		rest := input
		for _, lit := range between {
			i := strings.Index(rest, lit)
			if i < 0 {
				return fmt.Errorf("the input does not read as %s: want the parts joined by the template's text between them, or use --derive-sep", e.Template)
			}
			parts = append(parts, rest[:i])
			rest = rest[i+len(lit):]
		}
		parts = append(parts, rest)
	}
	if _, err := reg.Derive(name, parts...); err != nil {
		return err
	}
	return nil
}

// templateSeparators returns the text between a template's placeholders:
// for "{tenantId}:{date}", [":"]; none for one placeholder. The text
// before the first and after the last placeholder is not part of an input.
func templateSeparators(t string) []string {
	var lits []string
	for {
		i := strings.IndexByte(t, '{')
		j := strings.IndexByte(t[max(i, 0):], '}')
		if i < 0 || j < 0 {
			lits = append(lits, t)
			break
		}
		lits = append(lits, t[:i])
		t = t[i+j+1:]
	}
	if len(lits) <= 2 {
		return nil
	}
	return lits[1 : len(lits)-1]
}

// statusCmd is pglease status: the snapshot, once or every --watch.
type statusCmd struct {
	a     *app
	o     viewOpts
	watch time.Duration
	count int
}

func statusFlags(a *app, fs *flag.FlagSet) runFunc {
	c := &statusCmd{a: a}
	a.viewFlags(fs, &c.o)
	fs.DurationVar(&c.watch, "watch", 0, "refresh every D (e.g. 2s) until interrupted")
	fs.IntVar(&c.count, "count", 0, "with --watch: stop after N refreshes (0: until interrupted)")
	return c.run
}

// check checks status's flags and arguments, without any I/O.
func (c *statusCmd) check(args []string) error {
	switch {
	case len(args) != 0:
		return fail(exitUsage, "status takes no arguments (got %q)", args[0])
	case c.watch < 0 || (c.watch > 0 && c.watch < 100*time.Millisecond):
		return fail(exitUsage, "--watch must be at least 100ms")
	case c.count < 0 || (c.count > 0 && c.watch == 0):
		return fail(exitUsage, "--count must be positive, and only with --watch")
	}
	return c.o.check(&c.a.c)
}

func (c *statusCmd) run(ctx context.Context, args []string) error {
	a := c.a
	if err := c.check(args); err != nil {
		return err
	}
	reg, err := a.loadRegistry(&c.o)
	if err != nil {
		return err
	}
	pool, st, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	var prev map[string]string // key hash → fence, for grants since the last refresh
	for n := 1; ; n++ {
		cctx, cancel := a.withTimeout(ctx)
		v, err := collect(cctx, pool, st, reg, &c.o, store.ListOptions{Limit: c.o.limit}, &a.c)
		cancel()
		if err != nil {
			if ctx.Err() != nil && n > 1 {
				return nil // interrupted while watching
			}
			return err
		}
		if err := c.show(v, prev); err != nil {
			return err
		}
		prev = fences(v)
		if c.watch == 0 {
			if !v.Schema.Current {
				return fail(exitSchema, "%s", schemaAdvice(&v.Schema))
			}
			return nil
		}
		if c.count > 0 && n >= c.count {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(c.watch):
		}
		if !c.o.json {
			fmt.Fprintln(a.stdout)
		}
	}
}

// show prints one snapshot, as JSON or as text (on a clear screen when
// watching on a terminal).
func (c *statusCmd) show(v *snapshotView, prev map[string]string) error {
	if c.o.json {
		return json.NewEncoder(c.a.stdout).Encode(v)
	}
	if c.watch > 0 && c.a.isTerminal {
		fmt.Fprint(c.a.stdout, "\033[H\033[2J")
	}
	printStatus(c.a.stdout, v, prev)
	return nil
}

// fences is each lease's fence by key hash.
func fences(v *snapshotView) map[string]string {
	m := map[string]string{}
	for _, l := range v.Leases.Rows {
		m[l.KeyHash] = l.Fence
	}
	return m
}
