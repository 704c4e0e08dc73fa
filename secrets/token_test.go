package secrets

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestNewTokenIsParseableAndUnique(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		tok, err := NewToken()
		if err != nil {
			t.Fatal(err)
		}
		s := tok.Reveal()
		if len(s) != 64 || !strings.HasPrefix(s, TokenPrefix) {
			t.Fatalf("token has length %d, want 64 with prefix %s", len(s), TokenPrefix)
		}
		if _, err := ParseToken(s); err != nil {
			t.Fatalf("a fresh token does not parse: %v", err)
		}
		if seen[s] {
			t.Fatal("two tokens are equal")
		}
		seen[s] = true
	}
}

func TestParseTokenRejectsMistakesBeforeAnyLookup(t *testing.T) {
	tok, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	s := tok.Reveal()
	swap := func(i int) string {
		b := []byte(s)
		if b[i] == 'a' {
			b[i] = 'b'
		} else {
			b[i] = 'a'
		}
		return string(b)
	}
	for _, tc := range []struct {
		name, in string
		want     error
	}{
		{"one character of the random part mistyped", swap(10), ErrTokenChecksum},
		{"one character of the checksum mistyped", swap(60), ErrTokenChecksum},
		{"truncated", s[:63], ErrTokenFormat},
		{"extended", s + "a", ErrTokenFormat},
		{"other prefix", "flt2_" + s[5:], ErrTokenFormat},
		{"upper case", strings.ToUpper(s), ErrTokenFormat},
		{"characters outside base32", s[:20] + "0" + s[21:], ErrTokenFormat},
		{"empty", "", ErrTokenFormat},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseToken(tc.in)
			if !errors.Is(err, tc.want) {
				t.Fatalf("ParseToken = %v, want %v", err, tc.want)
			}
			if tc.in != "" && strings.Contains(err.Error(), tc.in) {
				t.Fatal("the error repeats its input")
			}
		})
	}
}

func TestTokenNeverPrintsItself(t *testing.T) {
	tok, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q"} {
		out := fmt.Sprintf(verb, tok)
		if strings.Contains(out, tok.Reveal()[len(TokenPrefix):]) {
			t.Errorf("fmt %s prints the token", verb)
		}
		if !strings.Contains(out, tok.Hash().Fingerprint()) {
			t.Errorf("fmt %s = %s, want the fingerprint", verb, out)
		}
	}
	wrapped := fmt.Sprintf("%v", struct{ T Token }{tok})
	if strings.Contains(wrapped, tok.Reveal()) {
		t.Error("a struct holding the token prints it")
	}
}

func TestHashRoundTripAndVerify(t *testing.T) {
	tok, _ := NewToken()
	other, _ := NewToken()
	h := tok.Hash()
	parsed, err := ParseHash(h.String())
	if err != nil || !parsed.Equal(h) {
		t.Fatalf("ParseHash(%s) = %v, %v", h, parsed, err)
	}
	if len(h.Fingerprint()) != 12 || !strings.HasPrefix(h.String(), "sha256:"+h.Fingerprint()) {
		t.Fatalf("fingerprint %q is not the digest's prefix", h.Fingerprint())
	}
	if err := Verify(tok.Reveal(), h); err != nil {
		t.Fatalf("Verify of the right token: %v", err)
	}
	if err := Verify(other.Reveal(), h); !errors.Is(err, ErrTokenMismatch) {
		t.Fatalf("Verify of another token = %v, want ErrTokenMismatch", err)
	}
	if err := Verify("flt1_guess", h); !errors.Is(err, ErrTokenFormat) {
		t.Fatalf("Verify of a malformed token = %v, want ErrTokenFormat", err)
	}
	for _, bad := range []string{"", "sha256:xyz", h.String()[7:], "sha1:" + h.String()[7:]} {
		if _, err := ParseHash(bad); err == nil {
			t.Errorf("ParseHash(%q) accepted", bad)
		}
	}
}
