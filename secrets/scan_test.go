package secrets

import (
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/test/gittree"
)

func TestScanFindsTokensByFileLineAndColumn(t *testing.T) {
	tok, _ := NewToken()
	fake := TokenPrefix + strings.Repeat("a", 59) // right shape, wrong checksum
	fsys := fstest.MapFS{
		"README.md":                           {Data: []byte("tokens look like " + fake + "\n")},
		"clusters/a/notes.txt":                {Data: []byte("first line\n  token: " + tok.Reveal() + "\n")},
		"clusters/a/enrollment.sops.yaml":     {Data: []byte("token: ENC[AES256_GCM,data:x,iv:y,tag:z,type:str]\n")},
		"values.a.local.yaml":                 {Data: []byte("token: " + tok.Reveal() + "\n")},
		".git/objects/pack/leaked-in-history": {Data: []byte(tok.Reveal())},
	}
	skip := func(p string, isDir bool) bool {
		return p == ".git" || strings.HasSuffix(p, ".local.yaml")
	}
	leaks, err := ScanFS(fsys, skip)
	if err != nil {
		t.Fatal(err)
	}
	if len(leaks) != 1 {
		t.Fatalf("found %d leaks, want 1: %v", len(leaks), leaks)
	}
	l := leaks[0]
	if l.File != "clusters/a/notes.txt" || l.Line != 2 || l.Column != 10 {
		t.Fatalf("leak at %s:%d:%d, want clusters/a/notes.txt:2:10", l.File, l.Line, l.Column)
	}
	msg := l.Error()
	if strings.Contains(msg, tok.Reveal()) {
		t.Fatal("the leak report repeats the token")
	}
	if !strings.HasPrefix(msg, "clusters/a/notes.txt:2:10: ") || !strings.Contains(msg, tok.Hash().Fingerprint()) {
		t.Fatalf("leak report %q does not name file:line:column and the fingerprint", msg)
	}

	all, err := ScanFS(fsys, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 {
		t.Fatalf("without skipping, found %d leaks, want 3", len(all))
	}
}

func TestRedactHidesEveryTokenShape(t *testing.T) {
	tok, _ := NewToken()
	fake := TokenPrefix + strings.Repeat("b", 59)
	out := Redact("a " + tok.Reveal() + " b " + fake + " c")
	if strings.Contains(out, TokenPrefix) || out != "a [REDACTED] b [REDACTED] c" {
		t.Fatalf("Redact = %q", out)
	}
}

// countingTree counts the files opened in a commit's tree.
type countingTree struct {
	gitsource.TreeFS
	opened int
}

func (c *countingTree) Open(name string) (fs.File, error) {
	c.opened++
	return c.TreeFS.Open(name)
}

// In a commit, content named from many paths is read and scanned once, and a leak in it
// is reported at every path: many paths to one large blob cost a scan what the blob
// does, not what the paths would.
func TestScanReadsEachContentOfACommitOnce(t *testing.T) {
	tok, _ := NewToken()
	leaked := gittree.Regular("first line\n  token: " + tok.Reveal() + "\n")
	files := gittree.Files{"docs/other.md": gittree.Regular("nothing here\n")}
	for i := range 3 {
		files[fmt.Sprintf("docs/copy-%d.md", i)] = leaked
	}
	fsys := &countingTree{TreeFS: gitsource.NewTreeFS(gittree.New(t, files))}
	leaks, err := ScanFS(fsys, nil)
	if err != nil {
		t.Fatal(err)
	}
	var at []string
	for _, l := range leaks {
		if l.Line != 2 || l.Column != 10 || l.Fingerprint != tok.Hash().Fingerprint() {
			t.Errorf("leak %+v, want line 2, column 10 and the token's fingerprint", l)
		}
		at = append(at, l.File)
	}
	if want := []string{"docs/copy-0.md", "docs/copy-1.md", "docs/copy-2.md"}; !slices.Equal(at, want) {
		t.Fatalf("leaks at %v, want %v", at, want)
	}
	if fsys.opened != 2 {
		t.Fatalf("the scan opened %d files, want one for each of the 2 contents", fsys.opened)
	}
}

// cachedMap is a file system with some of its files' content at hand.
type cachedMap struct {
	fstest.MapFS
	cached map[string][]byte
}

func (c cachedMap) Cached(name string) ([]byte, bool) {
	data, ok := c.cached[name]
	return data, ok
}

// On a CachedFS, a file whose content is at hand is scanned as it is held, without
// reading it: a checkout whose fleet was loaded is not read twice. The other files are
// read.
func TestScanScansTheContentACachedFSHolds(t *testing.T) {
	held, onDisk, other := mustToken(t), mustToken(t), mustToken(t)
	fsys := cachedMap{
		MapFS: fstest.MapFS{
			"clusters/a/cluster.yaml": {Data: []byte("# " + onDisk.Reveal() + "\n")},
			"docs/notes.md":           {Data: []byte("\n" + other.Reveal() + "\n")},
		},
		cached: map[string][]byte{"clusters/a/cluster.yaml": []byte("\n\n# " + held.Reveal() + "\n")},
	}
	leaks, err := ScanFS(fsys, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range leaks {
		got = append(got, fmt.Sprintf("%s:%d %s", l.File, l.Line, l.Fingerprint))
	}
	want := []string{"clusters/a/cluster.yaml:3 " + held.Hash().Fingerprint(), "docs/notes.md:2 " + other.Hash().Fingerprint()}
	if !slices.Equal(got, want) {
		t.Fatalf("leaks %q, want %q", got, want)
	}
}

func mustToken(t *testing.T) Token {
	t.Helper()
	tok, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
