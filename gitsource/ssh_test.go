package gitsource_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

func TestSSH(t *testing.T) {
	authorized, key := gitserver.NewSSHKey(t)
	_, strangerKey := gitserver.NewSSHKey(t)
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

// An SSH server that accepts the connection and never answers fails the fetch when its
// context ends, rather than holding the source for good, and costs one connection
// however often the hub tries again, until that connection ends.
func TestAnSSHServerThatNeverAnswersFailsTheFetchInTime(t *testing.T) {
	srv := gitserver.StartSilent(t)
	conns := srv.Accepted()
	_, key := gitserver.NewSSHKey(t)
	auth, err := gitsource.SSHAuth("git", key, nil, srv.KnownHosts(t))
	if err != nil {
		t.Fatal(err)
	}
	s, err := gitsource.New(gitsource.Options{URL: srv.URL("fleet"), Branch: "main", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	fetch := func() error {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		done := make(chan error, 1)
		go func() { _, err := s.Fetch(ctx); done <- err }()
		err := poll.Receive(t, "the fetch given up", done)
		if err == nil {
			t.Fatal("a fetch from a server that never answers succeeded")
		}
		return err
	}
	fetch()
	first := <-conns
	for range 3 {
		if err := fetch(); !strings.Contains(err.Error(), "has not answered the last connections") {
			t.Fatalf("a fetch while the first connection hangs: %v", err)
		}
	}
	select {
	case <-conns:
		t.Fatal("a fetch connected again while the first connection hung")
	default:
	}
	// The pull requests count their own: the branch's hanging connection holds them
	// up no more than it does the server.
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	_, err = s.PullRequests(ctx, nil)
	cancel()
	if err == nil || strings.Contains(err.Error(), "has not answered") {
		t.Fatalf("listing the pull requests while the branch's connection hangs: %v; want it tried, and given up", err)
	}
	<-conns
	// The first connection ends: the next fetch connects again.
	first.Close()
	poll.Until(t, "a fetch that connects again", func() (bool, string) {
		err := fetch()
		return !strings.Contains(err.Error(), "has not answered"), err.Error()
	})
	<-conns
}
