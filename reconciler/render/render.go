// Package render turns one cluster of a loaded fleet into the objects its agent applies:
// the preset's Kueue object graph through kustomize, the cluster's own overlay, a
// LocalQueue in every workload namespace, the quota, the cordon, and the ownership labels.
//
// The output is a sorted object list and its content hash, the cluster's desired
// generation. The same fleet gives the same bytes on any machine, so that a hash on the
// hub and a hash acknowledged by an agent can be compared.
//
// A fleet repository is untrusted input, and kustomize's loader fetches URLs over HTTP
// and runs git to clone remote bases, with no switch to turn either off. So kustomize
// runs only on an in-memory file system that holds the presets and the one cluster's
// directory, with plugins disabled, and only after fleet.ProveLocal has proven, on
// exactly the bytes that file system holds, that every kustomization it can reach names
// nothing but files in it. Render renders only clusters the loader validated, and
// proves again all the same: a Fleet is a value any caller can build or change after
// loading, and the proof costs little next to kustomize itself. Kustomize then makes no
// request, starts no program and creates no temporary directory (its git cloner is
// what would create kustomize-* directories).
package render

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/agent/components"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
)

// Result is the desired state of one worker cluster.
type Result struct {
	// Cluster is the worker's name in the fleet.
	Cluster string `json:"cluster"`
	// Identity is the worker's identity, as in its labels.
	Identity string `json:"identity"`
	// Hash is the content hash of Objects: the desired generation.
	Hash string `json:"hash"`
	// Objects in the order the agent applies them.
	Objects []*unstructured.Unstructured `json:"objects"`
	// Components are the Kueue and JobSet the worker runs, which the agent installs
	// before it applies Objects.
	Components components.Spec `json:"components"`
}

// maxCachedPresetSets bounds the preset cache: a hub only ever needs the presets of the
// commits it is reconciling and planning.
const maxCachedPresetSets = 16

// Renderer renders clusters. Kustomize's output for a preset is cached by the content of
// the presets, so clusters without an overlay cost only the Go transforms. A Renderer is
// safe for concurrent use.
type Renderer struct {
	mu    sync.Mutex
	cache map[string]*presetOutput
}

type presetOutput struct {
	objects []map[string]any
	errs    fleet.ErrorList
}

// New returns a Renderer with an empty cache.
func New() *Renderer {
	return &Renderer{cache: map[string]*presetOutput{}}
}

// Render renders the named cluster. Problems with the fleet's content come back as a
// fleet.ErrorList naming the file to change; a cluster that did not validate is refused,
// and so is one whose kustomizations fleet.ProveLocal does not prove local.
func (r *Renderer) Render(f *fleet.Fleet, name string) (*Result, error) {
	c, ok := f.Clusters[name]
	if !ok {
		return nil, fmt.Errorf("cluster %q is not in the fleet", name)
	}
	if !f.Valid() {
		return nil, fleet.ErrorList{{File: fleet.FleetFile, Cluster: name, Message: "the fleet has errors; fix fleet.yaml and presets/ first"}}
	}
	if !c.Valid() {
		return nil, c.Errors
	}
	preset := f.Presets[c.Object.Spec.Preset]

	var objs []map[string]any
	if c.Overlay() == nil {
		out := r.preset(f, preset)
		if len(out.errs) > 0 {
			return nil, withCluster(out.errs, name)
		}
		objs = make([]map[string]any, len(out.objects))
		for i, o := range out.objects {
			objs[i] = runtime.DeepCopyJSON(o)
		}
	} else {
		var errs fleet.ErrorList
		objs, errs = kustomizeCluster(f, c, preset)
		if len(errs) > 0 {
			return nil, errs
		}
	}

	res := &Result{Cluster: name, Identity: fleet.Identity(f.Spec.Spec.Tenant, name)}
	objects, errs := transform(f, c, res.Identity, objs)
	if len(errs) > 0 {
		return nil, errs
	}
	res.Objects = objects
	res.Components = fleet.Components(f, c)
	hash, err := Hash(objects, res.Components)
	if err != nil {
		return nil, fmt.Errorf("hashing objects of cluster %q: %w", name, err)
	}
	res.Hash = hash
	return res, nil
}

// preset returns kustomize's output for a preset, from the cache when the presets are
// unchanged.
func (r *Renderer) preset(f *fleet.Fleet, p *fleet.Preset) *presetOutput {
	key := presetsKey(f, p.Name)
	r.mu.Lock()
	out, ok := r.cache[key]
	r.mu.Unlock()
	if ok {
		return out
	}
	out = &presetOutput{}
	dir := path.Join(fleet.PresetsDir, p.Name)
	objs, errs, err := runProven(kustomizeFiles(f, nil), dir, dir)
	switch {
	case len(errs) > 0:
		out.errs = errs
	case err != nil:
		out.errs = fleet.ErrorList{{File: path.Join(dir, fleet.KustomizationFile), Message: err.Error()}}
	default:
		out.objects = objs
	}
	r.mu.Lock()
	if len(r.cache) >= maxCachedPresetSets {
		clear(r.cache)
	}
	r.cache[key] = out
	r.mu.Unlock()
	return out
}

// presetsKey identifies the output of one preset. A preset may use files of other
// presets, so the key covers all of them.
func presetsKey(f *fleet.Fleet, name string) string {
	h := sha256.New()
	h.Write([]byte(name))
	for _, n := range slices.Sorted(maps.Keys(f.Presets)) {
		h.Write([]byte{0})
		h.Write([]byte(f.Presets[n].Digest))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// rootDir holds the generated kustomization that joins a preset and an overlay; no path
// of a fleet repository that reaches kustomize starts with it.
const rootDir = ".flotilla-render"

// kustomizeCluster runs kustomize over the cluster's preset with the cluster's
// kustomization.yaml applied as a component, so that its patches reach the preset's
// objects without the overlay having to name the preset.
func kustomizeCluster(f *fleet.Fleet, c *fleet.Cluster, p *fleet.Preset) ([]map[string]any, fleet.ErrorList) {
	overlayFile := path.Join(c.Dir, fleet.KustomizationFile)
	fail := func(err error) ([]map[string]any, fleet.ErrorList) {
		return nil, fleet.ErrorList{{File: overlayFile, Cluster: c.Name, Message: err.Error()}}
	}
	var overlay map[string]any
	if err := yaml.Unmarshal(c.Overlay(), &overlay); err != nil {
		return fail(err)
	}
	if overlay == nil {
		overlay = map[string]any{}
	}
	overlay["apiVersion"] = types.ComponentVersion
	overlay["kind"] = types.ComponentKind
	component, err := yaml.Marshal(overlay)
	if err != nil {
		return fail(err)
	}
	presetDir := path.Join(fleet.PresetsDir, p.Name)
	// The root's two paths start with "..", which kustomize reads as nothing but a path;
	// the directories they lead to are what is proven.
	root := types.Kustomization{
		TypeMeta:   types.TypeMeta{APIVersion: types.KustomizationVersion, Kind: types.KustomizationKind},
		Resources:  []string{path.Join("..", presetDir)},
		Components: []string{path.Join("..", c.Dir)},
	}
	rootYAML, err := yaml.Marshal(root)
	if err != nil {
		return fail(err)
	}
	files := kustomizeFiles(f, c)
	files[overlayFile] = component
	files[path.Join(rootDir, fleet.KustomizationFile)] = rootYAML
	objs, errs, err := runProven(files, rootDir, presetDir, c.Dir)
	if len(errs) > 0 {
		return nil, withCluster(errs, c.Name)
	}
	if err != nil {
		return fail(err)
	}
	return objs, nil
}

// kustomizeFiles is what kustomize may read for a preset (c nil) or for a cluster: the
// files of every preset and of the cluster's directory, keyed by path from the
// repository's root.
func kustomizeFiles(f *fleet.Fleet, c *fleet.Cluster) map[string][]byte {
	files := map[string][]byte{}
	for _, p := range f.Presets {
		maps.Copy(files, p.Files)
	}
	if c != nil {
		maps.Copy(files, c.Files)
	}
	return files
}

// runProven runs kustomize in dir over an in-memory file system that holds files and
// nothing else, once fleet.ProveLocal has proven that the kustomizations in proven
// (dir's own, or those it includes when render generated it) reach nothing but files.
// What the proof finds comes back as a list naming file and line.
func runProven(files map[string][]byte, dir string, proven ...string) ([]map[string]any, fleet.ErrorList, error) {
	if errs := fleet.ProveLocal(files, proven...); len(errs) > 0 {
		return nil, errs, nil
	}
	fsys := filesys.MakeFsInMemory()
	for p, data := range files {
		if err := fsys.WriteFile(path.Join("/", p), data); err != nil {
			return nil, nil, err
		}
	}
	objs, err := run(fsys, path.Join("/", dir))
	return objs, nil, err
}

// run runs kustomize with plugins disabled. Load restrictions are lifted because the file
// system holds only what was proven: files of presets/ and of the cluster.
func run(fsys filesys.FileSystem, dir string) ([]map[string]any, error) {
	opts := krusty.MakeDefaultOptions()
	opts.LoadRestrictions = types.LoadRestrictionsNone
	opts.PluginConfig = types.DisabledPluginConfig()
	m, err := krusty.MakeKustomizer(opts).Run(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize: %s", strings.ReplaceAll(err.Error(), "'/", "'"))
	}
	objs := make([]map[string]any, 0, m.Size())
	for _, res := range m.Resources() {
		// Through JSON, so that numbers become the int64 and float64 that unstructured
		// objects are made of.
		data, err := res.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("kustomize output %s: %w", res.CurId(), err)
		}
		var u unstructured.Unstructured
		if err := u.UnmarshalJSON(data); err != nil {
			return nil, fmt.Errorf("kustomize output %s: %w", res.CurId(), err)
		}
		objs = append(objs, u.Object)
	}
	return objs, nil
}

// Hash is the content hash of an object list: SHA-256 over its canonical JSON (keys
// sorted, no insignificant space), in the list's order.
func Hash(objects []*unstructured.Unstructured, comps components.Spec) (string, error) {
	h := sha256.New()
	enc := json.NewEncoder(h)
	for _, o := range objects {
		if err := enc.Encode(o.Object); err != nil {
			return "", err
		}
	}
	// After the objects, so that the hash of a desired state is told from any object list.
	if err := enc.Encode(comps); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// YAML writes the result as a YAML stream, preceded by a comment with its identity and
// hash.
func (r *Result) YAML() ([]byte, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "# cluster: %s\n# identity: %s\n# desired generation: %s\n", r.Cluster, r.Identity, r.Hash)
	if c := r.Components; c.Managed {
		fmt.Fprintf(&b, "# components, installed by the agent: %s, %s", c.Image(components.Kueue), c.Image(components.JobSet))
		if c.Adopt {
			b.WriteString(" (taking over what is there)")
		}
		b.WriteString("\n")
	} else {
		fmt.Fprintf(&b, "# components, run by the cluster's team: Kueue %s and JobSet %s expected\n", c.Kueue.Version, c.JobSet.Version)
	}
	for _, o := range r.Objects {
		data, err := yaml.Marshal(o.Object)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", o.GetKind(), o.GetName(), err)
		}
		b.WriteString("---\n")
		b.Write(data)
	}
	return []byte(b.String()), nil
}

// JSON writes the result as one indented JSON document.
func (r *Result) JSON() ([]byte, error) {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

func withCluster(list fleet.ErrorList, name string) fleet.ErrorList {
	out := slices.Clone(list)
	for i := range out {
		out[i].Cluster = name
	}
	return out
}

// Labels are the ownership labels of everything rendered for a worker identity.
func Labels(identity string) map[string]string {
	return map[string]string{
		v1alpha1.ManagedByLabel:     v1alpha1.ManagedByValue,
		v1alpha1.WorkerClusterLabel: identity,
	}
}
