package fleet_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// Lines of the template's clusters/example-us-central1/cluster.yaml:
//
//	 2 apiVersion          11 preset
//	 3 kind                12 quota:
//	 5 name                13 nvidia.com/gpu: 64 (value at column 21)
//	 6 spec:               14 cpu: 1500 (value at column 10)
//	 7 displayName         15 memory: 12Ti (value at column 13)
//	 8 region              17 cordoned
//	 9 zone                19 - product (item at column 5)
//	10 residency           20 count (key at column 7)

// newCluster is a cluster directory copied from the example cluster, with its worker
// name set to name.
func newCluster(t testing.TB, dir, name string) map[string]string {
	t.Helper()
	return map[string]string{
		"clusters/" + dir + "/cluster.yaml":         edited(t, clusterFile, "name: "+example, "name: "+name),
		"clusters/" + dir + "/enrollment.sops.yaml": template(t, enrollmentFile),
	}
}

// sibling returns a file of the i-th synthetic cluster of the base fleet.
func sibling(t testing.TB, i int, file string) string {
	t.Helper()
	p := "clusters/" + fleetgen.ClusterName(i) + "/" + file
	f, ok := baseFleet()[p]
	if !ok {
		t.Fatalf("the base fleet has no %s", p)
	}
	return string(f.Data)
}

// claim renames the worker of the i-th synthetic cluster; its name is at line 4.
func claim(t testing.TB, i int, name string) map[string]string {
	t.Helper()
	own := fleetgen.ClusterName(i)
	data := sibling(t, i, "cluster.yaml")
	if !strings.Contains(data, "name: "+own+"\n") {
		t.Fatalf("cluster %s does not name itself", own)
	}
	return map[string]string{
		"clusters/" + own + "/cluster.yaml": strings.Replace(data, "name: "+own+"\n", "name: "+name+"\n", 1),
	}
}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

func TestLoadRejectsWorkerNameOtherThanItsDirectory(t *testing.T) {
	runRejects(t, []rejectCase{
		{
			name:    "metadata.name differs from the directory",
			changes: map[string]string{clusterFile: edited(t, clusterFile, "name: "+example, "name: other-name")},
			file:    clusterFile, line: 5, col: 3,
			msg: `worker name "other-name" must equal its directory's name "example-us-central1"`,
		},
		{
			name:    "metadata.name is upper case",
			changes: map[string]string{clusterFile: edited(t, clusterFile, "name: "+example, "name: Example-US-Central1")},
			file:    clusterFile, line: 5, col: 3,
			msg: `worker name "Example-US-Central1" is not a DNS label: a lowercase RFC 1123 label`,
		},
		{
			name:    "metadata.name is longer than a label",
			changes: map[string]string{clusterFile: edited(t, clusterFile, "name: "+example, "name: "+strings.Repeat("a", 64))},
			file:    clusterFile, line: 5, col: 3,
			msg: "is not a DNS label: must be no more than 63 characters",
		},
		{
			name:    "metadata.name is missing",
			changes: map[string]string{clusterFile: edited(t, clusterFile, "  name: "+example+"\n", "")},
			file:    clusterFile, line: 4, col: 10,
			msg: `metadata.name is required and must be "example-us-central1", the directory's name`,
		},
		{
			name:    "metadata.namespace is set",
			changes: map[string]string{clusterFile: edited(t, clusterFile, "  name: "+example+"\n", "  name: "+example+"\n  namespace: default\n")},
			file:    clusterFile, line: 6, col: 3,
			msg: "metadata.namespace may not be set: the hub places each tenant's clusters",
		},
		{
			name:    "directory name is upper case",
			changes: newCluster(t, "Upper-Case", "Upper-Case"),
			cluster: "Upper-Case",
			file:    "clusters/Upper-Case", line: 0, col: 0,
			msg:    `cluster directory name "Upper-Case" is not a DNS label`,
			others: true,
		},
		{
			name:    "directory name holds a dot",
			changes: newCluster(t, "eu.west", "eu.west"),
			cluster: "eu.west",
			file:    "clusters/eu.west", line: 0, col: 0,
			msg:    `cluster directory name "eu.west" is not a DNS label`,
			others: true,
		},
		{
			name:    "directory name is the fleet summary's context",
			changes: newCluster(t, "fleet", "fleet"),
			cluster: "fleet",
			file:    "clusters/fleet", line: 0, col: 0,
			msg:    `cluster directory name "fleet" is reserved: the commit status flotilla/fleet is the fleet's summary`,
			others: true,
		},
		{
			name:    "directory name is the plan's context",
			changes: newCluster(t, "plan", "plan"),
			cluster: "plan",
			file:    "clusters/plan", line: 0, col: 0,
			msg:    `cluster directory name "plan" is reserved: the commit status flotilla/plan is a pull request's plan`,
			others: true,
		},
		{
			name:    "directory name is longer than a label",
			changes: newCluster(t, strings.Repeat("b", 64), strings.Repeat("b", 64)),
			cluster: strings.Repeat("b", 64),
			file:    "clusters/" + strings.Repeat("b", 64), line: 0, col: 0,
			msg:    "must be no more than 63 characters",
			others: true,
		},
	})
}

func TestLoadRejectsWorkerNamesUsedTwice(t *testing.T) {
	runRejects(t, []rejectCase{
		{
			name:    "a cluster claims the name of a directory sorting before it",
			changes: claim(t, 0, example),
			cluster: fleetgen.ClusterName(0),
			file:    "clusters/gpu-00000/cluster.yaml", line: 4, col: 3,
			msg:    `worker name "example-us-central1" is already used by clusters/example-us-central1`,
			others: true,
		},
		{
			// The cluster whose directory has the name owns it, whatever the order.
			name:    "a cluster claims the name of a directory sorting after it",
			changes: claim(t, 0, fleetgen.ClusterName(1)),
			cluster: fleetgen.ClusterName(0),
			file:    "clusters/gpu-00000/cluster.yaml", line: 4, col: 3,
			msg:    `worker name "gpu-00001" is already used by clusters/gpu-00001`,
			others: true,
		},
		{
			name:       "two clusters claim a name no directory has",
			changes:    merge(claim(t, 0, "shared"), claim(t, 2, "shared")),
			cluster:    fleetgen.ClusterName(2),
			alsoBroken: []string{fleetgen.ClusterName(0)},
			file:       "clusters/gpu-00002/cluster.yaml", line: 4, col: 3,
			msg:    `worker name "shared" is already used by clusters/gpu-00000`,
			others: true,
		},
	})

	// The first claimant of a free name is only wrong about its directory.
	f := loadWith(t, merge(claim(t, 0, "shared"), claim(t, 2, "shared")))
	wantOnlyError(t, clusterErrors(t, f, fleetgen.ClusterName(0)), "clusters/gpu-00000/cluster.yaml", 4, 3,
		`worker name "shared" must equal its directory's name "gpu-00000"`)
}

func TestLoadRejectsPresetMissingFromPresets(t *testing.T) {
	runRejects(t, []rejectCase{
		{
			name:    "no such preset",
			changes: map[string]string{clusterFile: edited(t, clusterFile, "preset: gke-dws", "preset: tpu")},
			file:    clusterFile, line: 11, col: 3,
			msg: `preset "tpu" does not exist under presets/ (have: gke-dws, gpu)`,
		},
		{
			name:    "a path instead of a preset",
			changes: map[string]string{clusterFile: edited(t, clusterFile, "preset: gke-dws", "preset: ../presets/gpu")},
			file:    clusterFile, line: 11, col: 3,
			msg: `preset "../presets/gpu" does not exist under presets/ (have: gke-dws, gpu)`,
		},
		{
			name:    "empty preset",
			changes: map[string]string{clusterFile: edited(t, clusterFile, "preset: gke-dws", `preset: ""`)},
			file:    clusterFile, line: 11, col: 3,
			msg: "spec.preset is required; presets are the directories under presets/",
		},
		{
			name:    "no preset key",
			changes: map[string]string{clusterFile: edited(t, clusterFile, "  preset: gke-dws\n", "")},
			file:    clusterFile, line: 7, col: 3,
			msg: "spec.preset is required",
		},
	})

	t.Run("no presets at all", func(t *testing.T) {
		changes := map[string]string{}
		for p := range baseFleet() {
			if strings.HasPrefix(p, "presets/") {
				changes[p] = removed
			}
		}
		f := loadWith(t, changes)
		wantError(t, clusterErrors(t, f, example), clusterFile, 11, 3, `preset "gke-dws" does not exist under presets/ (have: none)`)
	})
}

func TestLoadFailsOnlyTheClustersOfABrokenPreset(t *testing.T) {
	// gpu-00001 uses the preset gpu; the example cluster, gpu-00000 and gpu-00002 use
	// gke-dws.
	f := loadWith(t, map[string]string{
		"presets/gpu/kustomization.yaml": "resources:\n  - ../../clusters/" + example + "/cluster.yaml\n",
	})
	wantOnlyError(t, f.Errors, "presets/gpu/kustomization.yaml", 2, 5,
		`"../../clusters/example-us-central1/cluster.yaml" resolves to clusters/example-us-central1/cluster.yaml, outside presets`)
	if f.Valid() {
		t.Fatal("fleet with a broken preset is valid")
	}
	broken := fleetgen.ClusterName(1)
	wantOnlyError(t, clusterErrors(t, f, broken), "clusters/"+broken+"/cluster.yaml", 9, 3,
		`preset "gpu" has errors; fix presets/gpu first`)
	for _, name := range []string{example, fleetgen.ClusterName(0), fleetgen.ClusterName(2)} {
		if c := f.Clusters[name]; !c.Valid() {
			t.Errorf("cluster %s on the intact preset is not valid:\n%s", name, describe(c.Errors))
		}
	}
}

func TestLoadRejectsInvalidPresets(t *testing.T) {
	cases := []struct {
		name      string
		changes   map[string]string
		file      string
		line, col int
		msg       string
	}{
		{
			name:    "preset without kustomization.yaml",
			changes: map[string]string{"presets/tpu/queues.yaml": template(t, "presets/gpu/queues.yaml")},
			file:    "presets/tpu",
			msg:     "preset has no kustomization.yaml",
		},
		{
			name: "preset directory name is not a label",
			changes: map[string]string{
				"presets/GPU_2/kustomization.yaml": template(t, "presets/gpu/kustomization.yaml"),
				"presets/GPU_2/queues.yaml":        template(t, "presets/gpu/queues.yaml"),
			},
			file: "presets/GPU_2",
			msg:  `preset name "GPU_2" is not a DNS label`,
		},
		{
			name:    "preset names a missing file",
			changes: map[string]string{"presets/gpu/kustomization.yaml": edited(t, "presets/gpu/kustomization.yaml", "queues.yaml", "queue.yaml")},
			file:    "presets/gpu/kustomization.yaml", line: 6, col: 5,
			msg: `"queue.yaml" does not exist in the repository (remote bases are not allowed)`,
		},
		{
			name:    "preset resource is not YAML",
			changes: map[string]string{"presets/gpu/queues.yaml": "kind: [ResourceFlavor\n"},
			file:    "presets/gpu/queues.yaml", line: 2,
			msg: "invalid YAML: did not find expected ',' or ']'",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := loadWith(t, tc.changes)
			wantOnlyError(t, f.Errors, tc.file, tc.line, tc.col, tc.msg)
			if f.Valid() {
				t.Fatal("fleet with a broken preset is valid")
			}
			if f.Clusters[example] == nil || !f.Clusters[example].Valid() {
				t.Fatalf("the example cluster, on gke-dws, is not valid:\n%s", describe(f.Clusters[example].Errors))
			}
		})
	}
}

func TestLoadRejectsResidencyOutsideAllowedResidencies(t *testing.T) {
	runRejects(t, []rejectCase{
		{
			name:    "residency not in the list",
			changes: map[string]string{clusterFile: edited(t, clusterFile, "residency: us", "residency: apac")},
			file:    clusterFile, line: 10, col: 3,
			msg: `residency "apac" is not allowed in this fleet; fleet.yaml allows us, eu`,
		},
		{
			name:    "residency in the wrong case",
			changes: map[string]string{clusterFile: edited(t, clusterFile, "residency: us", "residency: US")},
			file:    clusterFile, line: 10, col: 3,
			msg: `residency "US" is not allowed in this fleet`,
		},
		{
			name:    "residency empty",
			changes: map[string]string{clusterFile: edited(t, clusterFile, "residency: us", `residency: ""`)},
			file:    clusterFile, line: 10, col: 3,
			msg: "spec.residency is required",
		},
		{
			name:    "region empty",
			changes: map[string]string{clusterFile: edited(t, clusterFile, "region: us-central1", `region: ""`)},
			file:    clusterFile, line: 8, col: 3,
			msg: "spec.region is required",
		},
	})
}

func TestLoadAllowsAnyResidencyWhenTheFleetListsNone(t *testing.T) {
	list := "  # Leave empty to allow any residency.\n  allowedResidencies:\n    - us\n    - eu\n"
	for name, fleetFile := range map[string]string{
		"no allowedResidencies": edited(t, "fleet.yaml", list, ""),
		"empty list":            edited(t, "fleet.yaml", list, "  allowedResidencies: []\n"),
	} {
		t.Run(name, func(t *testing.T) {
			f := loadWith(t, map[string]string{
				"fleet.yaml": fleetFile,
				clusterFile:  edited(t, clusterFile, "residency: us", "residency: anywhere-at-all"),
			})
			wantNoErrors(t, f)
			if got := f.Clusters[example].Object.Spec.Residency; got != "anywhere-at-all" {
				t.Fatalf("residency = %q", got)
			}
		})
	}
}

func TestLoadRejectsQuotaThatIsNotANonNegativeQuantity(t *testing.T) {
	cpu := func(v string) map[string]string {
		return map[string]string{clusterFile: edited(t, clusterFile, "cpu: 1500", "cpu: "+v)}
	}
	runRejects(t, []rejectCase{
		{name: "not a quantity", changes: cpu("lots"), file: clusterFile, line: 14, col: 10,
			msg: `quota for cpu: "lots" is not a quantity (such as 8, 500m or 64Gi)`},
		{name: "unknown suffix", changes: map[string]string{clusterFile: edited(t, clusterFile, "memory: 12Ti", "memory: 12TB")},
			file: clusterFile, line: 15, col: 13, msg: `quota for memory: "12TB" is not a quantity`},
		{name: "negative", changes: cpu("-1"), file: clusterFile, line: 14, col: 10,
			msg: "quota for cpu may not be negative"},
		{name: "negative milli", changes: cpu("-500m"), file: clusterFile, line: 14, col: 10,
			msg: "quota for cpu may not be negative"},
		// ParseQuantity would compute 10^999999999 for this one.
		{name: "exponent far out", changes: cpu("1e-999999999"), file: clusterFile, line: 14, col: 10,
			msg: "quota for cpu has the exponent -999999999; a quantity's exponent is between -100 and 100"},
		{name: "exponent far out, upper case", changes: cpu("1E999999999"), file: clusterFile, line: 14, col: 10,
			msg: "quota for cpu has the exponent 999999999"},
		{name: "too long", changes: cpu("0." + strings.Repeat("0", 100) + "1"), file: clusterFile, line: 14, col: 10,
			msg: "quota for cpu is 103 characters long; a quantity such as 8, 500m or 64Gi has at most 64"},
		{name: "bool", changes: cpu("true"), file: clusterFile, line: 14, col: 10,
			msg: "quota for cpu must be a quantity such as 8, 500m or 64Gi"},
		{name: "null", changes: cpu("null"), file: clusterFile, line: 14, col: 10,
			msg: "quota for cpu must be a quantity such as 8, 500m or 64Gi"},
		{name: "tilde", changes: cpu("~"), file: clusterFile, line: 14, col: 10,
			msg: "quota for cpu must be a quantity such as 8, 500m or 64Gi"},
		{name: "list", changes: cpu("[1500]"), file: clusterFile, line: 14, col: 10,
			msg: "quota for cpu must be a quantity such as 8, 500m or 64Gi"},
		{name: "mapping", changes: cpu("{value: 1500}"), file: clusterFile, line: 14, col: 10,
			msg: "quota for cpu must be a quantity such as 8, 500m or 64Gi"},
		{name: "resource name", changes: map[string]string{clusterFile: edited(t, clusterFile, "    cpu: 1500", "    cpu/x/y: 1500")},
			file: clusterFile, line: 14, col: 5, msg: `quota resource "cpu/x/y" is not a valid resource name`},
		{name: "quota is no mapping", changes: map[string]string{
			clusterFile: edited(t, clusterFile, "  quota:\n    nvidia.com/gpu: 64\n    cpu: 1500\n    memory: 12Ti\n", "  quota: 64\n")},
			file: clusterFile, line: 12, col: 3, msg: "spec.quota: expected a mapping, got number"},
	})
}

func TestLoadAcceptsQuotaQuantities(t *testing.T) {
	f := loadWith(t, map[string]string{clusterFile: edited(t, clusterFile,
		"    nvidia.com/gpu: 64\n    cpu: 1500\n    memory: 12Ti\n",
		"    nvidia.com/gpu: \"8\"\n    cpu: 500m\n    memory: 1.5Gi\n    ephemeral-storage: 1e3\n    pods: 0\n    example.com/exa: 2E\n    example.com/tiny: 1e-100\n")})
	wantNoErrors(t, f)
	q := f.Clusters[example].Object.Spec.Quota
	for res, want := range map[string]string{"nvidia.com/gpu": "8", "cpu": "500m", "memory": "1536Mi", "ephemeral-storage": "1e3", "pods": "0", "example.com/exa": "2E", "example.com/tiny": "1e-9"} {
		got, ok := q[corev1.ResourceName(res)]
		if !ok {
			t.Errorf("quota has no %s: %v", res, q)
			continue
		}
		if got.String() != want {
			t.Errorf("quota for %s = %s, want %s", res, got.String(), want)
		}
	}
}

func TestLoadRejectsUnknownDuplicateAndMistypedFields(t *testing.T) {
	replace := func(old, new string) map[string]string {
		return map[string]string{clusterFile: edited(t, clusterFile, old, new)}
	}
	runRejects(t, []rejectCase{
		{name: "unknown field in spec", changes: replace("cordoned: false", "cordonned: true"),
			file: clusterFile, line: 17, col: 3, msg: `unknown field "spec.cordonned"`},
		{name: "unknown field at the top", changes: map[string]string{clusterFile: template(t, clusterFile) + "statuz: {}\n"},
			file: clusterFile, line: 21, col: 1, msg: `unknown field "statuz"`},
		{name: "unknown field in a list item", changes: replace("      count: 64\n", "      count: 64\n      vendor: nvidia\n"),
			file: clusterFile, line: 21, col: 7, msg: `unknown field "spec.expectedGPUs[0].vendor"`},
		{name: "duplicate key", changes: replace("  zone: us-central1-a\n", "  zone: us-central1-a\n  region: europe-west4\n"),
			file: clusterFile, line: 10, col: 3, msg: `duplicate key "region"; it is already set at line 8`},
		{name: "duplicate quota", changes: replace("    cpu: 1500\n", "    cpu: 1500\n    cpu: 2\n"),
			file: clusterFile, line: 15, col: 5, msg: `duplicate key "cpu"; it is already set at line 14`},
		{name: "duplicate spec", changes: map[string]string{clusterFile: template(t, clusterFile) + "spec: 5\n"},
			file: clusterFile, line: 21, col: 1, msg: `duplicate key "spec"; it is already set at line 6`},
		{name: "string for a bool", changes: replace("cordoned: false", "cordoned: yes please"),
			file: clusterFile, line: 17, col: 3, msg: "spec.cordoned: expected true or false, got string"},
		{name: "string for an integer", changes: replace("count: 64", "count: many"),
			file: clusterFile, line: 19, col: 5, msg: "spec.expectedGPUs.count: expected an integer, got string"},
		{name: "list for a string", changes: replace("displayName: Example GKE cluster in Iowa", "displayName: [Example]"),
			file: clusterFile, line: 7, col: 3, msg: "spec.displayName: expected a string, got array"},
		{name: "string for a mapping", changes: replace("metadata:\n  name: "+example+"\n", "metadata: "+example+"\n"),
			file: clusterFile, line: 4, col: 1, msg: "metadata: expected a mapping, got string", others: true},
		{name: "wrong kind", changes: replace("kind: WorkerCluster", "kind: Cluster"),
			file: clusterFile, line: 3, col: 1, msg: `kind must be WorkerCluster, not "Cluster"`},
		{name: "wrong apiVersion", changes: replace("apiVersion: flotilla.dev/v1alpha1", "apiVersion: v1"),
			file: clusterFile, line: 2, col: 1, msg: `apiVersion must be flotilla.dev/v1alpha1, not "v1"`},
	})
}

func TestLoadRejectsInvalidExpectedGPUs(t *testing.T) {
	replace := func(old, new string) map[string]string {
		return map[string]string{clusterFile: edited(t, clusterFile, old, new)}
	}
	runRejects(t, []rejectCase{
		{name: "count zero", changes: replace("count: 64", "count: 0"),
			file: clusterFile, line: 20, col: 7, msg: "expected GPU count must be at least 1"},
		{name: "no product", changes: replace("- product: NVIDIA-H100-80GB-HBM3\n      count", "- count"),
			file: clusterFile, line: 19, col: 7, msg: "expected GPU needs a product"},
		{name: "product twice", changes: replace("      count: 64\n", "      count: 64\n    - product: NVIDIA-H100-80GB-HBM3\n      count: 8\n"),
			file: clusterFile, line: 21, col: 7, msg: `GPU product "NVIDIA-H100-80GB-HBM3" is listed twice`},
	})
}

func TestLoadRejectsClusterFileThatIsNotOneMapping(t *testing.T) {
	runRejects(t, []rejectCase{
		{name: "second document", changes: map[string]string{clusterFile: template(t, clusterFile) + "---\napiVersion: v1\nkind: ConfigMap\n"},
			file: clusterFile, line: 21, col: 1, msg: "file must hold a single YAML document; a second one starts here"},
		{name: "trailing separator", changes: map[string]string{clusterFile: template(t, clusterFile) + "---\n"},
			file: clusterFile, line: 21, col: 1, msg: "file must hold a single YAML document"},
		{name: "second document after a leading separator", changes: map[string]string{clusterFile: "---\n" + template(t, clusterFile) + "---\n# more\nkind: WorkerCluster\n"},
			file: clusterFile, line: 22, col: 1, msg: "file must hold a single YAML document"},
		{name: "empty", changes: map[string]string{clusterFile: ""},
			file: clusterFile, msg: "file is empty"},
		{name: "only comments", changes: map[string]string{clusterFile: "# nothing yet\n"},
			file: clusterFile, msg: "file is empty"},
		{name: "a list", changes: map[string]string{clusterFile: "- apiVersion: flotilla.dev/v1alpha1\n"},
			file: clusterFile, line: 1, col: 1, msg: "expected a YAML mapping at the top of the file"},
		{name: "invalid YAML", changes: map[string]string{clusterFile: edited(t, clusterFile, "region: us-central1", "region: [us-central1")},
			file: clusterFile, line: 8, msg: "invalid YAML: did not find expected ',' or ']'"},
		{name: "missing", changes: map[string]string{clusterFile: removed},
			file: exampleDir, msg: "cluster directory has no cluster.yaml"},
	})
}

// A valid cluster keeps its decoded object and every file of its directory.
func TestLoadOfValidClusterKeepsItsObjectAndFiles(t *testing.T) {
	f := loadWith(t, nil)
	wantNoErrors(t, f)
	c := f.Clusters[example]
	if c.Name != example || c.Dir != exampleDir {
		t.Fatalf("cluster is %s in %s", c.Name, c.Dir)
	}
	if c.Object == nil || c.Object.Name != example || c.Object.Spec.Preset != "gke-dws" || c.Object.Spec.Quota.Cpu().Value() != 1500 {
		t.Fatalf("unexpected object %+v", c.Object)
	}
	if string(c.Enrollment()) != template(t, enrollmentFile) {
		t.Fatal("Enrollment is not the enrollment file")
	}
	if c.Overlay() != nil {
		t.Fatal("the example cluster has no overlay")
	}
	withOverlay := f.Clusters[fleetgen.ClusterName(1)]
	if string(withOverlay.Overlay()) != fleetgen.Overlay {
		t.Fatal("Overlay is not the kustomization.yaml")
	}
	if got := len(withOverlay.Files); got != 4 {
		t.Fatalf("cluster with an overlay has %d files, want 4", got)
	}
}
