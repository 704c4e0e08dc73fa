package hubclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/flotilla-gitops/flotilla/test/poll"
)

// server answers every request once the test lets it, and counts how many it holds at
// once; watches it holds until the test ends.
type server struct {
	*httptest.Server
	release  chan struct{}
	held     atomic.Int64
	mostHeld atomic.Int64
}

func newServer(t *testing.T) *server {
	s := &server{release: make(chan struct{})}
	ended := make(chan struct{})
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "true" {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-ended
			return
		}
		n := s.held.Add(1)
		for {
			most := s.mostHeld.Load()
			if n <= most || s.mostHeld.CompareAndSwap(most, n) {
				break
			}
		}
		select {
		case <-s.release:
		case <-ended:
		}
		s.held.Add(-1)
		_, _ = io.WriteString(w, "{}")
	}))
	t.Cleanup(func() {
		close(ended)
		s.Close()
	})
	return s
}

func clientOf(t *testing.T, s *server, max int) *http.Client {
	t.Helper()
	rc := &rest.Config{Host: s.URL}
	LimitInFlight(rc, max)
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		t.Fatal(err)
	}
	return hc
}

func get(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return errors.Join(err, resp.Body.Close())
}

func TestNoMoreThanMaxRequestsReachTheAPIServerAtOnce(t *testing.T) {
	s := newServer(t)
	hc := clientOf(t, s, 3)
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for range 10 {
		wg.Go(func() { errs <- get(t.Context(), hc, s.URL+"/api/v1/namespaces") })
	}
	// Three reach the server, and the others wait in the client.
	poll.Until(t, "three requests at the server", func() (bool, string) {
		return s.held.Load() >= 3, fmt.Sprintf("%d held", s.held.Load())
	})
	// Every request ends once answered, and the next ones take their slots.
	for range 10 {
		deadline := time.After(30 * time.Second)
		select {
		case s.release <- struct{}{}:
		case <-deadline:
			t.Fatalf("no request reached the server; %d held", s.held.Load())
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if most := s.mostHeld.Load(); most != 3 {
		t.Errorf("the server held %d requests at once, want 3 (the bound)", most)
	}
}

func TestAWatchTakesNoSlot(t *testing.T) {
	s := newServer(t)
	hc := clientOf(t, s, 1)
	resp, err := hc.Get(s.URL + "/api/v1/namespaces?watch=true")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	done := make(chan error, 1)
	go func() { done <- get(t.Context(), hc, s.URL+"/api/v1/namespaces") }()
	select {
	case s.release <- struct{}{}:
	case <-time.After(30 * time.Second):
		t.Fatal("a request waited behind an open watch")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestARequestWaitingForASlotEndsWithItsContext(t *testing.T) {
	s := newServer(t)
	hc := clientOf(t, s, 1)
	first := make(chan error, 1)
	go func() { first <- get(t.Context(), hc, s.URL+"/api/v1/namespaces") }()
	poll.Until(t, "the first request at the server", func() (bool, string) {
		select {
		case err := <-first:
			t.Fatalf("the first request ended unanswered: %v", err)
		default:
		}
		return s.held.Load() == 1, "not yet"
	})
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := get(ctx, hc, s.URL+"/api/v1/namespaces"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a request that waited past its deadline for a slot: %v, want context.DeadlineExceeded", err)
	}
	if n := s.mostHeld.Load(); n != 1 {
		t.Errorf("the server held %d requests, want only the first", n)
	}
	s.release <- struct{}{}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}
