package scale

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/storage/memory"

	"github.com/flotilla-gitops/flotilla/test/gitserver"
	"github.com/flotilla-gitops/flotilla/test/gittree"
)

// newFleetRepo creates the repository name on srv holding files. The git server's
// working clone stages one file at a time, reading and writing its whole index each
// time, which for the twenty thousand files of ten thousand clusters takes hours: the
// first commit holds what is outside clusters/, and a second one, written straight
// into the bare repository's object store, holds the whole fleet.
func newFleetRepo(tb testing.TB, srv *gitserver.Server, name string, files fstest.MapFS, writeDir func(fstest.MapFS) string) *gitserver.Repo {
	tb.Helper()
	rest := fstest.MapFS{}
	for p, f := range files {
		if !strings.HasPrefix(p, "clusters/") {
			rest[p] = f
		}
	}
	repo := srv.NewRepo(tb, name, writeDir(rest))
	if err := commitAll(srv.Path(name), files); err != nil {
		tb.Fatalf("adding clusters/ to %s: %v", name, err)
	}
	return repo
}

// commitAll commits files as the whole tree on main of the bare repository at bare, in
// one pack: a forge holds a pushed fleet that way (a push of more than a hundred objects
// is kept as its pack), and as some thirty thousand loose objects it would cost
// upload-pack a file read for every tree of a shallow client's last commit, on every
// fetch.
func commitAll(bare string, files fstest.MapFS) error {
	r, err := git.PlainOpen(bare)
	if err != nil {
		return err
	}
	ref, err := r.Reference(plumbing.NewBranchReferenceName("main"), true)
	if err != nil {
		return err
	}
	objs := memory.NewStorage()
	h, err := gittree.WriteCommit(objs, gittree.FromMapFS(files), "add the clusters\n", ref.Hash())
	if err != nil {
		return err
	}
	hashes := slices.Collect(maps.Keys(objs.Objects))
	pw, ok := r.Storer.(storer.PackfileWriter)
	if !ok {
		return errors.New("the repository's storage writes no packs")
	}
	w, err := pw.PackfileWriter()
	if err != nil {
		return err
	}
	if _, err := packfile.NewEncoder(w, objs, false).Encode(hashes, 10); err != nil {
		w.Close()
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	return r.Storer.SetReference(plumbing.NewHashReference(ref.Name(), h))
}
