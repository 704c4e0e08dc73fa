// Package forge holds what the in-repo forge test servers (GitHub, Gitea, GitLab, in
// the packages below this one) share: the statuses they keep per commit, faults a test
// injects, and a log of the requests they served. Each server speaks its forge's API on
// top of a Store; the Store speaks no API.
package forge

import (
	"crypto/rand"
	"encoding/hex"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Record is one status as a forge keeps it, in the forge's own state names.
type Record struct {
	ID          int64
	Context     string
	State       string
	Description string
	TargetURL   string
	Created     time.Time
}

// Request is one request a server received.
type Request struct {
	Time   time.Time
	Method string
	Path   string
	// Fault is the status code a injected fault answered with, 0 for a normal answer.
	Fault int
	// Limited is set when the request was refused for a rate limit (SetRateLimit,
	// SetWriteLimit).
	Limited bool
}

// Fault is an injected failure: the answer's status code and, when positive, the
// Retry-After the server sends with it.
type Fault struct {
	Code       int
	RetryAfter time.Duration
	// Quota is set when the request is refused for the rate limit, where the budget
	// stands: each server answers in its forge's words.
	Quota *Quota
}

// Quota is where a rate limit stands: Used of Limit requests in the window that ends at
// Reset.
type Quota struct {
	Limit  int
	Used   int
	Reset  time.Time
	Window time.Duration
}

// Store is the state of one forge server. Its methods are safe for concurrent use.
type Store struct {
	mu       sync.Mutex
	nextID   int64
	commits  map[string][]Record // oldest first
	faults   []Fault
	requests []Request
	clock    time.Time
	known    map[string]bool // registered commits
	// limit and window are the rate limit SetRateLimit set, 0 for none; used and reset
	// are the current window's.
	limit  int
	window time.Duration
	used   int
	reset  time.Time
	// writeN and writePer are the limit SetWriteLimit set on creating content, 0 for
	// none; posted are the times of the POSTs accepted within the last writePer.
	writeN   int
	writePer time.Duration
	posted   []time.Time
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{commits: map[string][]Record{}, clock: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// Add records r on commit with the next ID and a creation time one second after the
// previous record's, so that "newest" is never a tie.
func (s *Store) Add(commit string, r Record) Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.add(commit, r)
}

func (s *Store) add(commit string, r Record) Record {
	s.nextID++
	s.clock = s.clock.Add(time.Second)
	r.ID, r.Created = s.nextID, s.clock
	s.commits[strings.ToLower(commit)] = append(s.commits[strings.ToLower(commit)], r)
	return r
}

// Fill records n statuses of state on commit and context, as if posted over time.
func (s *Store) Fill(commit, context, state string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range n {
		s.add(commit, Record{Context: context, State: state, Description: "filled " + strconv.Itoa(i)})
	}
}

// All is every status of commit, newest first, as forges list history.
func (s *Store) All(commit string) []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.commits[strings.ToLower(commit)])
	slices.Reverse(out)
	return out
}

// Latest is the newest status per context of commit, sorted by context.
func (s *Store) Latest(commit string) []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]int{}
	var out []Record
	for _, r := range s.commits[strings.ToLower(commit)] {
		if i, ok := seen[r.Context]; ok {
			out[i] = r
			continue
		}
		seen[r.Context] = len(out)
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Record) int { return strings.Compare(a.Context, b.Context) })
	return out
}

// Count is how many statuses commit holds for context.
func (s *Store) Count(commit, context string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.commits[strings.ToLower(commit)] {
		if r.Context == context {
			n++
		}
	}
	return n
}

// FailNext makes the next n requests of any kind fail with f.
func (s *Store) FailNext(n int, f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.faults = append(s.faults, f)
	}
}

// SetRateLimit makes the server accept at most limit requests per window: a window
// begins with the first request after the previous one ended, as GitHub's hour does, and
// a request over the limit is refused, uncounted, until it ends. Zero lifts the limit.
func (s *Store) SetRateLimit(limit int, window time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limit, s.window, s.used, s.reset = limit, window, 0, time.Time{}
}

// SetWriteLimit makes the server accept at most n POST requests in any period of per, as
// GitHub's secondary limits on creating content do ("no more than 80 content-generating
// requests per minute"); one beyond is refused with 403 and a Retry-After of when the
// oldest leaves the period, uncounted. Zero lifts the limit. It is GitHub's: the other
// servers answer a 403 as a refusal of the request itself.
func (s *Store) SetWriteLimit(n int, per time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writeN, s.writePer, s.posted = n, per, nil
}

// writeWait is how long a POST at now must wait for the write limit; zero when it may
// go. The caller holds s.mu.
func (s *Store) writeWait(method string, now time.Time) time.Duration {
	if s.writeN <= 0 || method != http.MethodPost {
		return 0
	}
	for len(s.posted) > 0 && !now.Before(s.posted[0].Add(s.writePer)) {
		s.posted = s.posted[1:]
	}
	if len(s.posted) < s.writeN {
		return 0
	}
	return s.posted[0].Add(s.writePer).Sub(now)
}

// Quota is where the rate limit stands, false when none is set.
func (s *Store) Quota() (Quota, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.quota(time.Now()), s.limit > 0
}

// quota rolls the window over at now and returns it. The caller holds s.mu.
func (s *Store) quota(now time.Time) Quota {
	if !now.Before(s.reset) {
		s.used, s.reset = 0, now.Add(s.window)
	}
	return Quota{Limit: s.limit, Used: s.used, Reset: s.reset, Window: s.window}
}

// Begin logs a request and returns the fault it must answer with: one queued, or the
// rate limit's refusal. Servers call it first thing for every request.
func (s *Store) Begin(method, path string) (Fault, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	req := Request{Time: now, Method: method, Path: path}
	var f Fault
	ok := len(s.faults) > 0
	write := s.writeWait(method, now)
	switch {
	case ok:
		f, s.faults = s.faults[0], s.faults[1:]
		req.Fault = f.Code
	case write > 0:
		f, ok = Fault{Code: http.StatusForbidden, RetryAfter: write}, true
		req.Limited = true
	case s.limit > 0:
		q := s.quota(now)
		if q.Used >= q.Limit {
			f, ok = Fault{Code: 429, RetryAfter: q.Reset.Sub(now), Quota: &q}, true
			req.Limited = true
			break
		}
		s.used++
	}
	if !ok && s.writeN > 0 && method == http.MethodPost {
		s.posted = append(s.posted, now)
	}
	s.requests = append(s.requests, req)
	return f, ok
}

// Refused is how many requests were refused, by a fault or the rate limit.
func (s *Store) Refused() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.requests {
		if r.Fault != 0 || r.Limited {
			n++
		}
	}
	return n
}

// AddCommit registers sha, a full commit hash made elsewhere (a real git repository),
// so that statuses may be posted on it.
func (s *Store) AddCommit(sha string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known == nil {
		s.known = map[string]bool{}
	}
	s.known[strings.ToLower(sha)] = true
}

// Forget drops commits, registered or not, with every status they hold, as a forge
// collects the commits a force push left unreachable: a test that posts on thousands of
// commits (the soak) and measures its own memory keeps only the newest ones, so that
// what it measures is the client's, not the server's record of every post.
func (s *Store) Forget(commits ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range commits {
		c = strings.ToLower(c)
		delete(s.commits, c)
		delete(s.known, c)
	}
}

// ForgetRequests empties the log of the requests served (Requests, Refused), for the
// same reason as Forget.
func (s *Store) ForgetRequests() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = nil
}

// Requests is every request served so far, oldest first.
func (s *Store) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// NewCommit registers a new commit, with a random hash, that statuses may be posted
// on: forges look the commit up before storing a status.
func (s *Store) NewCommit() string {
	sha := RandomHex(20)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known == nil {
		s.known = map[string]bool{}
	}
	s.known[sha] = true
	return sha
}

// Known reports whether NewCommit registered sha (full, lower-case hex).
func (s *Store) Known(sha string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.known[strings.ToLower(sha)]
}

// Commits are the registered commits' hashes, in no order.
func (s *Store) Commits() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(s.known))
}

// RandomHex is n random bytes in hex, for commit hashes and tokens.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
