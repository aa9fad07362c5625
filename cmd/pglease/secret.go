package main

import (
	"errors"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// The connection string's password is never printed. The usage shows no
// default for --database-url (secretString); a parse error is reported
// without the string it quotes (parseReason); and every error message is
// scrubbed of the passwords the string holds (passwords, scrub), as a
// last guard for errors that quote a part of it (a misparsed host).

// checkAuthority refuses a URL whose authority (between "//" and the
// path) holds more than one '@': the parsers take the first as the end of
// the user info, so the rest of the password would become the host name,
// and a connect error would print it.
func checkAuthority(s string) error {
	rest, ok := strings.CutPrefix(s, "postgres://")
	if !ok {
		if rest, ok = strings.CutPrefix(s, "postgresql://"); !ok {
			return nil
		}
	}
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		rest = rest[:i]
	}
	if strings.Count(rest, "@") > 1 {
		return fail(exitUsage, "bad connection string: more than one '@' before the host: percent-encode an '@' in the user name or password as %%40")
	}
	return nil
}

// parseReason is why pgx could not parse a connection string, without
// the string (pgconn.ParseConfigError quotes it, with its passwords
// masked as well as pgx can tell them apart in a malformed string).
func parseReason(err error) string {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		c := *pe
		c.ConnString = ""
		return strings.TrimPrefix(c.Error(), "cannot parse ``: ")
	}
	return err.Error()
}

// kvPassword finds the values of password and sslpassword in a
// keyword/value connection string ("password = 'a b'" included).
var kvPassword = regexp.MustCompile(`(?:^|\s)(?:ssl)?password\s*=\s*('(?:[^'\\]|\\.)*'?|\S*)`)

// passwords returns every string that may be a password in the
// connection string s (as pgx reads it, and as a malformed one may be
// read), and those of PGPASSWORD and PGSSLPASSWORD, for scrub.
func passwords(s string) []string {
	var out []string
	add := func(p string) {
		if p != "" && !slices.Contains(out, p) {
			out = append(out, p)
		}
		if d, err := url.PathUnescape(p); err == nil && d != p && d != "" {
			out = append(out, d)
		}
	}
	add(os.Getenv("PGPASSWORD"))
	add(os.Getenv("PGSSLPASSWORD"))
	if s == "" {
		return out
	}
	if cfg, err := pgconn.ParseConfig(s); err == nil {
		add(cfg.Password)
	}
	if rest, ok := cutScheme(s); ok {
		urlPasswords(rest, add)
	} else {
		kvPasswords(s, add)
	}
	return out
}

// cutScheme is a URL connection string without its scheme.
func cutScheme(s string) (string, bool) {
	if rest, ok := strings.CutPrefix(s, "postgres://"); ok {
		return rest, true
	}
	return strings.CutPrefix(s, "postgresql://")
}

// urlPasswords adds what may be a password in a URL connection string
// (rest: after its scheme).
func urlPasswords(rest string, add func(string)) {
	// The user info's password: after its first ':', up to the first
	// or the last '@' (a malformed string may hold either).
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		ui := rest[:at]
		if _, pw, ok := strings.Cut(ui, ":"); ok {
			add(pw)
			if i := strings.Index(pw, "@"); i >= 0 {
				add(pw[:i])
			}
		}
	}
	if _, q, ok := strings.Cut(rest, "?"); ok {
		for _, kv := range strings.Split(q, "&") {
			k, v, _ := strings.Cut(kv, "=")
			if k, err := url.QueryUnescape(k); err == nil && (k == "password" || k == "sslpassword") {
				add(v)
				if d, err := url.QueryUnescape(v); err == nil {
					add(d)
				}
			}
		}
	}
}

// kvPasswords adds what may be a password in a keyword/value connection
// string.
func kvPasswords(s string, add func(string)) {
	for _, m := range kvPassword.FindAllStringSubmatch(s, -1) {
		v := m[1]
		add(v)
		if strings.HasPrefix(v, "'") {
			v = strings.TrimSuffix(strings.TrimPrefix(v, "'"), "'")
			add(v)
			add(strings.NewReplacer(`\'`, `'`, `\\`, `\`).Replace(v))
		}
	}
}

// scrub replaces every password of pws in msg with xxxxx (the longest
// first, so that one holding another is replaced whole).
func scrub(msg string, pws []string) string {
	pws = slices.Clone(pws)
	slices.SortFunc(pws, func(a, b string) int { return len(b) - len(a) })
	for _, p := range pws {
		if p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	return msg
}
