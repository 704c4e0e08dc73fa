package gitsource_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
)

func TestTriggersDuringASyncCoalesceIntoOne(t *testing.T) {
	started := make(chan int, 10)
	release := make(chan struct{})
	var mu sync.Mutex
	syncs := 0
	p := gitsource.NewPoller(time.Hour, 0.1, func(ctx context.Context) {
		mu.Lock()
		syncs++
		n := syncs
		mu.Unlock()
		started <- n
		if n == 1 {
			<-release
		}
	})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	if n := <-started; n != 1 {
		t.Fatalf("first sync is #%d", n)
	}
	for range 20 {
		p.Trigger()
	}
	close(release)
	if n := <-started; n != 2 {
		t.Fatalf("second sync is #%d", n)
	}
	// No third sync follows: the interval is an hour and the triggers were used up. The
	// poller is stopped and the count read after Run returned.
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if syncs != 2 {
		t.Fatalf("%d syncs for 20 triggers during one sync; want 2", syncs)
	}
}

func TestAWebhookTriggersAFetchOfThePush(t *testing.T) {
	repo := gitserver.Start(t).NewRepo(t, "fleet", template)
	s := newSource(t, repo.URL())
	type seen struct {
		head    plumbing.Hash
		changed []string
	}
	results := make(chan seen, 16)
	var last plumbing.Hash
	p := gitsource.NewPoller(time.Hour, 0, func(ctx context.Context) {
		snap, ch, err := s.Update(ctx, last)
		if err != nil {
			t.Errorf("update: %v", err)
			return
		}
		last = snap.Commit
		results <- seen{snap.Commit, ch.Paths}
	})
	h := gitsource.NewWebhookHandler(gitsource.WebhookOptions{Secret: []byte(secret), Trigger: func(gitsource.Forge, string) { p.Trigger() }})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	<-results // the first read at start

	head := repo.Commit("main", "add", map[string][]byte{clusterFile("gpu-z"): []byte("apiVersion: flotilla.dev/v1alpha1\n")})
	body := `{"ref":"refs/heads/main","after":"` + head + `"}`
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
	req.Header.Set("X-GitHub-Event", "push")
	req.Header.Set("X-GitHub-Delivery", "d-1")
	req.Header.Set("X-Hub-Signature-256", "sha256="+hmacHex(secret, body))
	sent := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("webhook status %d", resp.StatusCode)
	}
	select {
	case r := <-results:
		if r.head.String() != head || len(r.changed) != 1 || r.changed[0] != "clusters/gpu-z" {
			t.Fatalf("after the webhook: head %s changed %v; want %s and [clusters/gpu-z]", r.head, r.changed, head)
		}
		t.Logf("push seen and changed paths computed %v after the webhook", time.Since(sent))
	case <-time.After(30 * time.Second):
		t.Fatal("the webhook did not lead to a fetch; the poll interval is an hour")
	}
}
