package advisory

import (
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// Hash derives a Key from a filled-in pattern. SHA256Key and FNV1a32 are
// Hashes; wrap NamespacedKey in a closure to use it as one.
type Hash func(input string) (Key, error)

// Entry describes one registered name, as List returns it.
type Entry struct {
	// Name is the registered name.
	Name string
	// Key is the fixed key; the zero Key for a pattern.
	Key Key
	// Template is the pattern, e.g. "{tenantId}:{date}"; "" for a fixed
	// key.
	Template string
	// Hash names a pattern's derivation as a registry file writes it
	// ("sha256", "fnv1a32", "namespaced:NS"); "" for a fixed key and for a
	// pattern registered in Go with a Hash of its own.
	Hash string
	// Doc is the free-text description given at registration.
	Doc string
}

// derivedCap bounds how many pattern-derived keys a Registry remembers
// (for Name and cross-pattern collision checks). The oldest is forgotten
// first.
const derivedCap = 4096

// Registry is the process's table of named advisory lock ids, to keep
// features from colliding (the registry document's rule, enforced in
// code). Register every fixed id and hash pattern at start-up; then use
// Name to label the keys Inspect reports.
//
// Rules, each InvalidArgument:
//   - a name is registered once (so one name cannot live in two key
//     spaces);
//   - two fixed names cannot map to one Key;
//   - a key derived by one pattern cannot equal a fixed key or a key
//     recently derived by a different pattern (the Registry remembers the
//     last few thousand derived keys, never their inputs);
//   - a pattern's keys all fall in one key space.
//
// Two different inputs of the same pattern that collide are not detected:
// that would need the inputs, which may be sensitive (e-mail addresses).
//
// A Registry is safe for concurrent use. The zero value is not usable;
// call NewRegistry.
type Registry struct {
	mu       sync.Mutex
	entries  map[string]*Entry   // by name
	patterns map[string]*Pattern // by name
	fixed    map[Key]string      // fixed key → name
	derived  map[Key]string      // pattern-derived key → pattern name (bounded)
	order    []Key               // derived keys, oldest first, for eviction
}

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry {
	return &Registry{entries: map[string]*Entry{}, patterns: map[string]*Pattern{}, fixed: map[Key]string{}, derived: map[Key]string{}}
}

func checkName(op, name string) error {
	if name == "" || len(name) > 128 || !utf8.ValidString(name) {
		return pgerr.New(pglease.CodeInvalidArgument, op, "name must be 1–128 bytes of UTF-8", nil)
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return pgerr.New(pglease.CodeInvalidArgument, op, "name contains a control character", nil)
		}
	}
	return nil
}

// waiterLockClass is the Manager's waiter lock class (internal/store's
// WaiterLockClass, "plww"): the (int4, int4) keys with this first key are
// pglease's waiter locks (a test keeps the two equal).
const waiterLockClass int32 = 0x706c7777

// Fixed registers name for the fixed key k (e.g. the registry document's
// 42424242). doc is a free-text description. Pair keys whose first key is
// 1886156663 ("plww") are refused: Managers hold those as waiter locks.
func (r *Registry) Fixed(name string, k Key, doc string) error {
	const op = "advisory.Registry.Fixed"
	if r == nil || r.entries == nil {
		return pgerr.New(pglease.CodeInvalidArgument, op, "nil or zero Registry (use NewRegistry)", nil)
	}
	if err := checkName(op, name); err != nil {
		return err
	}
	if !k.valid() {
		return pgerr.New(pglease.CodeInvalidArgument, op, "invalid key", nil)
	}
	if a, _, ok := k.Pair(); ok && a == waiterLockClass {
		return pgerr.New(pglease.CodeInvalidArgument, op, "key in the pair space pglease's Managers use for waiter locks (first key 1886156663)", nil)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.entries[name]; dup {
		return pgerr.New(pglease.CodeInvalidArgument, op, "name already registered", nil)
	}
	if other, dup := r.fixed[k]; dup {
		return pgerr.New(pglease.CodeInvalidArgument, op, "key already registered under the name "+strconvQuote(other), nil)
	}
	if other, dup := r.derived[k]; dup {
		return pgerr.New(pglease.CodeInvalidArgument, op, "key collides with a key derived by pattern "+strconvQuote(other), nil)
	}
	r.entries[name] = &Entry{Name: name, Key: k, Doc: doc}
	r.fixed[k] = name
	return nil
}

// Pattern registers name for keys derived by hash from template, whose
// placeholders are written {like_this} (e.g. "{tenantId}:{date}", the
// registry document's booking lock). Pattern.Key fills the placeholders in
// order and hashes the result.
func (r *Registry) Pattern(name, template string, hash Hash, doc string) (*Pattern, error) {
	return r.pattern(name, template, hash, "", doc)
}

func (r *Registry) pattern(name, template string, hash Hash, hashName, doc string) (*Pattern, error) {
	const op = "advisory.Registry.Pattern"
	if r == nil || r.entries == nil {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "nil or zero Registry (use NewRegistry)", nil)
	}
	if err := checkName(op, name); err != nil {
		return nil, err
	}
	if hash == nil {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "nil hash", nil)
	}
	lits, err := parseTemplate(op, template)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.entries[name]; dup {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "name already registered", nil)
	}
	p := &Pattern{r: r, name: name, lits: lits, hash: hash}
	r.entries[name] = &Entry{Name: name, Template: template, Hash: hashName, Doc: doc}
	r.patterns[name] = p
	return p, nil
}

// Lookup returns the entry registered under name.
func (r *Registry) Lookup(name string) (Entry, bool) {
	if r == nil || r.entries == nil {
		return Entry{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[name]
	if !ok {
		return Entry{}, false
	}
	return *e, true
}

// Derive is Pattern.Key of the pattern registered under name: the key
// for parts, checked against the registry and remembered, so that
// Inspect with this Registry names it. An operator who knows the input
// (a tenant and a date, an e-mail address) finds that lock by name
// without the input appearing anywhere: the Registry keeps only the key.
// An unknown name or a fixed entry is InvalidArgument.
func (r *Registry) Derive(name string, parts ...string) (Key, error) {
	const op = "advisory.Registry.Derive"
	if r == nil || r.entries == nil {
		return Key{}, pgerr.New(pglease.CodeInvalidArgument, op, "nil or zero Registry (use NewRegistry)", nil)
	}
	r.mu.Lock()
	p, ok := r.patterns[name]
	r.mu.Unlock()
	if !ok {
		return Key{}, pgerr.New(pglease.CodeInvalidArgument, op, "no pattern registered under that name", nil)
	}
	return p.Key(parts...)
}

// parseTemplate splits template into the literal text around its
// placeholders: len(lits) = placeholders + 1.
func parseTemplate(op, t string) ([]string, error) {
	if t == "" || len(t) > 1024 || !utf8.ValidString(t) {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "template must be 1–1024 bytes of UTF-8", nil)
	}
	var lits []string
	for {
		i := strings.IndexAny(t, "{}")
		if i < 0 {
			lits = append(lits, t)
			break
		}
		if t[i] == '}' {
			return nil, pgerr.New(pglease.CodeInvalidArgument, op, "unbalanced '}' in template", nil)
		}
		j := strings.IndexAny(t[i+1:], "{}")
		if j < 0 || t[i+1+j] != '}' || j == 0 {
			return nil, pgerr.New(pglease.CodeInvalidArgument, op, "placeholders must be {name}", nil)
		}
		lits = append(lits, t[:i])
		t = t[i+1+j+1:]
	}
	if len(lits) < 2 {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "template has no {placeholder} (use Fixed)", nil)
	}
	return lits, nil
}

// Name returns the registered name of k: the fixed name, or the pattern
// that derived it (if the Registry still remembers). ok is false for a
// key it does not know.
func (r *Registry) Name(k Key) (name string, ok bool) {
	if r == nil || r.entries == nil {
		return "", false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n, ok := r.fixed[k]; ok {
		return n, true
	}
	n, ok := r.derived[k]
	return n, ok
}

// List returns every registered name, sorted by name: the registry
// table, for docs and inspection.
func (r *Registry) List() []Entry {
	if r == nil || r.entries == nil {
		return nil
	}
	r.mu.Lock()
	out := make([]Entry, 0, len(r.entries))
	for _, e := range r.entries {
		out = append(out, *e)
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Pattern is a registered hash pattern; see Registry.Pattern.
type Pattern struct {
	r    *Registry // immutable
	name string    // immutable
	lits []string  // immutable: literal text around the placeholders
	hash Hash      // immutable
	// space is the key space of the first derived key; guarded by r.mu.
	space space
}

// Name returns the pattern's registered name.
func (p *Pattern) Name() string { return p.name }

// Key fills the pattern's placeholders with parts, in order, hashes the
// result and checks it against the registry (see Registry). The wrong
// number of parts, a part with invalid UTF-8 or NUL, and any registry
// rule broken are InvalidArgument; errors never contain the parts.
func (p *Pattern) Key(parts ...string) (Key, error) {
	const op = "advisory.Pattern.Key"
	if p == nil || p.r == nil {
		return Key{}, pgerr.New(pglease.CodeInvalidArgument, op, "nil Pattern", nil)
	}
	if len(parts) != len(p.lits)-1 {
		return Key{}, pgerr.New(pglease.CodeInvalidArgument, op, "wrong number of parts for the template", nil)
	}
	var b strings.Builder
	for i, part := range parts {
		if err := checkInput(op, "part", part); err != nil {
			return Key{}, err
		}
		b.WriteString(p.lits[i])
		b.WriteString(part)
	}
	b.WriteString(p.lits[len(p.lits)-1])
	k, err := p.hash(b.String())
	if err != nil {
		return Key{}, err
	}
	if !k.valid() {
		return Key{}, pgerr.New(pglease.CodeInvalidArgument, op, "hash returned an invalid key", nil)
	}
	r := p.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if p.space == 0 {
		p.space = k.space
	} else if p.space != k.space {
		return Key{}, pgerr.New(pglease.CodeInvalidArgument, op, "pattern "+strconvQuote(p.name)+" derived keys in two key spaces", nil)
	}
	if other, dup := r.fixed[k]; dup {
		return Key{}, pgerr.New(pglease.CodeInvalidArgument, op,
			"pattern "+strconvQuote(p.name)+" derived the key registered as "+strconvQuote(other), nil)
	}
	if other, seen := r.derived[k]; seen {
		if other != p.name {
			return Key{}, pgerr.New(pglease.CodeInvalidArgument, op,
				"patterns "+strconvQuote(p.name)+" and "+strconvQuote(other)+" derived the same key", nil)
		}
		return k, nil
	}
	if len(r.order) >= derivedCap {
		delete(r.derived, r.order[0])
		r.order = r.order[1:]
	}
	r.derived[k] = p.name
	r.order = append(r.order, k)
	return k, nil
}

// strconvQuote quotes a registered name for an error message (names are
// chosen by the programmer, not derived from user data).
func strconvQuote(s string) string { return "\"" + s + "\"" }
