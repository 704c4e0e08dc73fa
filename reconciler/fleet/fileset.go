package fleet

import "path"

// fileSet is what kustomize's file system will hold for one preset or overlay, looked up
// where it already is instead of copied: a kustomization may name every preset's files
// and, in an overlay, its own cluster's, and copying them for each preset and each
// cluster would cost a fleet the square of its size.
type fileSet struct {
	layers []map[string][]byte
	// dirs are the directories below which each layer holds a file, built the first
	// time a path that is no file has to be told from a directory.
	dirs []map[string]bool
}

func newFileSet(layers ...map[string][]byte) *fileSet {
	return &fileSet{layers: layers, dirs: make([]map[string]bool, len(layers))}
}

func (s *fileSet) get(p string) ([]byte, bool) {
	for _, l := range s.layers {
		if data, ok := l[p]; ok {
			return data, true
		}
	}
	return nil, false
}

// hasDir reports whether some file lies below dir.
func (s *fileSet) hasDir(dir string) bool {
	for i, l := range s.layers {
		if s.dirs[i] == nil {
			s.dirs[i] = dirsOf(l)
		}
		if s.dirs[i][dir] {
			return true
		}
	}
	return false
}

// dirsOf is every directory that holds a file of files, at any depth. Each parent is
// added once, so that it costs the files' paths once.
func dirsOf(files map[string][]byte) map[string]bool {
	dirs := map[string]bool{}
	for p := range files {
		for d := path.Dir(p); d != "." && d != "/" && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	return dirs
}

// presetIndex is built once per load from every preset: the files a kustomization may
// name, their directories, the objects of each YAML file and what each preset's render
// costs, so that validating a cluster costs the cluster's own files whatever the
// fleet's size.
type presetIndex struct {
	files *fileSet
	// all is every preset's files in one map, the first layer of files.
	all map[string][]byte
	// objects are the objects kustomize reads from each YAML file of a preset that
	// parsed, and yamlErrors each preset's YAML problems.
	objects    map[string]int
	yamlErrors map[string]ErrorList
	// cost is the render cost of each preset that validated.
	cost map[string]renderCost
}

// kustomizeIndex returns the fleet's preset index, built on first use: Load reads every
// preset before it validates any, and LoadCluster reads none.
func (f *Fleet) kustomizeIndex() *presetIndex {
	if f.kustomize != nil {
		return f.kustomize
	}
	idx := &presetIndex{all: map[string][]byte{}, objects: map[string]int{},
		yamlErrors: map[string]ErrorList{}, cost: map[string]renderCost{}}
	for name, p := range f.Presets {
		for k, v := range p.Files {
			idx.all[k] = v
		}
		var list ErrorList
		for file, n := range checkYAMLFiles(p.Files, "", &list) {
			idx.objects[file] = n
		}
		idx.yamlErrors[name] = list
	}
	idx.files = newFileSet(idx.all)
	f.kustomize = idx
	return idx
}

// filesFor is what a kustomization in a preset (c nil) or in c's overlay may name.
func (idx *presetIndex) filesFor(c *Cluster) *fileSet {
	if c == nil {
		return idx.files
	}
	// The presets' directories are shared; only the cluster's are built for it.
	return &fileSet{layers: []map[string][]byte{idx.all, c.Files}, dirs: []map[string]bool{idx.files.dirsBuilt(), nil}}
}

// dirsBuilt returns the directories of the first layer, building them if need be, so
// that every cluster's file set shares them.
func (s *fileSet) dirsBuilt() map[string]bool {
	if s.dirs[0] == nil {
		s.dirs[0] = dirsOf(s.layers[0])
	}
	return s.dirs[0]
}

// yamlChecked reports whether checkYAMLFiles parses the file p, so that its problems are
// reported by the preset or cluster that holds it.
func yamlChecked(p string) bool {
	base := path.Base(p)
	if base == KustomizationFile || base == ClusterFile || base == EnrollmentFile {
		return false
	}
	ext := path.Ext(p)
	return ext == ".yaml" || ext == ".yml"
}
