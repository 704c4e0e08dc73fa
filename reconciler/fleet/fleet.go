// Package fleet loads a fleet repository: fleet.yaml, the scheduling presets and one
// directory per worker cluster. It validates every file with errors that name the file,
// line and column a fleet owner has to change, and it keeps going past a broken cluster
// so that one bad directory never takes the rest of the fleet down with it.
//
// The loader reads through io/fs, so a checkout on disk and a tree inside a Git commit
// are the same to it. It reads at most a Budget of every head (bytes, entries and depth,
// each charged before it is read) and validates nothing until the whole head is read. A
// head over budget is a broken fleet as a whole, like a broken fleet.yaml: Errors says
// which budget it broke and where, nothing of it but fleet.yaml is validated or kept,
// and nothing of it may be rendered or taken as removed.
//
// It also says what a change between two heads means (Change.Affected): a Git source
// names the changed paths, and the fleet's layout decides which clusters they touch,
// or that every cluster does.
package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strings"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// Well-known paths of a fleet repository.
const (
	FleetFile                  = "fleet.yaml"
	PresetsDir                 = "presets"
	ClustersDir                = "clusters"
	ClusterFile                = "cluster.yaml"
	EnrollmentFile             = "enrollment.sops.yaml"
	KustomizationFile          = "kustomization.yaml"
	DefaultStatusContextPrefix = "flotilla"
)

// The commit-status contexts of the fleet's summary and of a pull request's plan, after
// the fleet's prefix as each cluster's is: no cluster directory may take their names.
const (
	SummaryContextName = "fleet"
	PlanContextName    = "plan"
)

// Fleet is a fleet repository as loaded from one tree.
type Fleet struct {
	// Spec is fleet.yaml; nil when it is missing or could not be decoded.
	Spec *v1alpha1.Fleet
	// Presets by name. A preset with errors is kept so that clusters can point at them.
	Presets map[string]*Preset
	// Clusters by directory name, valid or not.
	Clusters map[string]*Cluster
	// Errors are the problems of fleet.yaml and of the presets, and the budget the
	// head broke.
	Errors ErrorList

	// budget is what Load and LoadCluster may read of this head.
	budget Budget
	// used is what the head cost: fleet.yaml, presets/, the listing of clusters/ and
	// every cluster's own cost.
	used usage
	// truncated is the budget Load found broken: then no cluster was read.
	truncated *Error
	// overBudget are the clusters LoadCluster could not read within the budget.
	overBudget map[string]*Error
	// exceeded is the budget error in Errors, so that LoadCluster can replace it.
	exceeded *Error
	// incomplete is set when clusters/ is there but could not be listed whole.
	incomplete bool
	// kustomize indexes the presets for validating kustomizations, once per load.
	kustomize *presetIndex
	// linked are the paths that fleet.yaml and the presets lead to through symbolic
	// links, and linking the clusters whose files do (see Cluster.linked).
	linked  []string
	linking map[string]bool
	// misnamed are the clusters whose worker name is not their directory's: with the
	// directory of a name, the only ones that can claim it, so that LoadCluster checks
	// a name without walking every cluster of the fleet.
	misnamed map[string]bool
}

// Preset is a kustomize base under presets/<name>.
type Preset struct {
	Name string
	// Files of presets/<name>, keyed by path from the repository's root.
	Files map[string][]byte
	// Digest changes whenever any file of the preset does.
	Digest string
	Errors ErrorList
}

// Cluster is one directory under clusters/.
type Cluster struct {
	// Name is the directory's name, which is also the worker's name.
	Name string
	// Dir is clusters/<name>.
	Dir string
	// Object is cluster.yaml; nil when it is missing or could not be decoded.
	Object *v1alpha1.WorkerCluster
	// Files of the directory, keyed by path from the repository's root.
	Files map[string][]byte
	// Digest changes whenever any file of the directory does.
	Digest string
	// Errors are this cluster's problems, including those of the preset it uses.
	Errors ErrorList

	// nameLine and nameColumn place metadata.name in cluster.yaml.
	nameLine, nameColumn int
	// used is what reading the directory cost the head's budget.
	used usage
	// overBudget is set when the directory broke the cluster's own budget: then it
	// holds no files, and Errors says which budget.
	overBudget bool
	// linked are the paths the directory's symbolic links lead to: a change there is a
	// change to the cluster, wherever it lies.
	linked []string
}

// Valid reports whether the cluster can be rendered and enrolled.
func (c *Cluster) Valid() bool { return c.Object != nil && len(c.Errors) == 0 }

// OverBudget reports whether the directory broke the cluster's own budget (see Budget):
// then it holds no files, and Errors says which budget and where. Whatever else reads
// the directory should not read it either.
func (c *Cluster) OverBudget() bool { return c.overBudget }

// Enrollment is the raw, still encrypted enrollment file.
func (c *Cluster) Enrollment() []byte { return c.Files[path.Join(c.Dir, EnrollmentFile)] }

// Overlay is the cluster's kustomization.yaml, or nil when it has none.
func (c *Cluster) Overlay() []byte { return c.Files[path.Join(c.Dir, KustomizationFile)] }

// Valid reports whether fleet.yaml and every preset loaded without error, within the
// head's budget.
func (f *Fleet) Valid() bool { return f.Spec != nil && len(f.Errors) == 0 }

// OverBudget reports whether the head broke its Budget; Errors then says which. Such a
// head is broken as a whole: each cluster directory that was not read has only an error
// saying so (see Incomplete for when even the directories are unknown).
func (f *Fleet) OverBudget() bool { return f.exceeded != nil }

// Incomplete reports whether clusters/ may hold directories that Clusters lacks: its
// listing alone broke the head's budget, or clusters/ is there but could not be listed
// (a symbolic link, a loop). Errors says why. A cluster missing from an incomplete fleet
// must not be taken as removed.
func (f *Fleet) Incomplete() bool { return f.incomplete }

// StatusContextPrefix is the commit-status context prefix, defaulted.
func (f *Fleet) StatusContextPrefix() string {
	if f.Spec == nil || f.Spec.Spec.StatusContextPrefix == "" {
		return DefaultStatusContextPrefix
	}
	return f.Spec.Spec.StatusContextPrefix
}

// StatesStatusContextPrefix reports whether fleet.yaml decoded and its prefix, defaulted,
// is one a commit status can carry. A hub keeps the prefix of the last head that did
// otherwise: a fleet.yaml broken by a typo fails under the contexts the repository's
// required checks wait for, not under the default's.
func (f *Fleet) StatesStatusContextPrefix() bool {
	return f.Spec != nil && validStatusContextPrefix(f.Spec.Spec.StatusContextPrefix)
}

// validStatusContextPrefix reports whether p fits in a commit status's context, with
// room for a cluster's name after it, as a single word.
func validStatusContextPrefix(p string) bool {
	return len(p) <= 100 && !strings.ContainsAny(p, " \t\n")
}

// DecommissionPolicy is what a worker keeps when its cluster leaves the fleet,
// defaulted to pruning.
func (f *Fleet) DecommissionPolicy() v1alpha1.DecommissionPolicy {
	if f.Spec == nil || f.Spec.Spec.Decommission == "" {
		return v1alpha1.DecommissionPrune
	}
	return f.Spec.Spec.Decommission
}

// AllErrors is every problem of the fleet and its clusters, sorted by file and line.
func (f *Fleet) AllErrors() ErrorList {
	all := slices.Clone(f.Errors)
	for _, name := range f.ClusterNames() {
		all = append(all, f.Clusters[name].Errors...)
	}
	all.Sort()
	return slices.Compact(all)
}

// PresetNames returns the names of all presets, sorted.
func (f *Fleet) PresetNames() []string { return slices.Sorted(maps.Keys(f.Presets)) }

// ClusterNames returns the names of all clusters, sorted.
func (f *Fleet) ClusterNames() []string { return slices.Sorted(maps.Keys(f.Clusters)) }

// LoadOptions change how Load reads a head.
type LoadOptions struct {
	// Budget bounds what is read of the head; fields left zero take DefaultBudget's.
	Budget Budget
}

// Load reads and validates the fleet repository at the root of fsys within
// DefaultBudget.
func Load(fsys fs.FS) *Fleet { return LoadWith(fsys, LoadOptions{}) }

// LoadWith reads and validates the fleet repository at the root of fsys with opts.
// LoadCluster keeps to the same budget.
func LoadWith(fsys fs.FS, opts LoadOptions) *Fleet {
	f := &Fleet{Presets: map[string]*Preset{}, Clusters: map[string]*Cluster{}, budget: opts.Budget.withDefaults()}
	m := &meter{budget: f.budget}
	// fleet.yaml is read even past a broken budget, as long as it fits in it: the
	// tenant and the status context prefix say where to report the head as broken.
	if problems, ok := admit(fsys, FleetFile, m, &f.linked); ok && problems != nil {
		f.Errors = append(f.Errors, problems...)
	} else if ok {
		f.Spec = loadFleetFile(fsys, &f.Errors)
	}
	fleetFileErrors := len(f.Errors)
	// The whole head is read before any of it is validated, so that a head over its
	// budget costs no more than reading the budget's worth: clusters/ is listed first,
	// so that each of its directories is there, read or not.
	var listing ErrorList
	names, listed := listDirs(fsys, ClustersDir, &listing, m)
	f.incomplete = !listed
	f.readPresets(fsys, m)
	for _, name := range names {
		if m.broken != nil {
			break
		}
		f.readCluster(fsys, name, m)
	}
	f.used = m.used
	if m.broken != nil {
		f.truncated = m.broken
		f.Errors = f.Errors[:fleetFileErrors]
		f.Presets = map[string]*Preset{}
		f.Clusters = make(map[string]*Cluster, len(names))
		for _, name := range names {
			f.Clusters[name] = notRead(name, m.broken)
		}
		f.setExceeded()
		return f
	}
	f.validatePresets()
	f.Errors = append(f.Errors, listing...)
	for _, name := range names {
		f.checkCluster(f.Clusters[name])
	}
	f.checkUniqueNames()
	return f
}

// notRead stands for a cluster directory that exists but was not read because the head
// broke its budget.
func notRead(name string, broken *Error) *Cluster {
	dir := path.Join(ClustersDir, name)
	return &Cluster{Name: name, Dir: dir, Files: map[string][]byte{}, Digest: digest(nil), Errors: ErrorList{{
		File: dir, Cluster: name, Message: fmt.Sprintf("not read: the head broke the hub's budget at %s", broken.File),
	}}}
}

// setExceeded puts the budget error the head breaks now at the head of Errors, in place
// of the one there before.
func (f *Fleet) setExceeded() {
	if f.exceeded != nil {
		f.Errors = slices.DeleteFunc(f.Errors, func(e Error) bool { return e == *f.exceeded })
	}
	f.exceeded = f.truncated
	if f.exceeded == nil && len(f.overBudget) > 0 {
		first := slices.Min(slices.Collect(maps.Keys(f.overBudget)))
		f.exceeded = f.overBudget[first]
	}
	if f.exceeded != nil {
		// First, as a head over budget is broken first of all for that.
		f.Errors = append(ErrorList{*f.exceeded}, f.Errors...)
	}
	if len(f.Errors) == 0 {
		f.Errors = nil
	}
}

// LoadCluster re-reads one cluster directory against the fleet.yaml and presets already
// loaded, so that a change to one cluster costs the same whatever the fleet's size. A
// directory that no longer exists removes the cluster.
func (f *Fleet) LoadCluster(fsys fs.FS, name string) *Cluster {
	// The worker names the old and the new directory claim are checked again, so that a
	// clash that is gone no longer fails the cluster it was reported on.
	var claimed []string
	if old := f.Clusters[name]; old != nil && old.Object != nil {
		claimed = append(claimed, old.Object.Name)
	}
	var old usage
	if c := f.Clusters[name]; c != nil {
		old = c.used
	}
	delete(f.Clusters, name)
	delete(f.overBudget, name)
	delete(f.linking, name)
	delete(f.misnamed, name)
	f.used = usage{files: f.used.files - old.files, bytes: f.used.bytes - old.bytes}
	dir := path.Join(ClustersDir, name)
	var c *Cluster
	switch {
	case !isDir(fsys, dir):
	case f.truncated != nil:
		// The head was not read past its budget: whether this directory would fit in
		// it is unknown until the head is loaded again.
		c = notRead(name, f.truncated)
		f.Clusters[name] = c
	default:
		// The rest of the head keeps what it used; this directory gets what is left.
		m := &meter{budget: f.budget, used: f.used}
		c = f.readCluster(fsys, name, m)
		f.used = m.used
		if m.broken == nil {
			f.checkCluster(c)
		} else {
			used := c.used
			c = notRead(name, m.broken)
			c.used = used
			f.Clusters[name] = c
			if f.overBudget == nil {
				f.overBudget = map[string]*Error{}
			}
			f.overBudget[name] = m.broken
		}
		if c.Object != nil {
			claimed = append(claimed, c.Object.Name)
		}
	}
	f.setExceeded()
	if len(claimed) > 0 {
		f.checkUniqueNames(claimed...)
	}
	return c
}

// isDir reports whether p is a directory and not a symbolic link to one, which Load
// does not read as a cluster either.
func isDir(fsys fs.FS, p string) bool {
	info, err := lstat(fsys, p)
	return err == nil && info.IsDir()
}

// readCluster reads one cluster directory, charged to m, into Clusters. When the head's
// budget breaks, it is left half read, for the caller to replace. A directory over the
// cluster's own budget keeps only the error that says so: it fails alone, and what it
// read until then stays charged to the head.
func (f *Fleet) readCluster(fsys fs.FS, name string, m *meter) *Cluster {
	c := &Cluster{Name: name, Dir: path.Join(ClustersDir, name), Files: map[string][]byte{}}
	f.Clusters[name] = c
	e := errs{file: c.Dir, cluster: name, list: &c.Errors}
	cm := m.cluster()
	readTree(fsys, c.Dir, e, c.Files, cm, &c.linked)
	if len(c.linked) > 0 {
		if f.linking == nil {
			f.linking = map[string]bool{}
		}
		f.linking[name] = true
	}
	// What the directory's meter charged, the head's charged too.
	c.used = cm.used
	if cm.broken != nil && m.broken == nil {
		broken := *cm.broken
		broken.Cluster = name
		c.Files, c.Errors, c.overBudget = map[string][]byte{}, ErrorList{broken}, true
	}
	return c
}

// checkCluster validates a cluster read whole.
func (f *Fleet) checkCluster(c *Cluster) {
	c.Digest = digest(c.Files)
	if c.overBudget {
		// Nothing of it was kept to validate; its error says why.
		return
	}
	validateCluster(f, c)
	if c.Object != nil && c.Object.Name != "" && c.Object.Name != c.Name {
		if f.misnamed == nil {
			f.misnamed = map[string]bool{}
		}
		f.misnamed[c.Name] = true
	}
}

// readPresets reads every preset directory, charged to m, into Presets.
func (f *Fleet) readPresets(fsys fs.FS, m *meter) {
	names, _ := listDirs(fsys, PresetsDir, &f.Errors, m)
	for _, name := range names {
		p := &Preset{Name: name, Files: map[string][]byte{}}
		dir := path.Join(PresetsDir, name)
		e := errs{file: dir, list: &p.Errors}
		readTree(fsys, dir, e, p.Files, m, &f.linked)
		if m.broken != nil {
			return
		}
		p.Digest = digest(p.Files)
		f.Presets[name] = p
	}
}

func (f *Fleet) validatePresets() {
	for _, name := range slices.Sorted(maps.Keys(f.Presets)) {
		validatePreset(f, f.Presets[name])
		f.Errors = append(f.Errors, f.Presets[name].Errors...)
	}
}

// listDirs lists the directories directly below dir, charging m for the listing, and
// reports whether dir was listed whole. A missing dir is an empty list: a fleet without
// clusters is a valid fleet. A dir that is there but cannot be listed, a symbolic link
// among them, is an error: taken for a missing one, it would make every cluster look
// removed.
func listDirs(fsys fs.FS, dir string, list *ErrorList, m *meter) ([]string, bool) {
	if m.broken != nil {
		return nil, false
	}
	e := errs{file: dir, list: list}
	info, err := lstat(fsys, dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, true
	case err != nil:
		e.whole("cannot read directory: %v", unwrapPathError(err))
		return nil, false
	case info.Mode()&fs.ModeSymlink != 0:
		if _, info, ok := resolve(fsys, dir, e, m, nil); ok && info.IsDir() {
			e.whole("symbolic links to directories are not supported")
		} else if ok {
			e.whole("cannot read directory: not a directory")
		}
		return nil, false
	case !info.IsDir():
		e.whole("cannot read directory: not a directory")
		return nil, false
	}
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		e.whole("cannot read directory: %v", unwrapPathError(err))
		return nil, false
	}
	if !m.list(dir, len(entries)) {
		return nil, false
	}
	var names []string
	for _, ent := range entries {
		p := path.Join(dir, ent.Name())
		switch {
		case ent.IsDir():
			names = append(names, ent.Name())
		case ent.Type()&fs.ModeSymlink != 0:
			e := errs{file: p, list: list}
			if _, info, ok := resolve(fsys, p, e, m, nil); ok && info.IsDir() {
				e.whole("symbolic links to directories are not supported")
			}
		}
	}
	return names, true
}

// lstat is Lstat where fsys can tell links apart, Stat elsewhere.
func lstat(fsys fs.FS, p string) (fs.FileInfo, error) {
	if rl, ok := fsys.(fs.ReadLinkFS); ok {
		return rl.Lstat(p)
	}
	return fs.Stat(fsys, p)
}

// digest hashes a set of files by path and content.
func digest(files map[string][]byte) string {
	// A cluster has a handful of files; their paths are sorted without an allocation.
	var buf [8]string
	paths := buf[:0]
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	h := sha256.New()
	for _, p := range paths {
		h.Write([]byte(p))
		h.Write([]byte{0})
		var n [8]byte
		l := len(files[p])
		for i := range n {
			n[i] = byte(l >> (8 * i))
		}
		h.Write(n[:])
		h.Write(files[p])
	}
	return hex.EncodeToString(h.Sum(nil))
}
