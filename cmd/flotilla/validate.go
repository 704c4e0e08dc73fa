package main

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"strings"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/spf13/cobra"

	"github.com/flotilla-gitops/flotilla/gitsource"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/render"
	"github.com/flotilla-gitops/flotilla/secrets"
)

func newValidateCommand() *cobra.Command {
	var ageKey, ref string
	var budget fleet.Budget
	cmd := &cobra.Command{
		Use:   "validate [DIR]",
		Short: "Check a fleet repository the way the hub will",
		Long: "validate loads the fleet repository in DIR (default: the current directory),\n" +
			"checks every file, renders every cluster and scans every file that git would\n" +
			"track for plaintext enrollment tokens. With --age-key it also decrypts every\n" +
			"enrollment file with the hub's age identities and checks its MAC and token.\n" +
			"With --ref it checks a commit of the git repository DIR is in, read from git's\n" +
			"objects exactly as the hub reads a branch or pull request head (symbolic links,\n" +
			"the hub's budget of bytes, files and depth), instead of the files in DIR: in CI,\n" +
			"--ref HEAD checks what was committed, not what the checkout made of it.\n" +
			"Each problem is printed as file:line:column: message; the exit status is 1 when\n" +
			"there is any.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := dirArg(args)
			var dec *secrets.Decryptor
			if ageKey != "" {
				ids, err := readIdentities(ageKey)
				if err != nil {
					return err
				}
				dec = secrets.NewDecryptor(secrets.DecryptorOptions{Identities: ids})
			}
			var fsys fs.FS
			var err error
			label := dir
			if ref != "" {
				var commit string
				if fsys, commit, err = openRef(dir, ref); err != nil {
					return err
				}
				label = fmt.Sprintf("%s at %s (%s)", dir, ref, commit[:12])
			} else if fsys, err = openDir(dir); err != nil {
				return err
			}
			f := fleet.LoadWith(fsys, fleet.LoadOptions{Budget: budget})
			errs := f.AllErrors()
			r := render.New()
			valid := 0
			for _, name := range f.ClusterNames() {
				c := f.Clusters[name]
				if dec != nil && c.Enrollment() != nil && !hasErrorIn(c.Errors, path.Join(c.Dir, fleet.EnrollmentFile)) {
					errs = append(errs, checkEnrollment(cmd, dec, c)...)
				}
				if !f.Valid() || !c.Valid() {
					continue
				}
				if _, err := r.Render(f, name); err != nil {
					errs = append(errs, asErrorList(err, name)...)
					continue
				}
				valid++
			}
			// A head over its budget is refused whole, and a cluster directory over its
			// own fails: reading them for tokens would cost what the budgets are there
			// to refuse.
			if !f.OverBudget() {
				unread := map[string]bool{}
				for _, name := range f.ClusterNames() {
					if c := f.Clusters[name]; c.OverBudget() {
						unread[c.Dir] = true
					}
				}
				var leaks fleet.ErrorList
				if ref != "" {
					leaks, err = scanTree(fsys, unread)
				} else {
					leaks, err = scanForTokens(dir, f, unread)
				}
				if err != nil {
					return err
				}
				errs = append(errs, leaks...)
			}
			if len(errs) > 0 {
				errs.Sort()
				for _, e := range errs {
					fmt.Fprintln(cmd.ErrOrStderr(), e.Error())
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "%s: %d %s\n", label, len(errs), plural(len(errs), "error", "errors"))
				return errReported
			}
			decrypted := ""
			if dec != nil {
				decrypted = ", every enrollment file decrypted"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: fleet %q is valid: %d %s, %d %s%s\n", label, f.Spec.Spec.Tenant,
				valid, plural(valid, "cluster", "clusters"), len(f.Presets), plural(len(f.Presets), "preset", "presets"), decrypted)
			return nil
		},
	}
	cmd.Flags().StringVar(&ageKey, "age-key", "", "age key file of the hub: decrypt and check every enrollment file")
	// The hub's configuration may set other budgets than the defaults (heads: in its
	// file); CI checks against the same numbers.
	cmd.Flags().Int64Var(&budget.MaxBytes, "max-bytes", fleet.DefaultMaxBytes, "the hub's heads.maxBytes: file content of the head, every path counted")
	cmd.Flags().IntVar(&budget.MaxFiles, "max-files", fleet.DefaultMaxFiles, "the hub's heads.maxFiles: files, directories and links followed")
	cmd.Flags().IntVar(&budget.MaxDepth, "max-depth", fleet.DefaultMaxDepth, "the hub's heads.maxDepth: elements of a path")
	cmd.Flags().Int64Var(&budget.MaxClusterBytes, "max-cluster-bytes", fleet.DefaultMaxClusterBytes, "the hub's heads.maxClusterBytes: file content of one cluster directory")
	cmd.Flags().IntVar(&budget.MaxClusterFiles, "max-cluster-files", fleet.DefaultMaxClusterFiles, "the hub's heads.maxClusterFiles: files, directories and links followed of one cluster directory")
	cmd.Flags().StringVar(&ref, "ref", "", "check this commit (branch, tag, hash, HEAD~1, ...) of the repository DIR is in, as the hub reads it, instead of DIR's files")
	return cmd
}

func readIdentities(file string) (*secrets.Identities, error) {
	fh, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	ids, err := secrets.ParseIdentities(file, fh)
	if err != nil {
		return nil, err
	}
	if ids.Len() == 0 {
		return nil, fmt.Errorf("%s holds no age identity", file)
	}
	return ids, nil
}

func checkEnrollment(cmd *cobra.Command, dec *secrets.Decryptor, c *fleet.Cluster) fleet.ErrorList {
	file := path.Join(c.Dir, fleet.EnrollmentFile)
	if _, err := dec.TokenHash(cmd.Context(), file, c.Enrollment()); err != nil {
		msg := err.Error()
		var fe *secrets.FileError
		if errors.As(err, &fe) {
			msg = fe.Reason()
		}
		return fleet.ErrorList{{File: file, Cluster: c.Name, Message: msg}}
	}
	return nil
}

func hasErrorIn(list fleet.ErrorList, file string) bool {
	for _, e := range list {
		if e.File == file {
			return true
		}
	}
	return false
}

// scanForTokens reports plaintext tokens in every file git would track: the .git
// directory and ignored files, such as the agent's values files, are left out, and so
// are the directories unread. The files of the presets and clusters of f, loaded from
// dir, are scanned as f holds them, not read again.
func scanForTokens(dir string, f *fleet.Fleet, unread map[string]bool) (fleet.ErrorList, error) {
	ignored := readGitIgnore(dir)
	loaded := loadedCheckout{ReadDirFS: fleet.DirFS(dir).(fs.ReadDirFS), files: map[string][]byte{}}
	for _, p := range f.Presets {
		maps.Copy(loaded.files, p.Files)
	}
	for _, c := range f.Clusters {
		maps.Copy(loaded.files, c.Files)
	}
	leaks, err := secrets.ScanFS(loaded, func(p string, isDir bool) bool {
		return p == ".git" || unread[p] || ignored.walked(p, isDir)
	})
	if err != nil {
		return nil, err
	}
	return leakErrors(leaks), nil
}

// loadedCheckout is a checkout whose fleet was loaded: the scan for tokens reads the
// files the loader read from what it read (secrets.CachedFS).
type loadedCheckout struct {
	fs.ReadDirFS
	files map[string][]byte
}

func (c loadedCheckout) Cached(name string) ([]byte, bool) {
	data, ok := c.files[name]
	return data, ok
}

// scanTree reports plaintext tokens in every file of a commit but those of the
// directories unread: all of them are tracked. A directory that cannot be read, as one
// holding an entry named "..", is an error of its own, and the scan goes on with the
// rest.
func scanTree(fsys fs.FS, unread map[string]bool) (fleet.ErrorList, error) {
	var unreadable fleet.ErrorList
	leaks, err := secrets.ScanFS(fsys, func(p string, isDir bool) bool {
		if !isDir {
			return false
		}
		if unread[p] {
			return true
		}
		if _, err := fs.ReadDir(fsys, p); err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			unreadable = append(unreadable, fleet.Error{File: p, Message: fmt.Sprintf("cannot scan for plaintext tokens: %v", err)})
			return true
		}
		return false
	})
	if err != nil {
		return nil, err
	}
	return append(unreadable, leakErrors(leaks)...), nil
}

func leakErrors(leaks []secrets.Leak) fleet.ErrorList {
	var list fleet.ErrorList
	for _, l := range leaks {
		list = append(list, fleet.Error{File: l.File, Line: l.Line, Column: l.Column, Message: l.Message()})
	}
	return list
}

func dirArg(args []string) string {
	if len(args) == 1 {
		return args[0]
	}
	return "."
}

// loadDir loads a fleet repository from disk. Only a missing directory is an error
// here; everything wrong inside it is in the fleet's error list.
func loadDir(dir string) (*fleet.Fleet, error) {
	fsys, err := openDir(dir)
	if err != nil {
		return nil, err
	}
	return fleet.Load(fsys), nil
}

func openDir(dir string) (fs.FS, error) {
	info, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", dir)
	}
	return fleet.DirFS(dir), nil
}

// openRef reads the commit rev of the git repository that dir is in, through the same
// TreeFS the hub reads heads with, and returns it with the commit's hash. When dir is a
// directory below the repository's root, the commit's directory of that path is read.
func openRef(dir, rev string) (fs.FS, string, error) {
	repo, err := git.PlainOpenWithOptions(dir, &git.PlainOpenOptions{DetectDotGit: true, EnableDotGitCommonDir: true})
	if err != nil {
		return nil, "", fmt.Errorf("--ref: opening the git repository of %s: %w", dir, err)
	}
	h, err := repo.ResolveRevision(plumbing.Revision(rev))
	if err != nil {
		return nil, "", fmt.Errorf("--ref: %s: %w", rev, err)
	}
	c, err := repo.CommitObject(*h)
	if err != nil {
		return nil, "", fmt.Errorf("--ref: %s is not a commit: %w", rev, err)
	}
	tree, err := c.Tree()
	if err != nil {
		return nil, "", fmt.Errorf("--ref: reading the tree of %s: %w", h, err)
	}
	sub, err := subdirOfWorktree(repo, dir)
	if err != nil {
		return nil, "", err
	}
	if sub != "." {
		if tree, err = tree.Tree(sub); err != nil {
			return nil, "", fmt.Errorf("--ref: %s has no directory %s: %w", rev, sub, err)
		}
	}
	return gitsource.NewTreeFS(repo.Storer, tree.Hash), h.String(), nil
}

// subdirOfWorktree is dir's slash-separated path from the root of repo's worktree; "."
// for the root itself and for a repository without a worktree.
func subdirOfWorktree(repo *git.Repository, dir string) (string, error) {
	wt, err := repo.Worktree()
	if errors.Is(err, git.ErrIsBareRepository) {
		return ".", nil
	}
	if err != nil {
		return "", fmt.Errorf("--ref: %w", err)
	}
	root, err := filepath.EvalSymlinks(wt.Filesystem.Root())
	if err != nil {
		return "", fmt.Errorf("--ref: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return "", fmt.Errorf("--ref: %w", err)
	}
	rel, err := filepath.Rel(root, abs)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("--ref: %s is outside the repository's worktree %s", dir, root)
	}
	return filepath.ToSlash(rel), nil
}

func asErrorList(err error, cluster string) fleet.ErrorList {
	if list, ok := err.(fleet.ErrorList); ok {
		return list
	}
	return fleet.ErrorList{{File: fleet.ClustersDir + "/" + cluster, Cluster: cluster, Message: err.Error()}}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
