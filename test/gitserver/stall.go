package gitserver

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
)

// Stalling is a clone URL of a repository whose server stops answering some fetches:
// it reads the request and then waits, until the client gives up, as a server that
// hangs mid-transfer does.
type Stalling struct {
	// URL is the repository's clone URL through the stalling server.
	URL string
	// stall says whether a fetch stalls, from its request body (its want and have lines).
	stall  func(request []byte) bool
	stalls atomic.Int64
}

// Stall serves repo behind a server that stalls the fetches stall says to stall.
func (r *Repo) Stall(t testing.TB, stall func(request []byte) bool) *Stalling {
	t.Helper()
	target, err := url.Parse(r.url)
	if err != nil {
		t.Fatal(err)
	}
	s := &Stalling{stall: stall}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/git-upload-pack") {
			body, err := io.ReadAll(req.Body)
			if err != nil {
				return
			}
			if s.stall(body) {
				s.stalls.Add(1)
				<-req.Context().Done()
				return
			}
			req.Body = io.NopCloser(bytes.NewReader(body))
		}
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	s.URL = srv.URL + target.Path
	return s
}

// Stalls is how many fetches the server stalled so far.
func (s *Stalling) Stalls() int { return int(s.stalls.Load()) }
