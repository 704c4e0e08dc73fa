package secrets

import (
	"context"
	"path/filepath"
	"testing"

	"filippo.io/age"

	"github.com/flotilla-gitops/flotilla/test/sopstest"
)

// FuzzTokenHash feeds hostile enrollment files to the hub's decrypt path: it must return
// an error or a hash, never panic, and never put token-shaped text into an error.
func FuzzTokenHash(f *testing.F) {
	hub := sopstest.NewIdentity(f)
	dir := f.TempDir()
	config := sopstest.WriteConfig(f, dir, sopstest.Rule{EncryptedRegex: "^token$", Age: []*age.X25519Identity{hub}})
	tok, err := NewToken()
	if err != nil {
		f.Fatal(err)
	}
	good, err := EncryptEnrollment(config, filepath.Join(dir, "clusters/a/enrollment.sops.yaml"), tok)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte("token: " + tok.Reveal() + "\nsops: {mac: x, lastmodified: y, version: z}\n"))
	f.Add([]byte("sops: {age: [{recipient: " + hub.Recipient().String() + ", enc: x}], mac: x, lastmodified: '2026-01-01T00:00:00Z', version: 3.13.3}\n"))
	d := decryptor(f, hub)
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := d.TokenHash(context.Background(), "clusters/a/enrollment.sops.yaml", data)
		if err != nil && tokenPattern.MatchString(err.Error()) {
			t.Fatalf("error carries a token-shaped text: %v", err)
		}
	})
}
