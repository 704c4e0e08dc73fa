package secrets

import (
	"context"
	"fmt"
	"testing"

	"filippo.io/age"

	"github.com/flotilla-gitops/flotilla/test/sopstest"
)

type benchFile struct {
	file string
	data []byte
}

func benchFiles(b *testing.B, n int) ([]benchFile, *age.X25519Identity) {
	hub := sopstest.NewIdentity(b)
	r := newRepo(b, sopstest.Rule{PathRegex: sopstest.EnrollmentPathRegex, EncryptedRegex: "^token$", Age: []*age.X25519Identity{hub}})
	files := make([]benchFile, n)
	for i := range files {
		tok, err := NewToken()
		if err != nil {
			b.Fatal(err)
		}
		file, data := r.encrypt(b, fmt.Sprintf("gpu-%05d", i), tok)
		files[i] = benchFile{file, data}
	}
	return files, hub
}

// BenchmarkTokenHash measures one file: cold is a full SOPS decryption (age, AES-GCM,
// MAC), cached is what an unchanged file costs on every later reconcile.
func BenchmarkTokenHash(b *testing.B) {
	files, hub := benchFiles(b, 1)
	ctx := context.Background()
	b.Run("cold", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decryptor(b, hub).TokenHash(ctx, files[0].file, files[0].data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		d := decryptor(b, hub)
		if _, err := d.TokenHash(ctx, files[0].file, files[0].data); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := d.TokenHash(ctx, files[0].file, files[0].data); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkFleet10k is a hub starting on a fleet of 10,000 clusters (cold) and then
// re-reading it unchanged (cached).
func BenchmarkFleet10k(b *testing.B) {
	files, hub := benchFiles(b, 10_000)
	ctx := context.Background()
	all := func(b *testing.B, d *Decryptor) {
		for _, f := range files {
			if _, err := d.TokenHash(ctx, f.file, f.data); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("cold", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			all(b, decryptor(b, hub))
		}
	})
	b.Run("cached", func(b *testing.B) {
		d := decryptor(b, hub)
		all(b, d)
		b.ReportAllocs()
		for b.Loop() {
			all(b, d)
		}
	})
}
