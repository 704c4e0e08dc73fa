package plan

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"k8s.io/utils/lru"
)

// PathPrefix is where a Store serves plans: PathPrefix + source + "/" + commit for the
// page, with ".json" appended for machines.
const PathPrefix = "/plans/"

// DefaultStoreSize is how many plans a Store keeps per source unless told otherwise: a
// few pushes to each of a busy repository's open pull requests.
const DefaultStoreSize = 128

// Path is where a Store serves the plan of a source's commit; a status's target URL is
// the hub's external address followed by it.
func Path(source, commit string) string {
	return PathPrefix + url.PathEscape(source) + "/" + commit
}

// Store keeps the newest plans of each fleet source by head commit, evicting the least
// recently used, and serves them over HTTP. Each source has a cache of its own, so that
// one tenant's stream of pull requests never evicts another's plans, and the same commit
// pushed to two repositories is two plans. It is safe for concurrent use.
type Store struct {
	size int
	mux  *http.ServeMux

	mu      sync.Mutex
	sources map[string]*lru.Cache
}

// NewStore returns a Store of at most size plans per source; size <= 0 means
// DefaultStoreSize.
func NewStore(size int) *Store {
	if size <= 0 {
		size = DefaultStoreSize
	}
	s := &Store{size: size, mux: http.NewServeMux(), sources: map[string]*lru.Cache{}}
	s.mux.HandleFunc("GET "+PathPrefix+"{source}/{commit}", s.serve)
	return s
}

func (s *Store) cache(source string, create bool) *lru.Cache {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.sources[source]
	if c == nil && create {
		c = lru.New(s.size)
		s.sources[source] = c
	}
	return c
}

// Put keeps p under its source and head commit, replacing an older plan of the same
// commit: the newest comparison is the one its status describes.
func (s *Store) Put(source string, p *Plan) {
	s.cache(source, true).Add(strings.ToLower(p.Commit), p)
}

// Get returns the plan of a source's commit, a full commit hash.
func (s *Store) Get(source, commit string) (*Plan, bool) {
	c := s.cache(source, false)
	if c == nil {
		return nil, false
	}
	v, ok := c.Get(strings.ToLower(commit))
	if !ok {
		return nil, false
	}
	return v.(*Plan), true
}

// Len is how many plans the Store holds over all sources.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.sources {
		n += c.Len()
	}
	return n
}

// ServeHTTP serves GET PathPrefix{source}/{commit} as an HTML page and GET
// PathPrefix{source}/{commit}.json as JSON. Anything but a full 40-hex commit is a bad
// request; a commit without a plan is not found.
func (s *Store) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

func (s *Store) serve(w http.ResponseWriter, r *http.Request) {
	commit, asJSON := strings.CutSuffix(r.PathValue("commit"), ".json")
	if !IsCommit(commit) {
		http.Error(w, "not a commit: plans are served by full 40-hex commit hash", http.StatusBadRequest)
		return
	}
	p, ok := s.Get(r.PathValue("source"), commit)
	if !ok {
		http.Error(w, "no plan for this commit", http.StatusNotFound)
		return
	}
	// The page shows file contents of a pull request, which anyone who can open one
	// controls.
	WritePage(w, page, p, asJSON)
}

// WritePage answers with data as indented JSON, or rendered by tmpl as HTML. The hub's
// pages show what pull requests and agents wrote, which their authors control: on top of
// html/template's escaping, a Content-Security-Policy lets nothing on the page run or
// load. The answer is rendered into a buffer first, so that a failure is an error
// status, not half a page.
func WritePage(w http.ResponseWriter, tmpl *template.Template, data any, asJSON bool) {
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-cache")
	h.Set("Referrer-Policy", "no-referrer")
	var buf bytes.Buffer
	if asJSON {
		enc := json.NewEncoder(&buf)
		enc.SetIndent("", "  ")
		if err := enc.Encode(data); err != nil {
			http.Error(w, "encoding the page failed", http.StatusInternalServerError)
			return
		}
		h.Set("Content-Type", "application/json")
	} else {
		if err := tmpl.Execute(&buf, data); err != nil {
			http.Error(w, "rendering the page failed", http.StatusInternalServerError)
			return
		}
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	}
	_, _ = w.Write(buf.Bytes())
}

// IsCommit reports whether s is a full SHA-1 commit hash, as the hub's pages are
// addressed.
func IsCommit(s string) bool {
	if len(s) != 40 {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

//go:embed page.html
var pageHTML string

var page = template.Must(template.New("plan").Funcs(template.FuncMap{
	"lines":  diffLines,
	"plural": plural,
	"short":  func(commit string) string { return commit[:min(len(commit), 12)] },
	"unchanged": func(p *Plan) []string {
		var names []string
		for _, c := range p.Clusters {
			if c.Change == Unchanged {
				names = append(names, c.Name)
			}
		}
		return names
	},
}).Parse(pageHTML))

// diffLine is one line of a diff with the class that colours it.
type diffLine struct {
	Class, Text string
}

// diffLines splits a unified diff for display. The first two lines are the file
// headers; after them a line's first character says what it is, so a removed YAML line
// that itself begins with "--" is not mistaken for a header.
func diffLines(diff string) []diffLine {
	lines := splitLines(diff)
	out := make([]diffLine, len(lines))
	for i, l := range lines {
		class := "ctx"
		switch {
		case i < 2:
			class = "file"
		case strings.HasPrefix(l, "@@"):
			class = "hunk"
		case strings.HasPrefix(l, "+"):
			class = "add"
		case strings.HasPrefix(l, "-"):
			class = "del"
		}
		out[i] = diffLine{class, l}
	}
	return out
}
