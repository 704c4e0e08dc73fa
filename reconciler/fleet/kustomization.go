package fleet

import (
	"fmt"
	"path"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	"sigs.k8s.io/kustomize/api/konfig"
	"sigs.k8s.io/kustomize/api/types"
)

// allowedKustomizeFields are the kustomization fields a preset or cluster overlay may use:
// those that only reshape the objects in the repository. Everything else could run a
// program, load remote content or place objects where flotilla does not expect them.
var allowedKustomizeFields = map[string]bool{
	"apiVersion": true, "kind": true, "metadata": true,
	"resources": true, "components": true,
	"patches": true,
	"labels":  true, "commonLabels": true, "commonAnnotations": true,
	"namePrefix": true, "nameSuffix": true, "replacements": true,
}

var refusedKustomizeFields = map[string]string{
	"generators":                  "it runs plugins",
	"transformers":                "it runs plugins",
	"validators":                  "it runs plugins",
	"helmCharts":                  "it runs Helm and fetches charts",
	"helmGlobals":                 "it runs Helm and fetches charts",
	"helmChartInflationGenerator": "it runs Helm and fetches charts",
	"openapi":                     "it loads schemas from outside the repository",
	"configurations":              "it changes kustomize's own configuration",
	"crds":                        "it changes kustomize's own configuration",
	"namespace":                   "flotilla places namespaced objects in the fleet's workload namespaces",
	"secretGenerator":             "secrets do not belong in a fleet repository unencrypted",
	"configMapGenerator":          "Kueue's objects need no ConfigMaps",
	"bases":                       "it is deprecated; list the directory under resources",
	"vars":                        "it is deprecated; use replacements",
	"patchesStrategicMerge":       "it is deprecated; list the patch under patches",
	"patchesJson6902":             "it is deprecated; list the patch under patches",
}

// Limits of the kustomizations that one preset or one cluster overlay reaches, far
// beyond what a fleet needs.
const (
	// maxKustomizationDepth bounds how many kustomizations include one another in a chain.
	maxKustomizationDepth = 10
	// maxKustomizationLoads bounds how often kustomize loads a kustomization for one
	// preset or overlay. Kustomize loads a directory again each time it is included, so
	// that a few directories that each include the next twice would cost it exponential
	// time.
	maxKustomizationLoads = 100
)

// ProveLocal checks, before kustomize runs, the kustomizations in dirs and every
// kustomization they reach, the way kustomize would reach them, against the rules
// that the loader checks a fleet with. files is exactly what kustomize's file system
// holds, keyed by slash-separated path from its root; dirs lie under presets/ or
// clusters/, and are what one render runs kustomize over: a preset, or a cluster's
// preset and overlay.
//
// An empty list proves that kustomize, run in any of dirs over files, fetches nothing,
// clones nothing and runs no program: each path that a reachable kustomization names
// is one that kustomize reads as a path (see remoteReason) and that exists in files,
// no field runs a plugin or Helm, and kustomize's own parser reads each kustomization
// as it was checked. Kustomize's loader fetches URLs and runs git for remote bases and
// has no switch to turn that off, so this proof has to come first. It also proves that
// the render stays within MaxRenderObjects and MaxRenderInput, counted over all of
// dirs, since nothing stops kustomize once it runs.
func ProveLocal(files map[string][]byte, dirs ...string) ErrorList {
	_, errs := LocalInputs(files, dirs...)
	return errs
}

// LocalInputs is ProveLocal that, when the proof holds, also names every file of files
// that kustomize reads when it runs in dirs: each kustomization it loads and each file
// they name, sorted. Kustomize's output is made of these files, their content and where
// they lie, and of nothing else in files; a caller may cache it by them.
func LocalInputs(files map[string][]byte, dirs ...string) ([]string, ErrorList) {
	w := newKustomizeWalk(newFileSet(files), "", func(string) bool { return false })
	for _, d := range dirs {
		// A caller names these directories in a kustomization of its own, such as
		// render's, which must be as plain as the rest.
		if why := remoteReason(d); why != "" || refRoots(d) == nil || path.Clean(d) != d {
			w.errs(d).whole("kustomize may only run on a directory of presets/ or clusters/")
			continue
		}
		w.walk(d)
	}
	if len(w.out) > 0 {
		w.out.Sort()
		return nil, slices.Compact(w.out)
	}
	// Without errors, every kustomization reached was checked whole and its files found.
	var inputs []string
	for file, k := range w.checked {
		if k == nil {
			continue
		}
		inputs = append(inputs, file)
		for _, in := range k.refs {
			if !in.dir {
				inputs = append(inputs, in.target)
			}
		}
	}
	slices.Sort(inputs)
	return slices.Compact(inputs), nil
}

// checkKustomizations checks the kustomization in dir, a preset's or a cluster's
// directory, and every kustomization it reaches, and returns what its render costs.
// files is what kustomize will be given for it: every preset's files and, for a
// cluster, its own. objects are the objects of the cluster's YAML files that parsed
// (checkYAMLFiles); base is what the cluster's preset costs, from the preset's
// directory from.
func checkKustomizations(f *Fleet, files *fileSet, objects map[string]int, dir, cluster string, base renderCost, from string, list *ErrorList) renderCost {
	// A file that could not be read has its own error; it does exist.
	unreadable := func(p string) bool { return hasError(*list, p) || hasError(f.Errors, p) }
	w := newKustomizeWalk(files, cluster, unreadable)
	idx := f.kustomizeIndex()
	w.known = func(p string) (int, bool) {
		if n, ok := idx.objects[p]; ok {
			return n, true
		}
		if n, ok := objects[p]; ok {
			return n, true
		}
		// A YAML file that did not parse has its errors in the preset or cluster that
		// holds it; it adds no objects, and nothing of it renders.
		return 0, yamlChecked(p)
	}
	w.cost = base
	if from != "" {
		w.prior = []string{from}
	}
	w.walk(dir)
	for _, e := range w.out {
		// An overlay may include a kustomization of a preset whose own errors are known.
		if cluster != "" && slices.ContainsFunc(f.Errors, func(o Error) bool {
			return o.File == e.File && o.Line == e.Line && o.Column == e.Column && o.Message == e.Message
		}) {
			continue
		}
		*list = append(*list, e)
	}
	return w.cost
}

// kustomizeWalk follows the kustomizations that include one another, as kustomize does,
// and checks each of them once.
type kustomizeWalk struct {
	files      *fileSet
	cluster    string
	unreadable func(string) bool
	// known returns the objects of a file counted already, if it was.
	known func(string) (int, bool)
	// checked holds what each kustomization file includes, or nil when it has errors.
	checked map[string]*kustomization
	// counted holds the objects of each file this walk counted.
	counted map[string]int
	out     ErrorList
	seen    map[Error]bool

	// Of one render, over the walks of its preset and its overlay:
	cost renderCost
	// prior are the directories walked before the one walked now.
	prior []string
	// overCost is set once the render broke a limit; it is reported once.
	overCost bool

	// Of one walk from a preset or overlay:
	stack     []string
	loads     int
	exhausted bool
}

// kustomization is one checked kustomization file.
type kustomization struct {
	file string
	size int
	// refs are the files and the directories with a kustomization that it names, in
	// the order it names them.
	refs []include
}

type include struct {
	ref, target string
	line, col   int
	// dir is set for a directory with a kustomization, resource for a file of objects
	// (else a patch or replacements file).
	dir, resource bool
}

func newKustomizeWalk(files *fileSet, cluster string, unreadable func(string) bool) *kustomizeWalk {
	return &kustomizeWalk{files: files, cluster: cluster, unreadable: unreadable,
		known:   func(string) (int, bool) { return 0, false },
		checked: map[string]*kustomization{}, counted: map[string]int{}, seen: map[Error]bool{}}
}

// errs collects the errors of one file in the walk's list.
func (w *kustomizeWalk) errs(file string) errs {
	return errs{file: file, cluster: w.cluster, list: &w.out}
}

func (w *kustomizeWalk) walk(dir string) {
	w.stack, w.loads, w.exhausted = w.stack[:0], 0, false
	before := len(w.out)
	w.visit(dir, nil, errs{})
	// The same error found on two paths through the kustomizations is one error.
	kept := w.out[:before]
	for _, e := range w.out[before:] {
		if !w.seen[e] {
			w.seen[e] = true
			kept = append(kept, e)
		}
	}
	w.out = kept
	w.prior = append(w.prior, dir)
}

// visit loads the kustomization in dir, which from names in a kustomization whose
// errors go to fe (from is nil for the directory a walk starts in).
func (w *kustomizeWalk) visit(dir string, from *include, fe errs) {
	w.loads++
	k := w.load(dir)
	if k == nil {
		return
	}
	w.stack = append(w.stack, dir)
	defer func() { w.stack = w.stack[:len(w.stack)-1] }()
	if from == nil {
		fe = w.errs(k.file)
	}
	if !w.charge(0, k.size, from, fe) {
		return
	}
	e := w.errs(k.file)
	for _, in := range k.refs {
		if w.exhausted || w.overCost {
			return
		}
		if !in.dir {
			data, _ := w.files.get(in.target)
			objects := 0
			if in.resource {
				objects = w.objects(in.target, data)
			}
			w.charge(objects, len(data), &in, e)
			continue
		}
		switch {
		case slices.ContainsFunc(w.stack, func(d string) bool { return d == in.target || strings.HasPrefix(d, in.target+"/") }):
			// Kustomize refuses these too, but only once it has loaded everything on the
			// way; the walk must end here regardless.
			e.at(in.line, in.col, "%q includes %s again: kustomizations may not include one another in a cycle, nor a directory above one on the way here", in.ref, in.target)
		case len(w.stack) >= maxKustomizationDepth:
			e.at(in.line, in.col, "%q nests kustomizations %d deep; at most %d may include one another in a chain", in.ref, len(w.stack)+1, maxKustomizationDepth)
		case w.loads >= maxKustomizationLoads:
			e.at(in.line, in.col, "%q makes kustomize load more than %d kustomizations for %s; kustomize loads a directory again each time it is included", in.ref, maxKustomizationLoads, w.stack[0])
			w.exhausted = true
		default:
			w.visit(in.target, &in, e)
		}
	}
}

// charge adds what one load reads to the render's cost. Past a limit it reports the
// path that broke it, in, in the kustomization that fe is for (the kustomization
// itself when in is nil), and reports false.
func (w *kustomizeWalk) charge(objects, bytes int, in *include, fe errs) bool {
	if w.overCost {
		return false
	}
	w.cost.objects += objects
	w.cost.bytes += bytes
	var what string
	switch {
	case w.cost.objects > MaxRenderObjects:
		what = fmt.Sprintf("more than %d objects", MaxRenderObjects)
	case w.cost.bytes > MaxRenderInput:
		what = fmt.Sprintf("more than %s of kustomizations, resources and patches", mebibytes(MaxRenderInput))
	default:
		return true
	}
	w.overCost = true
	root := w.stack[0]
	if len(w.prior) > 0 {
		root = strings.Join(w.prior, " and ") + " and " + root
	}
	const why = "a render has at most that much; kustomize reads a file again each time a kustomization that names it is included"
	if in == nil {
		fe.whole("makes kustomize render %s for %s; %s", what, root, why)
	} else {
		fe.at(in.line, in.col, "%q makes kustomize render %s for %s; %s", in.ref, what, root, why)
	}
	return false
}

// objects counts the objects kustomize reads from file, once a walk.
func (w *kustomizeWalk) objects(file string, data []byte) int {
	if n, ok := w.known(file); ok {
		return n
	}
	if n, ok := w.counted[file]; ok {
		return n
	}
	var list ErrorList
	docs, ok := parseYAML(data, errs{file: file, cluster: w.cluster, list: &list})
	n := 0
	if ok {
		n = countObjects(docs)
	} else if !w.unreadable(file) {
		// Kustomize would read this file; the loader may not have, given its name.
		w.out = append(w.out, list...)
	}
	w.counted[file] = n
	return n
}

// load checks the kustomization in dir the first time it is reached.
func (w *kustomizeWalk) load(dir string) *kustomization {
	file := path.Join(dir, KustomizationFile)
	if k, ok := w.checked[file]; ok {
		return k
	}
	k := w.check(dir, file)
	w.checked[file] = k
	return k
}

// check checks one kustomization file. Every path it names must stay inside the
// directories its own directory may use and exist in files, so that kustomize never
// reads anything else and never fetches a URL.
func (w *kustomizeWalk) check(dir, file string) *kustomization {
	e := w.errs(file)
	namesOK := true
	for _, name := range konfig.RecognizedKustomizationFileNames() {
		other := path.Join(dir, name)
		if _, found := w.files.get(other); found && name != KustomizationFile {
			w.errs(other).whole("kustomize would read this file as well as or instead of %s; a fleet names its kustomizations %s only", KustomizationFile, KustomizationFile)
			namesOK = false
		}
	}
	data, found := w.files.get(file)
	if !found {
		if !w.unreadable(file) {
			w.errs(dir).whole("directory has no %s", KustomizationFile)
		}
		return nil
	}
	root, parsed := singleDocument(data, e)
	if !parsed {
		return nil
	}
	ok := true
	for i := 0; i+1 < len(root.Content); i += 2 {
		k := root.Content[i]
		if allowedKustomizeFields[k.Value] {
			continue
		}
		if why, refused := refusedKustomizeFields[k.Value]; refused {
			e.at(k.Line, k.Column, "%s is not allowed in a fleet kustomization: %s", k.Value, why)
		} else {
			e.at(k.Line, k.Column, "unknown field %q", k.Value)
		}
		ok = false
	}
	if !ok {
		return nil
	}
	var k types.Kustomization
	if !decodeStrict(root, &k, e) {
		return nil
	}
	if k.Kind != "" && k.Kind != types.KustomizationKind && k.Kind != types.ComponentKind {
		n := locate(root, "kind")
		e.at(n.Line, n.Column, "kind must be Kustomization or Component, not %q", k.Kind)
		ok = false
	}
	if !readsTheSame(root, data, &k, e) {
		ok = false
	}
	out := &kustomization{file: file, size: len(data)}
	check := func(ref string, kind refKind, p ...string) {
		n := locate(root, p...)
		target, isKustomization, msg := w.checkRef(dir, ref, kind)
		switch {
		case msg != "":
			if target == "" || !w.unreadable(target) {
				e.at(n.Line, n.Column, "%s", msg)
				ok = false
			}
		case isKustomization && inCluster(dir) && isWholePreset(target):
			e.at(n.Line, n.Column, "%q is a whole preset: the cluster's preset is its base already; list only patches and extra objects", ref)
			ok = false
		default:
			out.refs = append(out.refs, include{ref: ref, target: target, line: n.Line, col: n.Column,
				dir: isKustomization, resource: kind == refResource})
		}
	}
	for i, r := range k.Resources {
		check(r, refResource, "resources", fmt.Sprintf("[%d]", i))
	}
	for i, r := range k.Components {
		check(r, refComponent, "components", fmt.Sprintf("[%d]", i))
	}
	for i, p := range k.Patches {
		if p.Path != "" {
			check(p.Path, refFile, "patches", fmt.Sprintf("[%d]", i), "path")
		}
	}
	for i, r := range k.Replacements {
		if r.Path != "" {
			check(r.Path, refFile, "replacements", fmt.Sprintf("[%d]", i), "path")
		}
	}
	if !ok || !namesOK {
		// What an erroneous kustomization includes is not followed: its errors are
		// enough, and kustomize never runs on it.
		return nil
	}
	return out
}

// readsTheSame reports whether kustomize's own parser reads data as the kustomization k
// checked here. It parses with another YAML library (one that decodes !!binary, for one)
// and matches field names regardless of case, so that a path could read as a file here
// and as a URL to kustomize.
func readsTheSame(root *yaml.Node, data []byte, k *types.Kustomization, e errs) bool {
	var theirs types.Kustomization
	if err := theirs.Unmarshal(data); err != nil {
		e.whole("kustomize cannot read this file: %v", err)
		return false
	}
	type pathAt struct {
		value string
		at    []string
	}
	paths := func(k *types.Kustomization) []pathAt {
		var out []pathAt
		for i, r := range k.Resources {
			out = append(out, pathAt{r, []string{"resources", fmt.Sprintf("[%d]", i)}})
		}
		for i, r := range k.Components {
			out = append(out, pathAt{r, []string{"components", fmt.Sprintf("[%d]", i)}})
		}
		for i, p := range k.Patches {
			out = append(out, pathAt{p.Path, []string{"patches", fmt.Sprintf("[%d]", i), "path"}})
		}
		for i, r := range k.Replacements {
			out = append(out, pathAt{r.Path, []string{"replacements", fmt.Sprintf("[%d]", i), "path"}})
		}
		return out
	}
	ours, their := paths(k), paths(&theirs)
	for i := range min(len(ours), len(their)) {
		if ours[i].value != their[i].value || !slices.Equal(ours[i].at, their[i].at) {
			n := locate(root, ours[i].at...)
			e.at(n.Line, n.Column, "kustomize reads this path as %q, not %q; write paths as plain strings, without YAML tags", their[i].value, ours[i].value)
			return false
		}
	}
	if !reflect.DeepEqual(k, &theirs) {
		e.at(root.Line, root.Column, "kustomize reads this file differently than it reads here; write it as plain YAML, without tags")
		return false
	}
	return true
}

type refKind int

const (
	// refResource is a file of objects or a directory with a kustomization.
	refResource refKind = iota
	// refComponent is a directory with a kustomization of kind Component.
	refComponent
	// refFile is the file of a patch or of replacements.
	refFile
)

// checkRef resolves a path that a kustomization in dir names. It says what is wrong with
// it, or "" when it is fine, and whether it is a directory with a kustomization.
func (w *kustomizeWalk) checkRef(dir, ref string, kind refKind) (target string, isKustomization bool, msg string) {
	if why := remoteReason(ref); why != "" {
		return "", false, fmt.Sprintf("%q is remote; kustomizations in a fleet may only name files in the repository: %s", ref, why)
	}
	if ref == "" {
		return "", false, "the path is empty"
	}
	if path.IsAbs(ref) {
		return "", false, fmt.Sprintf("%q is an absolute path; name files relative to %s", ref, dir)
	}
	target = path.Join(dir, ref)
	roots := refRoots(dir)
	if !slices.ContainsFunc(roots, func(r string) bool { return target == r || strings.HasPrefix(target, r+"/") }) {
		if inCluster(dir) {
			return target, false, fmt.Sprintf("%q resolves to %s, outside %s; overlays may only name files in their own directory and presets/", ref, target, strings.Join(roots, " and "))
		}
		return target, false, fmt.Sprintf("%q resolves to %s, outside %s; presets may only name files in presets/", ref, target, strings.Join(roots, " and "))
	}
	if _, isFile := w.files.get(target); isFile {
		if kind == refComponent {
			return target, false, fmt.Sprintf("%q is a file; a component is a directory with a kustomization.yaml", ref)
		}
		return target, false, ""
	}
	if _, isDir := w.files.get(path.Join(target, KustomizationFile)); isDir {
		if kind == refFile {
			return target, false, fmt.Sprintf("%q is a directory; a patch or a replacement names a file", ref)
		}
		return target, true, ""
	}
	if w.files.hasDir(target) {
		return target, false, fmt.Sprintf("directory %q has no kustomization.yaml", ref)
	}
	return target, false, fmt.Sprintf("%q does not exist in the repository (remote bases are not allowed)", ref)
}

// refRoots are the directories that a kustomization in dir may name files in: a
// preset's, those of presets/; a cluster's, those of its own directory and of presets/.
func refRoots(dir string) []string {
	if dir == PresetsDir || strings.HasPrefix(dir, PresetsDir+"/") {
		return []string{PresetsDir}
	}
	if rest, ok := strings.CutPrefix(dir, ClustersDir+"/"); ok {
		name, _, _ := strings.Cut(rest, "/")
		return []string{path.Join(ClustersDir, name), PresetsDir}
	}
	return nil
}

func inCluster(dir string) bool { return strings.HasPrefix(dir, ClustersDir+"/") }

// isWholePreset reports whether dir is the directory of a preset.
func isWholePreset(dir string) bool {
	rest, ok := strings.CutPrefix(dir, PresetsDir+"/")
	return ok && rest != "" && !strings.Contains(rest, "/")
}
