package pglease_test

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// The repository's Markdown files link to each other (README.md to docs/,
// docs/ to examples/, …). TestMarkdownLinks keeps those links working when
// a file moves: every relative link of every .md file in the repository,
// nested modules included, must point at an existing file or directory, and
// a #fragment on a link to a Markdown file must name one of its headings
// (GitHub's anchors). Links with a scheme (https:, mailto:) and code are not
// checked.

var (
	// [text](target) and ![alt](target), target without spaces, an optional "title".
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// [label]: target
	refLink    = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$`)
	inlineCode = regexp.MustCompile("`+[^`]*`+")
	headingRe  = regexp.MustCompile(`^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$`)
	schemeRe   = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
)

func TestMarkdownLinks(t *testing.T) {
	var files []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".md") {
			files = append(files, filepath.ToSlash(p))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 2 {
		t.Fatalf("found %d Markdown files: %v", len(files), files)
	}
	n := 0
	for _, md := range files {
		data, err := os.ReadFile(md)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range markdownLinks(string(data)) {
			n++
			if err := checkMarkdownLink(md, l.target); err != nil {
				t.Errorf("%s:%d: link %q: %v", md, l.line, l.target, err)
			}
		}
	}
	if n == 0 {
		t.Fatal("no relative link found: is the parser broken?")
	}
}

// TestMarkdownLinksCheck proves the check can fail: a missing file, a
// missing heading, and links it must skip.
func TestMarkdownLinksCheck(t *testing.T) {
	md := strings.Join([]string{
		"# Title: with `code`, and punctuation!",
		"See [a](README.md), [b](docs/nope.md), [c](README.md#no-such-heading),",
		"[d](#title-with-code-and-punctuation), [e](https://example.com/x.md), `[f](inline.md)`",
		"```text",
		"[g](in-a-fence.md)",
		"```",
		"[ref]: docs/guarantees.md#safety",
	}, "\n")
	var got []string
	for _, l := range markdownLinks(md) {
		got = append(got, l.target)
	}
	want := []string{"README.md", "docs/nope.md", "README.md#no-such-heading", "#title-with-code-and-punctuation", "docs/guarantees.md#safety"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("links %q, want %q", got, want)
	}
	if err := checkMarkdownLink("x.md", "README.md"); err != nil {
		t.Errorf("an existing file: %v", err)
	}
	if err := checkMarkdownLink("x.md", "docs/nope.md"); err == nil {
		t.Error("a missing file passes")
	}
	if err := checkMarkdownLink("x.md", "README.md#no-such-heading"); err == nil {
		t.Error("a missing heading passes")
	}
	if err := checkMarkdownLink("x.md", "docs/guarantees.md#safety"); err != nil {
		t.Errorf("an existing heading: %v", err)
	}
	if err := checkMarkdownLink("docs/x.md", "../README.md#quick-start"); err != nil {
		t.Errorf("a link relative to its file's directory: %v", err)
	}
	if got := githubAnchor("Fenced writes: `pg.FenceGuard`"); got != "fenced-writes-pgfenceguard" {
		t.Errorf("anchor %q", got)
	}
}

type mdLink struct {
	line   int
	target string
}

// markdownLinks returns the relative link targets of a Markdown text,
// outside fenced code blocks and inline code.
func markdownLinks(text string) []mdLink {
	var links []mdLink
	fence := ""
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if m := anyFence.FindStringSubmatch(line); m != nil {
			fence = m[2]
			continue
		}
		line = inlineCode.ReplaceAllString(line, "")
		var targets []string
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			targets = append(targets, m[1])
		}
		if m := refLink.FindStringSubmatch(line); m != nil {
			targets = append(targets, m[1])
		}
		for _, tg := range targets {
			if schemeRe.MatchString(tg) {
				continue
			}
			links = append(links, mdLink{line: i + 1, target: tg})
		}
	}
	return links
}

// checkMarkdownLink checks one relative link of the Markdown file md (a
// slash path relative to the repository's root).
func checkMarkdownLink(md, target string) error {
	file, frag, _ := strings.Cut(target, "#")
	dest := md
	if file != "" {
		dest = path.Join(path.Dir(md), file)
		if strings.HasPrefix(dest, "../") || dest == ".." {
			return fmt.Errorf("points outside the repository")
		}
		if _, err := os.Stat(filepath.FromSlash(dest)); err != nil {
			return fmt.Errorf("no such file: %s", dest)
		}
	}
	if frag == "" || !strings.HasSuffix(dest, ".md") {
		return nil
	}
	data, err := os.ReadFile(filepath.FromSlash(dest))
	if err != nil {
		if file == "" {
			return nil // a link inside a text that is not a file (the self-test)
		}
		return err
	}
	for _, a := range markdownAnchors(string(data)) {
		if a == frag {
			return nil
		}
	}
	return fmt.Errorf("%s has no heading with anchor #%s", dest, frag)
}

// markdownAnchors returns the anchors GitHub gives the headings of a
// Markdown text (outside fenced code), with -1, -2 … for repeats.
func markdownAnchors(text string) []string {
	var anchors []string
	seen := map[string]int{}
	fence := ""
	for _, line := range strings.Split(text, "\n") {
		if fence != "" {
			if strings.HasPrefix(strings.TrimSpace(line), fence) {
				fence = ""
			}
			continue
		}
		if m := anyFence.FindStringSubmatch(line); m != nil {
			fence = m[2]
			continue
		}
		m := headingRe.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		a := githubAnchor(m[1])
		if k := seen[a]; k > 0 {
			anchors = append(anchors, fmt.Sprintf("%s-%d", a, k))
		} else {
			anchors = append(anchors, a)
		}
		seen[a]++
	}
	return anchors
}

// githubAnchor is GitHub's anchor for a heading: the text of the heading
// (links reduced to their text), lower-cased, with every character but
// letters, digits, spaces, hyphens and underscores removed and spaces
// turned into hyphens.
func githubAnchor(heading string) string {
	heading = inlineLink.ReplaceAllStringFunc(heading, func(s string) string {
		return s[strings.Index(s, "[")+1 : strings.Index(s, "]")]
	})
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
