// Package fleet loads a fleet repository: fleet.yaml, the scheduling presets and one
// directory per worker cluster. It validates every file with errors that name the file,
// line and column a fleet owner has to change, and it keeps going past a broken cluster
// so that one bad directory never takes the rest of the fleet down with it.
//
// The loader reads through io/fs, so a checkout on disk and a tree inside a Git commit
// are the same to it.
package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"maps"
	"path"
	"slices"

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

// Fleet is a fleet repository as loaded from one tree.
type Fleet struct {
	// Spec is fleet.yaml; nil when it is missing or could not be decoded.
	Spec *v1alpha1.Fleet
	// Presets by name. A preset with errors is kept so that clusters can point at them.
	Presets map[string]*Preset
	// Clusters by directory name, valid or not.
	Clusters map[string]*Cluster
	// Errors are the problems of fleet.yaml and of the presets.
	Errors ErrorList
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
}

// Valid reports whether the cluster can be rendered and enrolled.
func (c *Cluster) Valid() bool { return c.Object != nil && len(c.Errors) == 0 }

// Enrollment is the raw, still encrypted enrollment file.
func (c *Cluster) Enrollment() []byte { return c.Files[path.Join(c.Dir, EnrollmentFile)] }

// Overlay is the cluster's kustomization.yaml, or nil when it has none.
func (c *Cluster) Overlay() []byte { return c.Files[path.Join(c.Dir, KustomizationFile)] }

// Valid reports whether fleet.yaml and every preset loaded without error.
func (f *Fleet) Valid() bool { return f.Spec != nil && len(f.Errors) == 0 }

// StatusContextPrefix is the commit-status context prefix, defaulted.
func (f *Fleet) StatusContextPrefix() string {
	if f.Spec == nil || f.Spec.Spec.StatusContextPrefix == "" {
		return DefaultStatusContextPrefix
	}
	return f.Spec.Spec.StatusContextPrefix
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

// Load reads and validates the fleet repository at the root of fsys.
func Load(fsys fs.FS) *Fleet {
	f := &Fleet{Presets: map[string]*Preset{}, Clusters: map[string]*Cluster{}}
	f.Spec = loadFleetFile(fsys, &f.Errors)
	f.loadPresets(fsys)
	for _, name := range listDirs(fsys, ClustersDir, &f.Errors) {
		f.loadCluster(fsys, name)
	}
	f.checkUniqueNames()
	return f
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
	delete(f.Clusters, name)
	dir := path.Join(ClustersDir, name)
	var c *Cluster
	if info, err := fs.Stat(fsys, dir); err == nil && info.IsDir() {
		c = f.loadCluster(fsys, name)
		if c.Object != nil {
			claimed = append(claimed, c.Object.Name)
		}
	}
	if len(claimed) > 0 {
		f.checkUniqueNames(claimed...)
	}
	return c
}

func (f *Fleet) loadCluster(fsys fs.FS, name string) *Cluster {
	c := &Cluster{Name: name, Dir: path.Join(ClustersDir, name), Files: map[string][]byte{}}
	f.Clusters[name] = c
	e := errs{file: c.Dir, cluster: name, list: &c.Errors}
	readTree(fsys, c.Dir, e, c.Files)
	c.Digest = digest(c.Files)
	validateCluster(f, c)
	return c
}

func (f *Fleet) loadPresets(fsys fs.FS) {
	for _, name := range listDirs(fsys, PresetsDir, &f.Errors) {
		p := &Preset{Name: name, Files: map[string][]byte{}}
		dir := path.Join(PresetsDir, name)
		e := errs{file: dir, list: &p.Errors}
		readTree(fsys, dir, e, p.Files)
		p.Digest = digest(p.Files)
		f.Presets[name] = p
	}
	for _, name := range slices.Sorted(maps.Keys(f.Presets)) {
		validatePreset(f, f.Presets[name])
		f.Errors = append(f.Errors, f.Presets[name].Errors...)
	}
}

// listDirs lists the directories directly below dir. A missing dir is an empty list: a
// fleet without clusters is a valid fleet.
func listDirs(fsys fs.FS, dir string, list *ErrorList) []string {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		if _, statErr := fs.Stat(fsys, dir); statErr != nil {
			return nil
		}
		errs{file: dir, list: list}.whole("cannot read directory: %v", unwrapPathError(err))
		return nil
	}
	var names []string
	for _, ent := range entries {
		p := path.Join(dir, ent.Name())
		switch {
		case ent.IsDir():
			names = append(names, ent.Name())
		case ent.Type()&fs.ModeSymlink != 0:
			e := errs{file: p, list: list}
			if _, info, ok := resolve(fsys, p, e); ok && info.IsDir() {
				e.whole("symbolic links to directories are not supported")
			}
		}
	}
	return names
}

// digest hashes a set of files by path and content.
func digest(files map[string][]byte) string {
	h := sha256.New()
	for _, p := range slices.Sorted(maps.Keys(files)) {
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
