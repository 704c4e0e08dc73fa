// Package gitserver runs a real git server over HTTP for tests, and lets a test shape the history
// of its repositories: commit to a branch, branch off, merge with a real merge commit.
//
// The server is fluxcd's gittestserver, which serves through the git binary's own upload-pack
// and receive-pack, so clients under test talk to real git. A test changes a repository through a
// Repo, which works in a clone of its own and pushes over HTTP like any other client; it fetches
// before each change, so pushes made by the code under test are built upon, not overwritten.
//
//	srv := gitserver.Start(t)
//	repo := srv.NewRepo(t, "fleet", "../../fleet-template")
//	sha := repo.Commit("main", "add a cluster", map[string][]byte{"clusters/a.yaml": data})
package gitserver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/fluxcd/gitkit"
	"github.com/fluxcd/pkg/gittestserver"
	"github.com/go-git/go-billy/v5/osfs"
	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/filesystem"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// opTimeout bounds each fetch and push, so that a wedged server fails the test instead of
// hanging it until -test.timeout.
const opTimeout = 30 * time.Second

// epoch is the time of every repository's first commit; each later commit of the same Repo is
// one minute later. Fixed times make the commit hashes of a test the same on every run, and
// strictly increasing ones keep the history ordered for code that sorts by time.
var epoch = time.Date(2025, time.January, 1, 0, 0, 0, 0, time.UTC)

// author signs every commit a Repo makes.
var author = object.Signature{Name: "Flotilla Test", Email: "test@flotilla.invalid"}

// Server is a running git HTTP server with its repositories in a temporary directory.
type Server struct {
	git *gittestserver.GitServer
	// remote is the URL the helper's own clones use: with credentials when the server
	// requires them.
	remote string
	// hostKeyFile holds the SSH server's public host key, when it serves SSH.
	hostKeyFile string

	backendOnce sync.Once
	backend     *httptest.Server
	backendErr  error
	// fetching is how long both HTTP servers have spent answering fetches, in
	// nanoseconds summed over requests.
	fetching atomic.Int64
}

// Start starts a server on the loopback interface. It is stopped, and its repositories removed,
// when t and its subtests finish.
func Start(t testing.TB) *Server {
	t.Helper()
	g := gittestserver.NewGitServer(t.TempDir())
	s := &Server{git: g}
	g.AddHTTPMiddlewares(s.timeFetches)
	if err := g.StartHTTP(); err != nil {
		t.Fatalf("starting git server: %v", err)
	}
	t.Cleanup(g.StopHTTP)
	s.remote = g.HTTPAddress()
	return s
}

// StartWithAuth is Start for a server that requires HTTP basic authentication with
// user and password from every client; Repo's own operations use them.
func StartWithAuth(t testing.TB, user, password string) *Server {
	t.Helper()
	g := gittestserver.NewGitServer(t.TempDir()).Auth(user, password)
	s := &Server{git: g}
	g.AddHTTPMiddlewares(s.timeFetches)
	if err := g.StartHTTP(); err != nil {
		t.Fatalf("starting git server: %v", err)
	}
	t.Cleanup(g.StopHTTP)
	s.remote = g.HTTPAddressWithCredentials()
	return s
}

// authorizedKeys are the client keys any SSH server of this package accepts. gittestserver
// takes its key check from a package-level function of its own, so the check cannot be
// per server; a key is only ever authorized by the test that made it, so sharing the set
// across the servers of one test binary admits nothing a test did not ask for.
var authorizedKeys sync.Map // authorized_keys line → true

func init() {
	(&gittestserver.GitServer{}).PublicKeyLookupFunc(func(content string) (*gitkit.PublicKey, error) {
		if _, ok := authorizedKeys.Load(content); ok {
			return &gitkit.PublicKey{Id: "fleet-reader"}, nil
		}
		return nil, errors.New("unknown public key")
	})
}

// StartSSH is StartWithAuth serving SSH as well: clients authenticate with the private
// key of authorized (HTTP keeps requiring user and password). The server's host key is
// in KnownHosts.
func StartSSH(t testing.TB, user, password string, authorized ssh.PublicKey) *Server {
	t.Helper()
	keys := t.TempDir()
	g := gittestserver.NewGitServer(t.TempDir()).Auth(user, password).KeyDir(keys)
	if err := g.StartHTTP(); err != nil {
		t.Fatalf("starting git server: %v", err)
	}
	t.Cleanup(g.StopHTTP)
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(authorized)))
	authorizedKeys.Store(line, true)
	t.Cleanup(func() { authorizedKeys.Delete(line) })
	if err := g.ListenSSH(); err != nil {
		t.Fatalf("starting git SSH server: %v", err)
	}
	go func() { _ = g.StartSSH() }()
	t.Cleanup(func() { _ = g.StopSSH() })
	return &Server{git: g, remote: g.HTTPAddressWithCredentials(), hostKeyFile: filepath.Join(keys, "gitkit.rsa.pub")}
}

// KnownHosts is a known_hosts file's contents naming the SSH server's host key; empty
// for a server without SSH.
func (s *Server) KnownHosts(t testing.TB) []byte {
	t.Helper()
	if s.hostKeyFile == "" {
		return nil
	}
	pub, err := os.ReadFile(s.hostKeyFile)
	if err != nil {
		t.Fatalf("reading the SSH host key: %v", err)
	}
	u, err := url.Parse(s.git.SSHAddress())
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Appendf(nil, "%s %s", knownhosts.Normalize(u.Host), pub)
}

// Path is where the bare repository name (e.g. "fleet") of the server lives on disk, for a
// test that builds a large repository with the git command line, much faster than through
// a Repo.
func (s *Server) Path(name string) string {
	return filepath.Join(s.git.Root(), filepath.FromSlash(strings.TrimSuffix(name, ".git"))+".git")
}

// URL is the HTTP clone URL of the repository name, without credentials.
func (s *Server) URL(name string) string {
	return s.git.HTTPAddress() + "/" + strings.TrimSuffix(name, ".git") + ".git"
}

// BackendURL is the clone URL of the repository name served, read-only, by git's own
// http-backend (the CGI program web servers run for git) instead of gittestserver:
// the git command line stalls on gittestserver's handling of shallow fetches, so a
// comparison of clients over the same server uses this one. The first call starts it.
func (s *Server) BackendURL(t testing.TB, name string) string {
	t.Helper()
	s.backendOnce.Do(func() {
		gitPath, err := exec.LookPath("git")
		if err != nil {
			s.backendErr = err
			return
		}
		h := &cgi.Handler{
			Path: gitPath,
			Args: []string{"http-backend"},
			Env:  []string{"GIT_PROJECT_ROOT=" + s.git.Root(), "GIT_HTTP_EXPORT_ALL=1"},
		}
		srv := httptest.NewServer(s.timeFetches(h))
		s.backend = srv
		t.Cleanup(srv.Close)
	})
	if s.backendErr != nil {
		t.Fatalf("starting git http-backend: %v", s.backendErr)
	}
	return s.backend.URL + "/" + strings.TrimSuffix(name, ".git") + ".git"
}

// FetchTime is how long the server has spent answering fetches so far (the ref
// listings and packs of upload-pack, over both its URLs, the start of git's processes
// included): git's own share of what its clients wait for.
func (s *Server) FetchTime() time.Duration { return time.Duration(s.fetching.Load()) }

// timeFetches adds the time h takes over each fetch's request to FetchTime.
func (s *Server) timeFetches(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/git-upload-pack") && r.URL.Query().Get("service") != "git-upload-pack" {
			h.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		h.ServeHTTP(w, r)
		s.fetching.Add(int64(time.Since(start)))
	})
}

// Repo is a repository on a Server. Its methods fail the test they were created with (through
// t.Fatal, so call them from that test's goroutine); they may be called concurrently.
type Repo struct {
	t      testing.TB
	url    string
	sshURL string
	repo   *git.Repository // the working clone
	wt     *git.Worktree
	cache  *cache.ObjectLRU // the working clone's, workCache unless SetCache changed it

	mu      sync.Mutex
	commits int // made so far, which sets the next commit's time
	signKey *openpgp.Entity
}

// NewRepo creates the bare repository name (e.g. "fleet" or "org/fleet") on the server, with a
// first commit on main, its default branch, holding every file under fromDir (except .git
// entries) with its executable bit and symlinks kept. An empty fromDir makes that first commit
// empty. The working clone lives in a temporary directory of t.
func (s *Server) NewRepo(t testing.TB, name, fromDir string) *Repo {
	t.Helper()
	r, err := s.newRepo(t, name, fromDir)
	if err != nil {
		t.Fatalf("creating repository %s: %v", name, err)
	}
	return r
}

// workCache bounds the objects a working clone keeps decoded in memory.
const workCache = 4 * cache.MiByte

func (s *Server) newRepo(t testing.TB, name, fromDir string) (*Repo, error) {
	name = strings.TrimSuffix(name, ".git")
	if name == "" || !filepath.IsLocal(name) || strings.Contains(name, `\`) {
		return nil, errors.New("name must be a relative slash-separated path")
	}
	bare := s.Path(name)
	if _, err := os.Stat(bare); err == nil {
		return nil, errors.New("it already exists")
	}
	initMain := git.InitOptions{DefaultBranch: plumbing.Main}
	if _, err := git.PlainInitWithOptions(bare, &git.PlainInitOptions{InitOptions: initMain, Bare: true}); err != nil {
		return nil, fmt.Errorf("initialising bare repository: %w", err)
	}

	work := t.TempDir()
	// The working clone keeps a small cache of objects, not go-git's default of 96 MiB:
	// the tests that measure the hub's memory share their process with it.
	wtfs := osfs.New(work)
	dot, err := wtfs.Chroot(git.GitDirName)
	if err != nil {
		return nil, fmt.Errorf("initialising working clone: %w", err)
	}
	objects := cache.NewObjectLRU(workCache)
	repo, err := git.InitWithOptions(filesystem.NewStorage(dot, objects), wtfs, initMain)
	if err != nil {
		return nil, fmt.Errorf("initialising working clone: %w", err)
	}
	wt, err := repo.Worktree()
	if err != nil {
		return nil, fmt.Errorf("opening working clone: %w", err)
	}
	r := &Repo{t: t, url: s.git.HTTPAddress() + "/" + name + ".git", repo: repo, wt: wt, cache: objects}
	if a := s.git.SSHAddress(); a != "" {
		r.sshURL = a + "/" + name + ".git"
	}
	if _, err := repo.CreateRemote(&config.RemoteConfig{Name: git.DefaultRemoteName, URLs: []string{s.remote + "/" + name + ".git"}}); err != nil {
		return nil, fmt.Errorf("adding remote: %w", err)
	}

	if fromDir != "" {
		files, err := copyTree(fromDir, work)
		if err != nil {
			return nil, fmt.Errorf("copying %s: %w", fromDir, err)
		}
		// One path at a time, since adding the whole tree would leave out what a .gitignore
		// of the template matches.
		for _, f := range files {
			if err := wt.AddWithOptions(&git.AddOptions{Path: f, SkipStatus: true}); err != nil {
				return nil, fmt.Errorf("adding %s: %w", f, err)
			}
		}
	}
	msg := "Initial commit"
	if fromDir != "" {
		msg = "Initial commit from " + filepath.Base(filepath.Clean(fromDir))
	}
	if _, err := r.commit(msg); err != nil {
		return nil, err
	}
	if err := r.push(plumbing.Main); err != nil {
		return nil, err
	}
	return r, nil
}

// URL is the repository's HTTP clone URL. It needs no credentials.
func (r *Repo) URL() string { return r.url }

// SSHURL is the repository's SSH clone URL, on a server started with StartSSH.
func (r *Repo) SSHURL() string { return r.sshURL }

// Commit makes a commit on branch, which is created from main if the server does not have it, and
// pushes it. Each entry of changes writes a file (a slash-separated path relative to the root,
// keeping the mode of a file it replaces) or, for a nil value, deletes one that exists. The
// commit is made even if it changes nothing. Commit returns its hash.
func (r *Repo) Commit(branch, msg string, changes map[string][]byte) string {
	r.t.Helper()
	sha, err := r.do(func() (string, error) {
		start, ok := r.remoteHead(branch)
		if !ok {
			if start, ok = r.remoteHead(plumbing.Main.Short()); !ok {
				return "", errors.New("the server has neither that branch nor main")
			}
		}
		if err := r.checkout(branch, start); err != nil {
			return "", err
		}
		paths := make([]string, 0, len(changes))
		for p := range changes {
			paths = append(paths, p)
		}
		slices.Sort(paths)
		for _, p := range paths {
			if err := r.apply(p, changes[p]); err != nil {
				return "", err
			}
		}
		h, err := r.commit(msg)
		if err != nil {
			return "", err
		}
		return h.String(), r.push(plumbing.NewBranchReferenceName(branch))
	})
	if err != nil {
		r.t.Fatalf("committing to %s of %s: %v", branch, r.url, err)
	}
	return sha
}

// Branch creates branch name on the server at the head of branch from, and returns that hash.
// The name must be new.
func (r *Repo) Branch(from, name string) string {
	r.t.Helper()
	sha, err := r.do(func() (string, error) {
		h, ok := r.remoteHead(from)
		if !ok {
			return "", fmt.Errorf("the server has no branch %s", from)
		}
		if _, ok := r.remoteHead(name); ok {
			return "", errors.New("it exists already")
		}
		if err := r.repo.Storer.SetReference(plumbing.NewHashReference(plumbing.NewBranchReferenceName(name), h)); err != nil {
			return "", err
		}
		return h.String(), r.push(plumbing.NewBranchReferenceName(name))
	})
	if err != nil {
		r.t.Fatalf("creating branch %s from %s of %s: %v", name, from, r.url, err)
	}
	return sha
}

// Merge merges head into base with a merge commit whose parents are base's head and head's head,
// in that order (also when base could be fast-forwarded), pushes base and returns the commit's
// hash. A file that both sides changed differently since their merge base is a conflict and
// fails the test, as does a head that base already contains.
func (r *Repo) Merge(base, head, msg string) string {
	r.t.Helper()
	sha, err := r.do(func() (string, error) { return r.merge(base, head, msg) })
	if err != nil {
		r.t.Fatalf("merging %s into %s of %s: %v", head, base, r.url, err)
	}
	return sha
}

// Rewrite replaces the head of branch with a new commit on top of the head's first
// parent, and force-pushes it: the history a force-push leaves behind. It returns the
// new commit's hash.
func (r *Repo) Rewrite(branch, msg string, changes map[string][]byte) string {
	r.t.Helper()
	sha, err := r.do(func() (string, error) {
		head, ok := r.remoteHead(branch)
		if !ok {
			return "", errors.New("no such branch")
		}
		c, err := r.repo.CommitObject(head)
		if err != nil {
			return "", err
		}
		if len(c.ParentHashes) == 0 {
			return "", errors.New("the head has no parent to rewrite onto")
		}
		if err := r.checkout(branch, c.ParentHashes[0]); err != nil {
			return "", err
		}
		for _, p := range slices.Sorted(maps.Keys(changes)) {
			if err := r.apply(p, changes[p]); err != nil {
				return "", err
			}
		}
		h, err := r.commit(msg)
		if err != nil {
			return "", err
		}
		ref := plumbing.NewBranchReferenceName(branch)
		return h.String(), r.pushRefspec(config.RefSpec("+" + ref + ":" + ref))
	})
	if err != nil {
		r.t.Fatalf("rewriting %s of %s: %v", branch, r.url, err)
	}
	return sha
}

// SetRef points ref (such as refs/pull/1/head) on the server at the head of branch, the
// way a forge publishes a pull request's head. It returns that hash.
func (r *Repo) SetRef(ref, branch string) string {
	r.t.Helper()
	sha, err := r.do(func() (string, error) {
		h, ok := r.remoteHead(branch)
		if !ok {
			return "", errors.New("no such branch")
		}
		local := plumbing.ReferenceName("refs/flotilla-test/" + strings.TrimPrefix(ref, "refs/"))
		if err := r.repo.Storer.SetReference(plumbing.NewHashReference(local, h)); err != nil {
			return "", err
		}
		return h.String(), r.pushRefspec(config.RefSpec("+" + local + ":" + plumbing.ReferenceName(ref)))
	})
	if err != nil {
		r.t.Fatalf("setting %s of %s: %v", ref, r.url, err)
	}
	return sha
}

// SignWith makes r sign its later commits with key (nil: unsigned again).
func (r *Repo) SignWith(key *openpgp.Entity) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.signKey = key
}

// NewSigningKey makes an OpenPGP key for signing commits, and returns it with its
// armored public key, the keyring a verifier trusts.
func NewSigningKey(t testing.TB, name string) (*openpgp.Entity, string) {
	t.Helper()
	e, err := openpgp.NewEntity(name, "", strings.ReplaceAll(strings.ToLower(name), " ", ".")+"@flotilla.invalid", nil)
	if err != nil {
		t.Fatalf("making a signing key: %v", err)
	}
	var buf strings.Builder
	w, err := armor.Encode(&buf, openpgp.PublicKeyType, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Serialize(w); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return e, buf.String()
}

// Head returns the hash that branch points to on the server.
func (r *Repo) Head(branch string) string {
	r.t.Helper()
	sha, err := r.do(func() (string, error) {
		h, ok := r.remoteHead(branch)
		if !ok {
			return "", errors.New("no such branch")
		}
		return h.String(), nil
	})
	if err != nil {
		r.t.Fatalf("reading head of %s of %s: %v", branch, r.url, err)
	}
	return sha
}

// SetCache bounds what the working clone keeps decoded in memory to size instead of
// workCache; zero keeps nothing more. A test that measures its own process's memory over
// thousands of commits (the soak) would otherwise see the cache take in every commit's
// trees until it holds workCache of them, thousands of commits after the caches of the
// code it measures were full.
func (r *Repo) SetCache(size cache.FileSize) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cache.MaxSize = size
}

// do runs op under the lock after fetching every branch from the server, so that op sees what
// others pushed.
func (r *Repo) do(op func() (string, error)) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	err := r.repo.FetchContext(ctx, &git.FetchOptions{
		RemoteName: git.DefaultRemoteName,
		RefSpecs:   []config.RefSpec{"+refs/heads/*:refs/remotes/origin/*"},
		Prune:      true,
	})
	if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
		return "", fmt.Errorf("fetching: %w", err)
	}
	return op()
}

func (r *Repo) remoteHead(branch string) (plumbing.Hash, bool) {
	ref, err := r.repo.Reference(plumbing.NewRemoteReferenceName(git.DefaultRemoteName, branch), true)
	if err != nil {
		return plumbing.ZeroHash, false
	}
	return ref.Hash(), true
}

// checkout points the local branch at h and makes the worktree match it exactly.
func (r *Repo) checkout(branch string, h plumbing.Hash) error {
	ref := plumbing.NewBranchReferenceName(branch)
	if err := r.repo.Storer.SetReference(plumbing.NewHashReference(ref, h)); err != nil {
		return fmt.Errorf("checking out %s: %w", branch, err)
	}
	if err := r.wt.Checkout(&git.CheckoutOptions{Branch: ref, Force: true}); err != nil {
		return fmt.Errorf("checking out %s: %w", branch, err)
	}
	if err := r.wt.Clean(&git.CleanOptions{Dir: true}); err != nil {
		return fmt.Errorf("cleaning worktree: %w", err)
	}
	return nil
}

// apply writes (or, for nil data, deletes) the file p in the worktree and stages it.
func (r *Repo) apply(p string, data []byte) error {
	if !validPath(p) {
		return fmt.Errorf("invalid path %q: want a clean slash-separated relative path outside .git", p)
	}
	full := filepath.Join(r.wt.Filesystem.Root(), filepath.FromSlash(p))
	if data == nil {
		if _, err := os.Lstat(full); err != nil {
			return fmt.Errorf("deleting %s: %w", p, err)
		}
		if _, err := r.wt.Remove(p); err != nil {
			return fmt.Errorf("deleting %s: %w", p, err)
		}
		return nil
	}
	mode := os.FileMode(0o644)
	if fi, err := os.Lstat(full); err == nil && fi.Mode().IsRegular() {
		mode = fi.Mode().Perm()
	}
	if err := writeFile(full, data, mode); err != nil {
		return fmt.Errorf("writing %s: %w", p, err)
	}
	if err := r.wt.AddWithOptions(&git.AddOptions{Path: p, SkipStatus: true}); err != nil {
		return fmt.Errorf("adding %s: %w", p, err)
	}
	return nil
}

func validPath(p string) bool {
	if p == "" || path.Clean(p) != p || !filepath.IsLocal(filepath.FromSlash(p)) || strings.Contains(p, `\`) {
		return false
	}
	return strings.Split(p, "/")[0] != ".git"
}

// commit commits the index with the next time of r's clock and the given parents (none: HEAD).
func (r *Repo) commit(msg string, parents ...plumbing.Hash) (plumbing.Hash, error) {
	sig := author
	sig.When = epoch.Add(time.Duration(r.commits) * time.Minute)
	h, err := r.wt.Commit(msg, &git.CommitOptions{
		Author:            &sig,
		Committer:         &sig,
		Parents:           parents,
		AllowEmptyCommits: true,
		SignKey:           r.signKey,
	})
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("committing: %w", err)
	}
	r.commits++
	return h, nil
}

// push pushes the local branch ref to the server, refusing anything but a fast-forward.
func (r *Repo) push(ref plumbing.ReferenceName) error {
	return r.pushRefspec(config.RefSpec(ref + ":" + ref))
}

func (r *Repo) pushRefspec(spec config.RefSpec) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	err := r.repo.PushContext(ctx, &git.PushOptions{
		RemoteName: git.DefaultRemoteName,
		RefSpecs:   []config.RefSpec{spec},
	})
	if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
		return fmt.Errorf("pushing %s: %w", spec, err)
	}
	return nil
}

// entry is a file of a tree: what git compares to tell whether it changed.
type entry struct {
	hash plumbing.Hash
	mode filemode.FileMode
}

func (r *Repo) merge(base, head, msg string) (string, error) {
	bh, ok := r.remoteHead(base)
	if !ok {
		return "", fmt.Errorf("the server has no branch %s", base)
	}
	hh, ok := r.remoteHead(head)
	if !ok {
		return "", fmt.Errorf("the server has no branch %s", head)
	}
	ours, err := r.repo.CommitObject(bh)
	if err != nil {
		return "", err
	}
	theirs, err := r.repo.CommitObject(hh)
	if err != nil {
		return "", err
	}
	if merged, err := theirs.IsAncestor(ours); err != nil {
		return "", err
	} else if merged || bh == hh {
		return "", fmt.Errorf("%s already contains %s", base, head)
	}
	bases, err := ours.MergeBase(theirs)
	if err != nil {
		return "", fmt.Errorf("finding merge base: %w", err)
	}
	if len(bases) == 0 {
		return "", errors.New("the branches have no common ancestor")
	}

	var trees [3]map[string]entry
	for i, c := range []*object.Commit{bases[0], ours, theirs} {
		if trees[i], err = files(c); err != nil {
			return "", err
		}
	}
	old, mine, their := trees[0], trees[1], trees[2]

	if err := r.checkout(base, bh); err != nil {
		return "", err
	}
	theirTree, err := theirs.Tree()
	if err != nil {
		return "", err
	}
	// Only what head changed since the merge base needs applying; a conflict is a path both
	// sides changed, to different results.
	var conflicts []string
	for _, p := range union(old, their) {
		o, inOld := old[p]
		t, inTheir := their[p]
		m, inMine := mine[p]
		if inOld == inTheir && o == t {
			continue
		}
		if inMine == inTheir && m == t {
			continue
		}
		if inMine != inOld || m != o {
			conflicts = append(conflicts, p)
			continue
		}
		if !inTheir {
			if _, err := r.wt.Remove(p); err != nil {
				return "", fmt.Errorf("deleting %s: %w", p, err)
			}
			continue
		}
		if err := r.writeBlob(theirTree, p, t.mode); err != nil {
			return "", err
		}
	}
	if len(conflicts) > 0 {
		return "", fmt.Errorf("conflicts in %s", strings.Join(conflicts, ", "))
	}
	h, err := r.commit(msg, bh, hh)
	if err != nil {
		return "", err
	}
	return h.String(), r.push(plumbing.NewBranchReferenceName(base))
}

// writeBlob writes file p of tree into the worktree with its mode and stages it.
func (r *Repo) writeBlob(tree *object.Tree, p string, mode filemode.FileMode) error {
	f, err := tree.File(p)
	if err != nil {
		return fmt.Errorf("reading %s: %w", p, err)
	}
	data, err := f.Contents()
	if err != nil {
		return fmt.Errorf("reading %s: %w", p, err)
	}
	full := filepath.Join(r.wt.Filesystem.Root(), filepath.FromSlash(p))
	if err := os.RemoveAll(full); err != nil {
		return fmt.Errorf("writing %s: %w", p, err)
	}
	switch mode {
	case filemode.Symlink:
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
		err = os.Symlink(data, full)
	case filemode.Executable:
		err = writeFile(full, []byte(data), 0o755)
	case filemode.Regular, filemode.Deprecated:
		err = writeFile(full, []byte(data), 0o644)
	default:
		err = fmt.Errorf("unsupported mode %v", mode)
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", p, err)
	}
	if err := r.wt.AddWithOptions(&git.AddOptions{Path: p, SkipStatus: true}); err != nil {
		return fmt.Errorf("adding %s: %w", p, err)
	}
	return nil
}

// files maps each file of c's tree to its blob and mode.
func files(c *object.Commit) (map[string]entry, error) {
	tree, err := c.Tree()
	if err != nil {
		return nil, fmt.Errorf("reading tree of %s: %w", c.Hash, err)
	}
	m := map[string]entry{}
	err = tree.Files().ForEach(func(f *object.File) error {
		m[f.Name] = entry{hash: f.Hash, mode: f.Mode}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading tree of %s: %w", c.Hash, err)
	}
	return m, nil
}

func union(a, b map[string]entry) []string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// writeFile writes data to name with exactly mode, making parent directories as needed.
func writeFile(name string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(name, data, mode); err != nil {
		return err
	}
	return os.Chmod(name, mode) // WriteFile leaves the mode of an existing file alone
}

// copyTree copies the files and symlinks under src into dst, skipping .git entries, and returns
// their slash-separated paths relative to dst.
func copyTree(src, dst string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Name() == ".git" && p != src {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case info.Mode()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if err := writeFile(target, data, info.Mode().Perm()); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s is neither a file, a directory nor a symlink", p)
		}
		out = append(out, filepath.ToSlash(rel))
		return nil
	})
	return out, err
}
