package gitnotes_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitnotes"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// A post to an SSH server that accepts the connection and never answers fails when its
// context ends, rather than holding the backend, and every post queued behind it, for
// good: whether the fetch of the notes meets the silence or their push does. A server
// that never answers costs one connection however often the post is retried, until
// that connection ends.
func TestAnSSHServerThatNeverAnswersFailsThePostInTime(t *testing.T) {
	const commit = "0123456789abcdef0123456789abcdef01234567"
	status := commitstatus.Status{Context: "flotilla/a", State: commitstatus.Pending, Description: "waiting"}
	backend := func(t *testing.T, url string, knownHosts, key []byte) *gitnotes.Backend {
		t.Helper()
		auth, err := gitsource.SSHAuth("git", key, nil, knownHosts)
		if err != nil {
			t.Fatal(err)
		}
		b, err := gitnotes.New(gitnotes.Options{URL: url, Auth: auth})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// post sets status on c within ctx, and returns the error it ends with.
	post := func(t *testing.T, ctx context.Context, b *gitnotes.Backend, c string) error {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- b.Set(ctx, c, status) }()
		err := poll.Receive(t, "the post given up", done)
		if err == nil {
			t.Fatal("a post to a server that never answers succeeded")
		}
		return err
	}

	t.Run("the fetch", func(t *testing.T) {
		srv := gitserver.StartSilent(t)
		_, key := gitserver.NewSSHKey(t)
		b := backend(t, srv.URL("fleet"), srv.KnownHosts(t), key)
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		if err := post(t, ctx, b, commit); !strings.Contains(err.Error(), context.DeadlineExceeded.Error()) {
			t.Fatalf("a post while the server does not answer: %v; want its context's end", err)
		}
		first := <-srv.Accepted()
		for range 3 {
			ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			err := post(t, ctx, b, commit)
			cancel()
			if !strings.Contains(err.Error(), "has not answered the last connections") {
				t.Fatalf("a post while the first connection hangs: %v", err)
			}
		}
		select {
		case <-srv.Accepted():
			t.Fatal("a post connected again while the first connection hung")
		default:
		}
		first.Close()
		poll.Until(t, "a post that connects again", func() (bool, string) {
			ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
			defer cancel()
			err := post(t, ctx, b, commit)
			return !strings.Contains(err.Error(), "has not answered"), err.Error()
		})
		<-srv.Accepted()
	})

	t.Run("the push", func(t *testing.T) {
		authorized, key := gitserver.NewSSHKey(t)
		srv := gitserver.StartSSH(t, "hub", "http-password", authorized)
		repo := srv.NewRepo(t, "fleet", "")
		c := repo.Commit("main", "add a cluster", map[string][]byte{"clusters/a/cluster.yaml": []byte("name: a\n")})
		// The notes are fetched on the first connection and pushed on the second.
		silent := srv.SSHSilentExcept(t, func(n int) bool { return n == 0 })
		b := backend(t, silent.URL("fleet"), silent.KnownHosts(t), key)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() {
			// The push's connection is held: its context ends.
			select {
			case <-silent.Accepted():
				cancel()
			case <-ctx.Done():
			}
		}()
		if err := post(t, ctx, b, c); !strings.Contains(err.Error(), "pushing notes") || !strings.Contains(err.Error(), context.Canceled.Error()) {
			t.Fatalf("a post whose push the server does not answer: %v; want the push given up at its context's end", err)
		}
	})
}
