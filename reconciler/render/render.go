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
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sync/singleflight"
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

// The caches are bounded by the bytes their entries hold (see footprint) as well as by
// their number: a render may read up to fleet.MaxRenderInput, its decoded objects hold
// several times that, and a pull request's plan renders with the hub's Renderer, so
// that a bound on entries alone would let one pull request make the hub hold GiBs.
const (
	// maxCachedPresetSets bounds the preset cache: a hub only ever needs the presets of
	// the commits it is reconciling and planning. A preset's output is needed for every
	// cluster without an overlay, so one may take a good part of the cache.
	maxCachedPresetSets = 16
	presetCacheBytes    = 32 << 20
	maxPresetBytes      = 8 << 20

	// maxCachedOverlays bounds the overlay cache. An entry is one overlay's objects,
	// most often tens of KiB; fleets tend to repeat a few overlays across many
	// clusters. One that holds more than maxOverlayBytes is rendered again for every
	// cluster that has it.
	maxCachedOverlays = 256
	overlayCacheBytes = 64 << 20
	maxOverlayBytes   = 1 << 20

	// The component cache holds overlays converted to components, charged their bytes.
	maxCachedComponents = 256
	componentCacheBytes = 8 << 20
	maxComponentBytes   = 1 << 20
	// componentEntryBytes is charged for each component besides its bytes: its key,
	// and the cache's own entry for it.
	componentEntryBytes = 256
)

// Renderer renders clusters. Kustomize's output for a preset is cached by the content of
// the presets, so clusters without an overlay cost only the Go transforms. So is its
// output for an overlay, by what kustomize reads for it (see overlayKey): a commit that
// changes only a cluster's quota, or a fleet that gives many clusters the same overlay,
// runs kustomize once for it. Clusters that miss the cache for the same key at the same
// time run kustomize once between them. A Renderer is safe for concurrent use.
type Renderer struct {
	// mu guards the caches.
	mu       sync.Mutex
	presets  *lru[[sha256.Size]byte, *presetOutput]
	overlays *lru[[sha256.Size]byte, []map[string]any]
	// components are overlays as kustomize components, by the SHA-256 of the overlay.
	components *lru[[sha256.Size]byte, []byte]
	// rendering joins renders of one key, by the cache it is for and the key.
	rendering singleflight.Group
}

type presetOutput struct {
	objects []map[string]any
	errs    fleet.ErrorList
}

// New returns a Renderer with an empty cache.
func New() *Renderer {
	return &Renderer{
		presets:    newLRU[[sha256.Size]byte, *presetOutput](presetCacheBytes, maxPresetBytes, maxCachedPresetSets),
		overlays:   newLRU[[sha256.Size]byte, []map[string]any](overlayCacheBytes, maxOverlayBytes, maxCachedOverlays),
		components: newLRU[[sha256.Size]byte, []byte](componentCacheBytes, maxComponentBytes, maxCachedComponents),
	}
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
	overlay := c.Overlay()
	if overlay == nil {
		out := r.preset(f, preset)
		if len(out.errs) > 0 {
			return nil, withCluster(out.errs, name)
		}
		objs = deepCopy(out.objects)
	} else {
		var errs fleet.ErrorList
		objs, errs = r.kustomizeCluster(f, c, preset, overlay)
		if len(errs) > 0 {
			return nil, errs
		}
	}

	res := &Result{Cluster: name, Identity: fleet.Identity(f.Spec.Spec.Tenant, name)}
	objects, errs := transform(f, c, overlay != nil, res.Identity, objs)
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
	out, ok := r.presets.get(key)
	r.mu.Unlock()
	if ok {
		return out
	}
	v, _, _ := r.rendering.Do("preset\x00"+string(key[:]), func() (any, error) {
		out := &presetOutput{}
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
		r.presets.add(key, out, out.footprint())
		r.mu.Unlock()
		return out, nil
	})
	return v.(*presetOutput)
}

// footprint is what the cache charges for out.
func (out *presetOutput) footprint() int64 {
	n := footprint(out.objects)
	for _, e := range out.errs {
		n += int64(len(e.File) + len(e.Cluster) + len(e.Message) + 64)
	}
	return n
}

// presetsKey identifies the output of one preset. A preset may use files of other
// presets, so the key covers all of them. It is worked out for every cluster rendered,
// so it is kept to a hash and no more.
func presetsKey(f *fleet.Fleet, name string) [sha256.Size]byte {
	var buf [16]string
	names := buf[:0]
	for n := range f.Presets {
		names = append(names, n)
	}
	slices.Sort(names)
	h := sha256.New()
	h.Write([]byte(name))
	for _, n := range names {
		h.Write([]byte{0})
		h.Write([]byte(f.Presets[n].Digest))
	}
	var key [sha256.Size]byte
	h.Sum(key[:0])
	return key
}

// rootDir holds the generated kustomization that joins a preset and an overlay; no path
// of a fleet repository that reaches kustomize starts with it.
const rootDir = ".flotilla-render"

// kustomizeCluster runs kustomize over the cluster's preset with the cluster's
// kustomization.yaml applied as a component, so that its patches reach the preset's
// objects without the overlay having to name the preset. The objects are the caller's.
func (r *Renderer) kustomizeCluster(f *fleet.Fleet, c *fleet.Cluster, p *fleet.Preset, overlayYAML []byte) ([]map[string]any, fleet.ErrorList) {
	overlayFile := path.Join(c.Dir, fleet.KustomizationFile)
	fail := func(err error) ([]map[string]any, fleet.ErrorList) {
		return nil, fleet.ErrorList{{File: overlayFile, Cluster: c.Name, Message: err.Error()}}
	}
	component, err := r.component(overlayYAML)
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
	// As JSON, which kustomize reads as the YAML it is, without the YAML encoder's
	// round trip through a second parser. Nothing but kustomize reads this file.
	rootYAML, err := json.Marshal(root)
	if err != nil {
		return fail(err)
	}
	files := kustomizeFiles(f, c)
	files[overlayFile] = component
	files[path.Join(rootDir, fleet.KustomizationFile)] = rootYAML
	inputs, errs := fleet.LocalInputs(files, presetDir, c.Dir)
	if len(errs) > 0 {
		return nil, withCluster(errs, c.Name)
	}
	key := overlayKey(files, inputs, presetDir, c.Dir)
	r.mu.Lock()
	cached, ok := r.overlays.get(key)
	r.mu.Unlock()
	if ok {
		return deepCopy(cached), nil
	}
	ran := false
	v, err, _ := r.rendering.Do("overlay\x00"+string(key[:]), func() (any, error) {
		ran = true
		objs, err := runIn(files, rootDir)
		if err != nil {
			return nil, err
		}
		r.mu.Lock()
		r.overlays.add(key, objs, footprint(objs))
		r.mu.Unlock()
		return objs, nil
	})
	if err != nil && !ran {
		// Another cluster's render failed, and its error names that cluster's files:
		// this one's own render names its own.
		objs, err := runIn(files, rootDir)
		if err != nil {
			return fail(err)
		}
		return objs, nil
	}
	if err != nil {
		// Not cached: the error names the cluster's own files.
		return fail(err)
	}
	return deepCopy(v.([]map[string]any)), nil
}

// component is the cluster's kustomization as a Component, from the cache when another
// cluster has the same. Converting it costs more than the rest of an overlay's render
// once kustomize's output is cached.
func (r *Renderer) component(overlayYAML []byte) ([]byte, error) {
	key := sha256.Sum256(overlayYAML)
	r.mu.Lock()
	component, ok := r.components.get(key)
	r.mu.Unlock()
	if ok {
		return component, nil
	}
	var overlay map[string]any
	if err := yaml.Unmarshal(overlayYAML, &overlay); err != nil {
		return nil, err
	}
	if overlay == nil {
		overlay = map[string]any{}
	}
	overlay["apiVersion"] = types.ComponentVersion
	overlay["kind"] = types.ComponentKind
	component, err := yaml.Marshal(overlay)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.components.add(key, component, int64(len(component)+componentEntryBytes))
	r.mu.Unlock()
	return component, nil
}

// overlayKey identifies kustomize's output for a cluster's overlay on the preset in
// presetDir by what fleet.LocalInputs says kustomize reads for it, with the cluster's
// directory dir left out of their paths. Kustomize's output holds no path (the fleet
// refuses buildMetadata, which would add some), and an overlay may name files in its
// own directory and presets/ only, so that two overlays that read the same bytes from
// the same places render the same objects: the files they do not read, such as
// cluster.yaml with the quota, make no difference. The root kustomization render
// generates is made of presetDir and dir alone.
func overlayKey(files map[string][]byte, inputs []string, presetDir, dir string) [sha256.Size]byte {
	h := sha256.New()
	var n [8]byte
	write := func(b []byte) {
		binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	write([]byte(presetDir))
	for _, p := range inputs {
		if rel, ok := strings.CutPrefix(p, dir+"/"); ok {
			h.Write([]byte{'c'})
			write([]byte(rel))
		} else {
			h.Write([]byte{'r'})
			write([]byte(p))
		}
		write(files[p])
	}
	var key [sha256.Size]byte
	h.Sum(key[:0])
	return key
}

// deepCopy copies cached objects for transform to change. LocalQueues are not copied:
// transform never changes them, only copies them into each workload namespace.
func deepCopy(objects []map[string]any) []map[string]any {
	out := make([]map[string]any, len(objects))
	for i, o := range objects {
		if o["kind"] == "LocalQueue" {
			out[i] = o
			continue
		}
		out[i] = runtime.DeepCopyJSON(o)
	}
	return out
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
	objs, err := runIn(files, dir)
	return objs, nil, err
}

// runIn runs kustomize in dir over an in-memory file system that holds files and nothing
// else. The caller has proven them local.
func runIn(files map[string][]byte, dir string) ([]map[string]any, error) {
	fsys := filesys.MakeFsInMemory()
	for p, data := range files {
		if err := fsys.WriteFile(path.Join("/", p), data); err != nil {
			return nil, err
		}
	}
	return run(fsys, path.Join("/", dir))
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
