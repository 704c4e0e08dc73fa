package scale

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/flotilla-gitops/flotilla/test/poll"
)

// requestCounter counts what a hub asks of the hub cluster, as its client sends it:
// client-go's retries of a refused request count again.
type requestCounter struct {
	mu sync.Mutex
	// by is the count per kind of request: "get", "list", "watch", "create",
	// "update", "patch", "delete".
	by map[string]int
	// refused counts the answers 429 Too Many Requests: the API server's priority and
	// fairness turned the request away.
	refused int
	// conflicts counts the answers 409 Conflict: a write made on a copy behind the
	// stored object, done again.
	conflicts int
	// last are the latest requests, for a test that counts more than it wants.
	last []string
}

// recent lists the latest requests, oldest first.
func (c *requestCounter) recent() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.last, "\n")
}

type requests struct {
	by        map[string]int
	refused   int
	conflicts int
}

func (r requests) total() int {
	n := 0
	for _, v := range r.by {
		n += v
	}
	return n
}

// writes counts the requests that change something.
func (r requests) writes() int {
	return r.by["create"] + r.by["update"] + r.by["patch"] + r.by["delete"]
}

// reads counts the gets and lists; watches are long-lived and counted apart.
func (r requests) reads() int { return r.by["get"] + r.by["list"] }

func (r requests) String() string {
	return fmt.Sprintf("%d requests (%d get, %d list, %d watch, %d create, %d update, %d patch, %d delete), %d refused, %d conflicts",
		r.total(), r.by["get"], r.by["list"], r.by["watch"], r.by["create"], r.by["update"], r.by["patch"], r.by["delete"], r.refused, r.conflicts)
}

// minus is what happened since before.
func (r requests) minus(before requests) requests {
	out := requests{by: map[string]int{}, refused: r.refused - before.refused, conflicts: r.conflicts - before.conflicts}
	for k, v := range r.by {
		out.by[k] = v - before.by[k]
	}
	return out
}

func (c *requestCounter) snapshot() requests {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := requests{by: map[string]int{}, refused: c.refused, conflicts: c.conflicts}
	for k, v := range c.by {
		out.by[k] = v
	}
	return out
}

// kind names a request the way the API server's audit log does.
func kind(r *http.Request) string {
	switch r.Method {
	case http.MethodPost:
		return "create"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	}
	if r.URL.Query().Get("watch") == "true" {
		return "watch"
	}
	// A collection's path ends in its resource's plural, an object's in its name after
	// it: /apis/<group>/<version>[/namespaces/<ns>]/<resource>[/<name>[/<subresource>]].
	segs := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	at := 2 // after api/<version>
	if segs[0] == "apis" {
		at = 3
	}
	if len(segs) > at+1 && segs[at] == "namespaces" {
		at += 2
	}
	if len(segs) == at+1 {
		return "list"
	}
	return "get"
}

func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		// A request counts when it is sent, not when its answer is in: a watch can show
		// a write before its writer has the answer, and a test that waits on a watch
		// and then counts must find the write counted.
		k := kind(r)
		c.mu.Lock()
		if c.by == nil {
			c.by = map[string]int{}
		}
		c.by[k]++
		c.last = append(c.last, k+" "+r.URL.Path)
		if len(c.last) > 64 {
			c.last = c.last[1:]
		}
		c.mu.Unlock()
		resp, err := rt.RoundTrip(r)
		c.mu.Lock()
		if resp != nil && resp.StatusCode == http.StatusTooManyRequests {
			c.refused++
		}
		if resp != nil && resp.StatusCode == http.StatusConflict {
			c.conflicts++
		}
		c.mu.Unlock()
		return resp, err
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// countingConfig is the admin's client configuration, with its requests counted.
func countingConfig(c *requestCounter) *rest.Config {
	cfg := rest.CopyConfig(planes[0].Config)
	cfg.Wrap(c.wrap)
	return cfg
}

// waitQuiet waits until the hub has sent the hub cluster nothing for quiet. The agents'
// reports that follow their reconnection to a new hub may still be on their way when
// every cluster already shows its agent connected; a test that counts what a commit
// costs starts once they are in.
func (c *requestCounter) waitQuiet(tb testing.TB, quiet time.Duration) {
	tb.Helper()
	last, since := c.snapshot().total(), time.Now()
	poll.Until(tb, "the hub quiet for "+quiet.String(), func() (bool, string) {
		if n := c.snapshot().total(); n != last {
			last, since = n, time.Now()
		}
		return time.Since(since) >= quiet, fmt.Sprintf("%d requests so far, the last %s ago", last, time.Since(since).Round(time.Millisecond))
	})
}
