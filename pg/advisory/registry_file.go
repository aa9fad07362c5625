package advisory

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgerr"
)

// maxRegistryFile bounds what LoadRegistry reads.
const maxRegistryFile = 1 << 20

// registryFile is the JSON form LoadRegistry reads.
type registryFile struct {
	Locks []registryFileEntry `json:"locks"`
}

type registryFileEntry struct {
	Name    string          `json:"name"`
	Key     json.RawMessage `json:"key,omitempty"` // a number (int64 space) or a ParseKey string
	Pattern string          `json:"pattern,omitempty"`
	Hash    string          `json:"hash,omitempty"`
	Doc     string          `json:"doc,omitempty"`
}

// LoadRegistry reads a registry file: the team's table of advisory lock
// ids (the registry document's two tables) in a form that the
// application loads at start-up, so that a colliding id stops it there,
// and that an operator's tool loads to name the locks Inspect reports.
// The format is JSON:
//
//	{"locks": [
//	  {"name": "idempotency-cleanup", "key": 42424242, "doc": "cleanup scheduler (session)"},
//	  {"name": "booking", "pattern": "{tenantId}:{date}", "hash": "fnv1a32", "doc": "booking creation (transaction)"},
//	  {"name": "cleanup", "pattern": "{email}", "hash": "sha256", "doc": "orphan cleanup per e-mail (session)"}
//	]}
//
// An entry has either a fixed "key" — a JSON number (the bigint key of
// pg_advisory_lock(bigint)) or a string as Key.String and ParseKey write
// it ("int64:42424242", "pair:1,2") — or a "pattern" with its "hash":
// "sha256" (SHA256Key, the SQL email_to_lock_id), "fnv1a32" (FNV1a32, the
// TypeScript hashString) or "namespaced:NS" (NamespacedKey(NS, input),
// the SQL generate_lock_id). Entries are registered in order with the
// Registry's rules (Fixed, Pattern): a name twice, two names for one key,
// a malformed entry or an unknown field is InvalidArgument, naming the
// entry. Use Registry.Derive for a pattern's keys.
func LoadRegistry(r io.Reader) (*Registry, error) {
	const op = "advisory.LoadRegistry"
	if r == nil {
		return nil, invalid(op, "nil reader")
	}
	data, err := io.ReadAll(io.LimitReader(r, maxRegistryFile+1))
	if err != nil {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "cannot read the registry file", err)
	}
	if len(data) > maxRegistryFile {
		return nil, invalid(op, "registry file larger than 1 MiB")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f registryFile
	if err := dec.Decode(&f); err != nil {
		return nil, pgerr.New(pglease.CodeInvalidArgument, op, "registry file is not valid JSON of the documented form", err)
	}
	if dec.More() {
		return nil, invalid(op, "registry file has data after its JSON object")
	}
	reg := NewRegistry()
	for i, e := range f.Locks {
		where := "entry " + strconv.Itoa(i+1)
		if e.Name != "" && checkName(op, e.Name) == nil {
			where += " (" + strconvQuote(e.Name) + ")"
		}
		if err := reg.load(e); err != nil {
			var pe *pglease.Error
			if errors.As(err, &pe) {
				return nil, pgerr.New(pe.Code, op, where+": "+pe.Msg, pe.Err)
			}
			return nil, err
		}
	}
	return reg, nil
}

// load registers one registry file entry.
func (r *Registry) load(e registryFileEntry) error {
	const op = "advisory.LoadRegistry"
	switch {
	case e.Key != nil && (e.Pattern != "" || e.Hash != ""):
		return invalid(op, "an entry has a key or a pattern with its hash, not both")
	case e.Key != nil:
		k, err := parseFileKey(e.Key)
		if err != nil {
			return err
		}
		return r.Fixed(e.Name, k, e.Doc)
	case e.Pattern == "" || e.Hash == "":
		return invalid(op, "an entry needs a key, or a pattern and a hash")
	}
	hash, err := namedHash(e.Hash)
	if err != nil {
		return err
	}
	_, err = r.pattern(e.Name, e.Pattern, hash, e.Hash, e.Doc)
	return err
}

// parseFileKey reads a registry file's key: a JSON integer (int64
// space) or a JSON string in ParseKey's form.
func parseFileKey(raw json.RawMessage) (Key, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return ParseKey(s)
	}
	id, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return Key{}, invalid("advisory.LoadRegistry", "key must be a 64-bit integer or a string int64:ID or pair:A,B")
	}
	return Int64(id), nil
}

// namedHash returns the derivation a registry file names.
func namedHash(name string) (Hash, error) {
	const op = "advisory.LoadRegistry"
	switch {
	case name == "sha256":
		return SHA256Key, nil
	case name == "fnv1a32":
		return FNV1a32, nil
	case strings.HasPrefix(name, "namespaced:"):
		ns := strings.TrimPrefix(name, "namespaced:")
		if _, err := NamespacedKey(ns, "probe"); err != nil {
			return nil, invalid(op, "bad namespace in hash \"namespaced:…\" (non-empty, no ':')")
		}
		return func(input string) (Key, error) { return NamespacedKey(ns, input) }, nil
	}
	return nil, invalid(op, "unknown hash (want sha256, fnv1a32 or namespaced:NS)")
}

// ParseKey parses a Key in the form Key.String writes: "int64:42" or
// "pair:1,-2". Anything else is InvalidArgument (the message does not
// echo the input).
func ParseKey(s string) (Key, error) {
	const op = "advisory.ParseKey"
	if rest, ok := strings.CutPrefix(s, "int64:"); ok {
		id, err := strconv.ParseInt(rest, 10, 64)
		if err != nil {
			return Key{}, invalid(op, "int64 key id is not a 64-bit integer")
		}
		return Int64(id), nil
	}
	if rest, ok := strings.CutPrefix(s, "pair:"); ok {
		as, bs, ok := strings.Cut(rest, ",")
		a, errA := strconv.ParseInt(as, 10, 32)
		b, errB := strconv.ParseInt(bs, 10, 32)
		if !ok || errA != nil || errB != nil {
			return Key{}, invalid(op, "pair key ids are not two 32-bit integers")
		}
		return Pair(int32(a), int32(b)), nil
	}
	return Key{}, invalid(op, "key must be written int64:ID or pair:A,B")
}
