// Package fleetgen builds fleet repositories in memory for tests and benchmarks: the
// fleet template as shipped, and synthetic fleets of any size made from it.
package fleetgen

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	fleettemplate "github.com/flotilla-gitops/flotilla/fleet-template"
)

// ExampleCluster is the template's example cluster.
const ExampleCluster = "example-us-central1"

// Template returns a copy of the fleet template that the caller may change.
func Template() fstest.MapFS {
	out := fstest.MapFS{}
	err := fs.WalkDir(fleettemplate.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(fleettemplate.FS(), p)
		if err != nil {
			return err
		}
		out[p] = &fstest.MapFile{Data: data, Mode: 0o644}
		return nil
	})
	if err != nil {
		panic(fmt.Sprintf("fleetgen: reading the embedded fleet template: %v", err))
	}
	return out
}

// Options shape a synthetic fleet.
type Options struct {
	// CordonEvery cordons every n-th cluster; 0 cordons none.
	CordonEvery int
	// OverlayEvery gives every n-th cluster a kustomization.yaml; 0 gives none.
	OverlayEvery int
}

// Fleet returns the template with its example cluster replaced by n clusters that
// alternate between the template's presets.
func Fleet(n int, opts Options) fstest.MapFS {
	fsys := Template()
	enrollment := fsys[path.Join("clusters", ExampleCluster, "enrollment.sops.yaml")].Data
	for p := range fsys {
		if strings.HasPrefix(p, "clusters/") {
			delete(fsys, p)
		}
	}
	for i := range n {
		AddCluster(fsys, ClusterName(i), enrollment, i, opts)
	}
	return fsys
}

// ClusterName is the name of the i-th synthetic cluster.
func ClusterName(i int) string { return fmt.Sprintf("gpu-%05d", i) }

// AddCluster writes the i-th synthetic cluster's directory into fsys.
func AddCluster(fsys fstest.MapFS, name string, enrollment []byte, i int, opts Options) {
	dir := path.Join("clusters", name)
	presets := []string{"gke-dws", "gpu"}
	regions := []string{"us-central1", "europe-west4", "us-east5", "europe-west1"}
	residency := map[string]string{"us-central1": "us", "us-east5": "us", "europe-west4": "eu", "europe-west1": "eu"}
	region := regions[i%len(regions)]
	cordoned := opts.CordonEvery > 0 && i%opts.CordonEvery == opts.CordonEvery-1
	gpus := 8 * (1 + i%16)
	cluster := fmt.Sprintf(`apiVersion: flotilla.dev/v1alpha1
kind: WorkerCluster
metadata:
  name: %s
spec:
  region: %s
  zone: %s-a
  residency: %s
  preset: %s
  quota:
    nvidia.com/gpu: %d
    cpu: %d
    memory: %dGi
  cordoned: %t
  expectedGPUs:
    - product: NVIDIA-H100-80GB-HBM3
      count: %d
`, name, region, region, residency[region], presets[i%len(presets)], gpus, gpus*24, gpus*200, cordoned, gpus)
	fsys[path.Join(dir, "cluster.yaml")] = &fstest.MapFile{Data: []byte(cluster), Mode: 0o644}
	fsys[path.Join(dir, "enrollment.sops.yaml")] = &fstest.MapFile{Data: enrollment, Mode: 0o644}
	if opts.OverlayEvery > 0 && i%opts.OverlayEvery == opts.OverlayEvery-1 {
		fsys[path.Join(dir, "kustomization.yaml")] = &fstest.MapFile{Data: []byte(Overlay), Mode: 0o644}
		fsys[path.Join(dir, "priority.yaml")] = &fstest.MapFile{Data: []byte(OverlayPriority), Mode: 0o644}
	}
}

// Overlay is a cluster kustomization that patches the preset's ClusterQueue and adds an
// object of its own.
const Overlay = `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - priority.yaml
patches:
  - target:
      kind: ClusterQueue
      name: cluster-queue
    patch: |-
      - op: add
        path: /spec/queueingStrategy
        value: StrictFIFO
`

// OverlayPriority is the extra object of Overlay.
const OverlayPriority = `apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata:
  name: urgent
value: 1000
description: jobs that may jump the queue on this cluster
`

// WriteDir writes fsys into a new temporary directory, removed when the test ends, and
// returns its path. A fleet on disk is what the CLI reads; it also keeps benchmarks from
// measuring fstest.MapFS, whose directory listing scans every file of the fleet.
func WriteDir(tb testing.TB, fsys fstest.MapFS) string {
	tb.Helper()
	dir := tb.TempDir()
	WriteInto(tb, dir, fsys)
	return dir
}

// WriteInto writes the files of fsys into dir, making the directories they need.
func WriteInto(tb testing.TB, dir string, fsys fstest.MapFS) {
	tb.Helper()
	for p, f := range fsys {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(full, f.Data, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
}

// Variant is the template with its example cluster set up one way.
type Variant struct {
	Name string
	FS   fstest.MapFS
}

// Variants are the template's example cluster on each preset, as shipped, cordoned and
// with an overlay: the cases every renderer test and schema check covers.
func Variants() []Variant {
	var out []Variant
	for _, preset := range []string{"gke-dws", "gpu"} {
		for _, v := range []string{"", "cordoned", "overlay"} {
			fsys := Template()
			p := path.Join("clusters", ExampleCluster, "cluster.yaml")
			s := strings.Replace(string(fsys[p].Data), "preset: gke-dws", "preset: "+preset, 1)
			switch v {
			case "cordoned":
				s = strings.Replace(s, "cordoned: false", "cordoned: true", 1)
			case "overlay":
				dir := path.Join("clusters", ExampleCluster)
				fsys[path.Join(dir, "kustomization.yaml")] = &fstest.MapFile{Data: []byte(Overlay), Mode: 0o644}
				fsys[path.Join(dir, "priority.yaml")] = &fstest.MapFile{Data: []byte(OverlayPriority), Mode: 0o644}
			}
			fsys[p] = &fstest.MapFile{Data: []byte(s), Mode: 0o644}
			name := preset
			if v != "" {
				name += "-" + v
			}
			out = append(out, Variant{Name: name, FS: fsys})
		}
	}
	return out
}
