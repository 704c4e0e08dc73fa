package gitsource_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/go-git/go-git/v5/plumbing"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
)

func TestSignedHeadsOnly(t *testing.T) {
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	trusted, ring := gitserver.NewSigningKey(t, "Fleet Admin")
	stranger, _ := gitserver.NewSigningKey(t, "Someone Else")

	s, err := gitsource.New(gitsource.Options{URL: repo.URL(), Branch: "main", TrustedKeys: ring})
	if err != nil {
		t.Fatal(err)
	}
	// The template's first commit is unsigned: nothing to apply yet.
	last := plumbing.ZeroHash
	for _, step := range []struct {
		name   string
		key    *openpgp.Entity
		reason string
	}{
		{"an unsigned head is refused", nil, "not signed"},
		{"a head signed by a trusted key is applied", trusted, ""},
		{"a head signed by an untrusted key is refused", stranger, "does not verify"},
		{"the next trusted head is applied and compared with the last applied", trusted, ""},
	} {
		t.Run(step.name, func(t *testing.T) {
			repo.SignWith(step.key)
			head := repo.Commit("main", step.name, map[string][]byte{"README.md": []byte(step.name)})
			snap, _, err := s.Update(t.Context(), last)
			if step.reason != "" {
				var ve *gitsource.VerificationError
				if !errors.As(err, &ve) || !errors.Is(err, gitsource.ErrUnverified) || ve.Commit != head || !strings.Contains(ve.Reason, step.reason) {
					t.Fatalf("Update = %v, want a refusal of %s saying %q", err, head, step.reason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if snap.Commit.String() != head || snap.Signer == "" || !strings.Contains(snap.Signer, "Fleet Admin") {
				t.Fatalf("applied %s signed by %q, want %s by Fleet Admin", snap.Commit, snap.Signer, head)
			}
			last = snap.Commit
		})
	}
}

func TestBrokenKeyRingIsAConfigurationError(t *testing.T) {
	_, err := gitsource.New(gitsource.Options{URL: "https://git.example/fleet.git", Branch: "main", TrustedKeys: "not a key"})
	if err == nil || !strings.Contains(err.Error(), "trusted OpenPGP keys") {
		t.Fatalf("New with a broken keyring = %v", err)
	}
}
