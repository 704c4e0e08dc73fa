// Package sopstest makes real age keys and SOPS configuration for tests. Nothing in it
// is a stand-in: keys come from age and files are encrypted by SOPS itself.
package sopstest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"
)

// EnrollmentPathRegex is the path_regex of fleet-template's creation rule.
const EnrollmentPathRegex = `^clusters/[^/]+/enrollment\.sops\.yaml$`

// NewIdentity generates an age X25519 identity.
func NewIdentity(tb testing.TB) *age.X25519Identity {
	tb.Helper()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		tb.Fatalf("generating an age identity: %v", err)
	}
	return id
}

// WriteKeyFile writes id in age-keygen's format to dir/name, mode 0600, and returns its
// path.
func WriteKeyFile(tb testing.TB, dir, name string, ids ...*age.X25519Identity) string {
	tb.Helper()
	var b strings.Builder
	for _, id := range ids {
		b.WriteString("# created: by a test\n# public key: " + id.Recipient().String() + "\n" + id.String() + "\n")
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		tb.Fatal(err)
	}
	return p
}

// Rule is one creation rule of a .sops.yaml.
type Rule struct {
	PathRegex      string
	EncryptedRegex string
	Age            []*age.X25519Identity
}

// WriteConfig writes dir/.sops.yaml with the rules in order and returns its path.
func WriteConfig(tb testing.TB, dir string, rules ...Rule) string {
	tb.Helper()
	var b strings.Builder
	b.WriteString("creation_rules:\n")
	for _, r := range rules {
		b.WriteString("  - age: " + Recipients(r.Age...) + "\n")
		if r.PathRegex != "" {
			b.WriteString("    path_regex: '" + r.PathRegex + "'\n")
		}
		if r.EncryptedRegex != "" {
			b.WriteString("    encrypted_regex: '" + r.EncryptedRegex + "'\n")
		}
	}
	p := filepath.Join(dir, ".sops.yaml")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		tb.Fatal(err)
	}
	return p
}

// Recipients joins the identities' public keys as .sops.yaml's age field wants them.
func Recipients(ids ...*age.X25519Identity) string {
	r := make([]string, len(ids))
	for i, id := range ids {
		r[i] = id.Recipient().String()
	}
	return strings.Join(r, ",")
}
