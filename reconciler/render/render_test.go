package render_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/reconciler/render"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

const example = fleetgen.ExampleCluster

// withCluster returns the template with the example cluster's cluster.yaml edited and
// extra files added to its directory.
func withCluster(t *testing.T, edit func(string) string, extra map[string]string) fstest.MapFS {
	t.Helper()
	fsys := fleetgen.Template()
	p := "clusters/" + example + "/cluster.yaml"
	if edit != nil {
		orig := string(fsys[p].Data)
		changed := edit(orig)
		if changed == orig {
			t.Fatalf("edit of %s changed nothing", p)
		}
		fsys[p] = &fstest.MapFile{Data: []byte(changed)}
	}
	for name, data := range extra {
		fsys["clusters/"+example+"/"+name] = &fstest.MapFile{Data: []byte(data)}
	}
	return fsys
}

// same leaves cluster.yaml as the template has it.
var same func(string) string

func replace(old, new string) func(string) string {
	return func(s string) string { return strings.Replace(s, old, new, 1) }
}

func load(t *testing.T, fsys fstest.MapFS) *fleet.Fleet {
	t.Helper()
	f := fleet.Load(fsys)
	if errs := f.AllErrors(); len(errs) > 0 {
		t.Fatalf("fleet does not load:\n%v", errs)
	}
	return f
}

func TestRenderMatchesGoldenFiles(t *testing.T) {
	for _, v := range fleetgen.Variants() {
		t.Run(v.Name, func(t *testing.T) {
			f := load(t, v.FS)
			res, err := render.New().Render(f, example)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			got, err := res.YAML()
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", v.Name+".yaml")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./reconciler/render -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("render of %s differs from %s (run with -update if the change is intended):\n%s", v.Name, golden, got)
			}
		})
	}
}

func TestRenderIsDeterministic(t *testing.T) {
	fsys := fleetgen.Fleet(40, fleetgen.Options{CordonEvery: 3, OverlayEvery: 4})
	first := map[string]string{}
	shared := render.New()
	for round := range 5 {
		// A fresh load and, every other round, a fresh renderer: neither map order nor the
		// preset cache may show in the output.
		f := load(t, fsys)
		r := shared
		if round%2 == 1 {
			r = render.New()
		}
		for _, name := range f.ClusterNames() {
			res, err := r.Render(f, name)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			y, err := res.YAML()
			if err != nil {
				t.Fatal(err)
			}
			if round == 0 {
				first[name] = string(y)
				continue
			}
			if string(y) != first[name] {
				t.Fatalf("round %d: %s rendered differently", round, name)
			}
		}
	}
}

func TestRenderHashChangesWithContent(t *testing.T) {
	base := load(t, withCluster(t, same, nil))
	cordoned := load(t, withCluster(t, replace("cordoned: false", "cordoned: true"), nil))
	quota := load(t, withCluster(t, replace("nvidia.com/gpu: 64", "nvidia.com/gpu: 65"), nil))
	comment := load(t, withCluster(t, replace("# One worker", "# Just one worker"), nil))
	unmanaged := load(t, withCluster(t, replace("  cordoned: false\n", "  cordoned: false\n  components:\n    managed: false\n"), nil))
	mirrored := withCluster(t, same, nil)
	mirrored["fleet.yaml"].Data = []byte(strings.Replace(string(mirrored["fleet.yaml"].Data), "    managed: true\n", "    managed: true\n    registry: mirror.example.com\n", 1))
	hash := func(f *fleet.Fleet) string {
		res, err := render.New().Render(f, example)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(res.Hash, "sha256:") || len(res.Hash) != len("sha256:")+64 {
			t.Fatalf("hash %q is not sha256:<64 hex>", res.Hash)
		}
		return res.Hash
	}
	h := hash(base)
	if hash(cordoned) == h {
		t.Error("cordoning the cluster did not change its desired generation")
	}
	if hash(quota) == h {
		t.Error("changing the quota did not change the desired generation")
	}
	if hash(unmanaged) == h {
		t.Error("handing the cluster's Kueue to its team did not change the desired generation")
	}
	if hash(load(t, mirrored)) == h {
		t.Error("a registry mirror for the components did not change the desired generation")
	}
	if hash(comment) != h {
		t.Error("a comment in cluster.yaml changed the desired generation")
	}
}

func TestRenderPlacesQueuesAndNamespaces(t *testing.T) {
	fsys := withCluster(t, same, nil)
	fsys["fleet.yaml"] = &fstest.MapFile{Data: []byte(strings.Replace(string(fsys["fleet.yaml"].Data),
		"    - ml-training\n", "    - ml-training\n    - ml-inference\n", 1))}
	res, err := render.New().Render(load(t, fsys), example)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range res.Objects {
		got = append(got, o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName())
		if o.GetLabels()["flotilla.dev/worker-cluster"] != res.Identity || o.GetLabels()["flotilla.dev/managed-by"] != "flotilla" {
			t.Errorf("%s %s lacks the ownership labels: %v", o.GetKind(), o.GetName(), o.GetLabels())
		}
		if o.GetKind() == "Namespace" {
			if a := o.GetAnnotations(); a["flotilla.dev/apply"] != "IfNotPresent" || a["flotilla.dev/prune"] != "disabled" {
				t.Errorf("namespace %s is not marked create-only and never-pruned: %v", o.GetName(), a)
			}
		}
	}
	want := []string{
		"Namespace//ml-inference",
		"Namespace//ml-training",
		"ResourceFlavor//default-flavor",
		"ProvisioningRequestConfig//dws-config",
		"AdmissionCheck//dws-prov",
		"ClusterQueue//cluster-queue",
		// The dispatch pool's queue, named as on the hub, beside the preset's.
		"LocalQueue/ml-inference/us",
		"LocalQueue/ml-inference/user-queue",
		"LocalQueue/ml-training/us",
		"LocalQueue/ml-training/user-queue",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("objects:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if res.Identity != "7-example-"+example {
		t.Errorf("identity %q", res.Identity)
	}
}

func TestRenderDefaultsLocalQueueForSingleClusterQueue(t *testing.T) {
	fsys := withCluster(t, replace("preset: gke-dws", "preset: gpu"), nil)
	q := string(fsys["presets/gpu/queues.yaml"].Data)
	i := strings.LastIndex(q, "---")
	fsys["presets/gpu/queues.yaml"] = &fstest.MapFile{Data: []byte(q[:i])}
	res, err := render.New().Render(load(t, fsys), example)
	if err != nil {
		t.Fatal(err)
	}
	last := res.Objects[len(res.Objects)-1]
	if cq, _, _ := unstructuredString(last.Object, "spec", "clusterQueue"); last.GetKind() != "LocalQueue" ||
		last.GetName() != render.DefaultLocalQueue || last.GetNamespace() != "ml-training" || cq != "cluster-queue" {
		t.Errorf("last object is %s %s/%s for %q, want LocalQueue ml-training/%s for cluster-queue",
			last.GetKind(), last.GetNamespace(), last.GetName(), cq, render.DefaultLocalQueue)
	}
}

func unstructuredString(obj map[string]any, fields ...string) (string, bool, error) {
	var cur any = obj
	for _, f := range fields {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		cur = m[f]
	}
	s, ok := cur.(string)
	return s, ok, nil
}

func TestRenderRefuses(t *testing.T) {
	clusterFile := "clusters/" + example + "/cluster.yaml"
	overlayFile := "clusters/" + example + "/kustomization.yaml"
	overlay := func(extra string) map[string]string {
		return map[string]string{
			"kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - extra.yaml\n",
			"extra.yaml":         extra,
		}
	}
	cases := []struct {
		name  string
		edit  func(string) string
		extra map[string]string
		file  string
		msg   string
	}{
		{
			name:  "objects that are not Kueue's",
			extra: overlay("apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: admin\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}\n"),
			file:  overlayFile,
			msg:   `ClusterRoleBinding "admin" (rbac.authorization.k8s.io/v1) cannot be rendered`,
		},
		{
			name:  "Kueue objects of an older API version",
			extra: overlay("apiVersion: kueue.x-k8s.io/v1beta1\nkind: ResourceFlavor\nmetadata:\n  name: old\n"),
			file:  overlayFile,
			msg:   `ResourceFlavor "old" uses kueue.x-k8s.io/v1beta1`,
		},
		{
			name:  "objects that choose their namespace",
			extra: overlay("apiVersion: kueue.x-k8s.io/v1beta2\nkind: LocalQueue\nmetadata:\n  name: q\n  namespace: kube-system\nspec:\n  clusterQueue: cluster-queue\n"),
			file:  overlayFile,
			msg:   `sets metadata.namespace "kube-system"`,
		},
		{
			name: "quota for a resource no ClusterQueue covers",
			edit: replace("    cpu: 1500\n", "    cpu: 1500\n    example.com/fpga: 4\n"),
			file: clusterFile,
			msg:  "quota for example.com/fpga: no ClusterQueue of preset \"gke-dws\" covers",
		},
		{
			name:  "an object rendered twice",
			extra: overlay("apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata:\n  name: default-flavor\n"),
			file:  overlayFile,
			msg:   "default-flavor",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := load(t, withCluster(t, tc.edit, tc.extra))
			_, err := render.New().Render(f, example)
			list, ok := err.(fleet.ErrorList)
			if !ok || len(list) == 0 {
				t.Fatalf("err = %v (%T), want a fleet.ErrorList", err, err)
			}
			if list[0].File != tc.file || !strings.Contains(list[0].Message, tc.msg) || list[0].Cluster != example {
				t.Errorf("error %q (file %s, cluster %s), want file %s containing %q", list[0].Message, list[0].File, list[0].Cluster, tc.file, tc.msg)
			}
		})
	}
}

func TestRenderRefusesInvalidCluster(t *testing.T) {
	f := fleet.Load(withCluster(t, replace("region: us-central1", "region: \"\""), nil))
	_, err := render.New().Render(f, example)
	if list, ok := err.(fleet.ErrorList); !ok || !strings.Contains(list.Error(), "spec.region is required") {
		t.Fatalf("err = %v, want the cluster's validation errors", err)
	}
}

// TestRenderersCacheRendersWhatAFreshRendererRenders pins the preset and overlay caches
// to what rendering without them gives: for clusters that share an overlay but not
// their quota, for one whose overlay reads a file of its own that differs, and after a
// caller changed the objects of an earlier result.
func TestRenderersCacheRendersWhatAFreshRendererRenders(t *testing.T) {
	fsys := fleetgen.Fleet(6, fleetgen.Options{OverlayEvery: 2, CordonEvery: 3})
	fsys["clusters/"+fleetgen.ClusterName(5)+"/priority.yaml"] = &fstest.MapFile{
		Data: []byte(strings.Replace(fleetgen.OverlayPriority, "value: 1000", "value: 2000", 1)),
	}
	f := load(t, fsys)
	shared := render.New()
	for round := range 2 {
		for _, name := range f.ClusterNames() {
			got, err := shared.Render(f, name)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			want, err := render.New().Render(f, name)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			gotYAML, err := got.YAML()
			if err != nil {
				t.Fatal(err)
			}
			wantYAML, err := want.YAML()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(gotYAML, wantYAML) {
				t.Errorf("round %d, %s: the cached render differs from a fresh one:\n%s\nwant:\n%s", round, name, gotYAML, wantYAML)
			}
			// What a caller does with a result is no business of the next render.
			for _, o := range got.Objects {
				o.SetLabels(map[string]string{"changed": "by the caller"})
				o.Object["spec"] = "changed by the caller"
			}
		}
	}
	a, err := shared.Render(f, fleetgen.ClusterName(1))
	if err != nil {
		t.Fatal(err)
	}
	b, err := shared.Render(f, fleetgen.ClusterName(5))
	if err != nil {
		t.Fatal(err)
	}
	if a.Hash == b.Hash {
		t.Error("two overlays that read different priority.yaml render the same")
	}
}
