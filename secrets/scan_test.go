package secrets

import (
	"strings"
	"testing"
	"testing/fstest"
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
