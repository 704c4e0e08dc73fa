package gitsource_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"slices"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"golang.org/x/crypto/ssh"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
)

func newSSHKey(t *testing.T) (ssh.PublicKey, []byte) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return sshPub, pem.EncodeToMemory(block)
}

func TestSSH(t *testing.T) {
	authorized, key := newSSHKey(t)
	_, strangerKey := newSSHKey(t)
	srv := gitserver.StartSSH(t, "fleet-admin", "http-password", authorized)
	repo := srv.NewRepo(t, "fleet", template)
	knownHosts := srv.KnownHosts(t)
	// A known_hosts naming another key for the same address: a server in the middle.
	otherServer := gitserver.StartSSH(t, "other", "other-password", authorized)
	impostor := strings.Replace(string(otherServer.KnownHosts(t)), strings.Fields(string(otherServer.KnownHosts(t)))[0], strings.Fields(string(knownHosts))[0], 1)

	tests := []struct {
		name       string
		key        []byte
		knownHosts string
		wantErr    string
	}{
		{"the authorized key on a known host fetches", key, string(knownHosts), ""},
		{"an unknown client key is refused", strangerKey, string(knownHosts), "authentication"},
		{"a host key other than the known one is refused", key, impostor, "key mismatch"},
		{"a host not in known_hosts is refused", key, "[git.example]:22 " + strings.SplitN(string(knownHosts), " ", 2)[1], "key is unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			auth, err := gitsource.SSHAuth("git", tt.key, nil, []byte(tt.knownHosts))
			if err != nil {
				t.Fatal(err)
			}
			s, err := gitsource.New(gitsource.Options{URL: repo.SSHURL(), Branch: "main", Auth: auth})
			if err != nil {
				t.Fatal(err)
			}
			snap, ch, err := s.Update(t.Context(), plumbing.ZeroHash)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Update over SSH: %v", err)
				}
				if snap.Commit.String() != repo.Head("main") || !ch.All {
					t.Fatalf("fetched %s (%+v), want %s", snap.Commit, ch, repo.Head("main"))
				}
				// And an incremental fetch of a new commit.
				next := repo.Commit("main", "add a cluster", map[string][]byte{clusterFile("gpu-z"): []byte("name: gpu-z\n")})
				snap, ch, err = s.Update(t.Context(), snap.Commit)
				if err != nil || snap.Commit.String() != next || !slices.Equal(ch.Paths, []string{"clusters/gpu-z"}) {
					t.Fatalf("incremental fetch over SSH: %v, %+v, %v", snap, ch, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Update = %v, want an error saying %q", err, tt.wantErr)
			}
			if strings.Contains(err.Error(), "PRIVATE KEY") {
				t.Fatalf("the error shows key material: %v", err)
			}
		})
	}
	if _, err := gitsource.SSHAuth("git", key, nil, nil); err == nil {
		t.Fatal("SSH without known_hosts was accepted")
	}
}
