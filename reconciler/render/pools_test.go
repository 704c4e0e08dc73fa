package render_test

import (
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/flotilla-gitops/flotilla/reconciler/render"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// gpuQueues is the gpu preset's queues.yaml with more objects after it.
func gpuQueues(t *testing.T, more string) string {
	t.Helper()
	return string(fleetgen.Template()["presets/gpu/queues.yaml"].Data) + more
}

// interactive is a second ClusterQueue and a LocalQueue named name feeding it, for a
// preset of two queues.
func interactive(name string) string {
	return "---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: ClusterQueue\nmetadata:\n  name: interactive\nspec:\n  namespaceSelector: {}\n" +
		"---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: LocalQueue\nmetadata:\n  name: " + name + "\nspec:\n  clusterQueue: interactive\n"
}

func TestRenderGivesEveryWorkerItsPoolsLocalQueue(t *testing.T) {
	toGPU := replace("preset: gke-dws", "preset: gpu")
	cases := []struct {
		name string
		// dispatch is appended to fleet.yaml, whose workload namespaces are ml-training
		// and ml-inference.
		dispatch string
		edit     func(string) string
		// files replace files of the repository.
		files map[string]string
		// want is every LocalQueue rendered, as namespace/name -> ClusterQueue.
		want []string
	}{
		{
			name: "dispatch on by default: the pool of the residency, in every workload namespace",
			want: []string{
				"ml-inference/us -> cluster-queue", "ml-inference/user-queue -> cluster-queue",
				"ml-training/us -> cluster-queue", "ml-training/user-queue -> cluster-queue",
			},
		},
		{
			name:     "a cluster in a declared pool gets that pool's name",
			dispatch: "  dispatch:\n    pools:\n      - name: us-h100\n        residency: us\n        clusters:\n          - " + example + "\n",
			want: []string{
				"ml-inference/us-h100 -> cluster-queue", "ml-inference/user-queue -> cluster-queue",
				"ml-training/us-h100 -> cluster-queue", "ml-training/user-queue -> cluster-queue",
			},
		},
		{
			name:     "a cordoned cluster keeps its pool's queue",
			dispatch: "  dispatch:\n    enabled: true\n",
			edit:     replace("cordoned: false", "cordoned: true"),
			want: []string{
				"ml-inference/us -> cluster-queue", "ml-inference/user-queue -> cluster-queue",
				"ml-training/us -> cluster-queue", "ml-training/user-queue -> cluster-queue",
			},
		},
		{
			name:     "dispatch off: no pool queue",
			dispatch: "  dispatch:\n    enabled: false\n",
			want:     []string{"ml-inference/user-queue -> cluster-queue", "ml-training/user-queue -> cluster-queue"},
		},
		{
			// aa-interactive sorts first by name, but user-queue comes first in the file.
			name:  "the pool queue feeds the ClusterQueue of the first LocalQueue in the preset's files",
			edit:  toGPU,
			files: map[string]string{"presets/gpu/queues.yaml": gpuQueues(t, interactive("aa-interactive"))},
			want: []string{
				"ml-inference/aa-interactive -> interactive", "ml-inference/us -> cluster-queue", "ml-inference/user-queue -> cluster-queue",
				"ml-training/aa-interactive -> interactive", "ml-training/us -> cluster-queue", "ml-training/user-queue -> cluster-queue",
			},
		},
		{
			name:  "a preset with a LocalQueue named like the pool gets no second one",
			edit:  toGPU,
			files: map[string]string{"presets/gpu/queues.yaml": gpuQueues(t, interactive("us"))},
			want: []string{
				"ml-inference/us -> interactive", "ml-inference/user-queue -> cluster-queue",
				"ml-training/us -> interactive", "ml-training/user-queue -> cluster-queue",
			},
		},
		{
			name: "a preset without LocalQueues: the pool queue beside the default one",
			edit: toGPU,
			files: map[string]string{"presets/gpu/queues.yaml": func() string {
				q := gpuQueues(t, "")
				return q[:strings.LastIndex(q, "---")]
			}()},
			want: []string{
				"ml-inference/us -> cluster-queue", "ml-inference/" + render.DefaultLocalQueue + " -> cluster-queue",
				"ml-training/us -> cluster-queue", "ml-training/" + render.DefaultLocalQueue + " -> cluster-queue",
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fsys := withCluster(t, tc.edit, nil)
			fleetFile := strings.Replace(string(fsys["fleet.yaml"].Data), "    - ml-training\n", "    - ml-training\n    - ml-inference\n", 1)
			fsys["fleet.yaml"] = &fstest.MapFile{Data: []byte(fleetFile + tc.dispatch)}
			for p, data := range tc.files {
				if _, ok := fsys[p]; !ok {
					t.Fatalf("the template has no %s", p)
				}
				fsys[p] = &fstest.MapFile{Data: []byte(data)}
			}
			res, err := render.New().Render(load(t, fsys), example)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			var got []string
			for _, o := range res.Objects {
				if o.GetKind() != "LocalQueue" {
					continue
				}
				cq, _, _ := unstructuredString(o.Object, "spec", "clusterQueue")
				got = append(got, o.GetNamespace()+"/"+o.GetName()+" -> "+cq)
				if o.GetLabels()["flotilla.dev/worker-cluster"] != res.Identity {
					t.Errorf("LocalQueue %s/%s lacks the ownership labels: %v", o.GetNamespace(), o.GetName(), o.GetLabels())
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("LocalQueues:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
}

func TestRenderOfAnotherPoolChangesTheDesiredGeneration(t *testing.T) {
	hash := func(dispatch string) string {
		t.Helper()
		fsys := withCluster(t, same, nil)
		fsys["fleet.yaml"] = &fstest.MapFile{Data: append(append([]byte{}, fsys["fleet.yaml"].Data...), dispatch...)}
		res, err := render.New().Render(load(t, fsys), example)
		if err != nil {
			t.Fatal(err)
		}
		return res.Hash
	}
	def := hash("")
	// Neither belongs to what the worker gets: the hub alone drains.
	if hash("  dispatch:\n    enabled: true\n    drainGracePeriod: 5m\n") != def {
		t.Error("enabled: true or a drain grace period changed the desired generation")
	}
	if hash("  dispatch:\n    pools:\n      - name: us-h100\n        residency: us\n        clusters:\n          - "+example+"\n") == def {
		t.Error("moving the cluster to another pool left the desired generation as it was")
	}
	if hash("  dispatch:\n    enabled: false\n") == def {
		t.Error("turning dispatch off left the desired generation as it was")
	}
}
