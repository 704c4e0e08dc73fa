// Package hubclient bounds how many requests the hub has in flight to the hub cluster.
//
// The hub's client has a rate limit (rest.Config's QPS and Burst), which says how many
// requests may start each second, whatever the API server's speed. A hub of thousands
// of agents may have thousands of status writes waiting at once. When the API server
// slows down, a rate alone keeps rate × latency of them in flight; the API server's
// priority and fairness queues them, and once its queues for the hub are full or
// waited on too long, it refuses them (429), each refusal a round trip and a retry.
// Bounding the requests in flight as well makes the hub slow down with the API server
// instead: what waits, waits in the hub, where it costs the hub cluster nothing.
package hubclient

import (
	"io"
	"net/http"
	"sync"

	"k8s.io/client-go/rest"
)

// DefaultMaxInFlight is how many requests the hub has in flight at most, unless
// configured otherwise: well under the share of an API server's concurrency that its
// priority and fairness gives service accounts (245 seats of a default API server's
// 600), so that the hub's requests run rather than queue; and a few times what the
// hub's rate limit needs at the latency of a healthy API server.
const DefaultMaxInFlight = 64

// LimitInFlight has rc's requests wait, beyond max in flight at once, until one of
// them ends: its answer read and closed, or failed. A watch is not counted: it lasts
// as long as its informer does. A request whose context ends while it waits fails
// with the context's error. A max of zero or less sets no bound.
func LimitInFlight(rc *rest.Config, max int) {
	if max <= 0 {
		return
	}
	slots := make(chan struct{}, max)
	rc.Wrap(func(next http.RoundTripper) http.RoundTripper { return &limited{next: next, slots: slots} })
}

type limited struct {
	next  http.RoundTripper
	slots chan struct{}
}

func (l *limited) RoundTrip(req *http.Request) (*http.Response, error) {
	if watching(req) {
		return l.next.RoundTrip(req)
	}
	select {
	case l.slots <- struct{}{}:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	resp, err := l.next.RoundTrip(req)
	if err != nil {
		<-l.slots
		return nil, err
	}
	// The request is in flight until its answer is read: client-go closes every body.
	resp.Body = &releasing{ReadCloser: resp.Body, release: sync.OnceFunc(func() { <-l.slots })}
	return resp, nil
}

// WrappedRoundTripper lets client-go's utilities see through the limit.
func (l *limited) WrappedRoundTripper() http.RoundTripper { return l.next }

// watching reports whether req is a watch, which client-go asks for as watch=true.
func watching(req *http.Request) bool {
	switch req.URL.Query().Get("watch") {
	case "true", "1":
		return true
	}
	return false
}

// releasing frees its request's slot when closed.
type releasing struct {
	io.ReadCloser
	release func()
}

func (r *releasing) Close() error {
	err := r.ReadCloser.Close()
	r.release()
	return err
}
