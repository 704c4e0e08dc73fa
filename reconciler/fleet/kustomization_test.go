package fleet_test

import (
	"testing"

	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// overlayHead is the first two lines of every overlay below; what follows starts at
// line 3.
const overlayHead = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"

// overlay returns the changes that give the example cluster kustomization.yaml with body
// after overlayHead, and the extra object priority.yaml.
func overlay(body string) map[string]string {
	return map[string]string{
		overlayFile:                   overlayHead + body,
		exampleDir + "/priority.yaml": fleetgen.OverlayPriority,
	}
}

// resource is an overlay whose only resource, at line 4 column 5, is ref.
func resource(ref string) map[string]string { return overlay("resources:\n  - " + ref + "\n") }

func TestLoadRejectsOverlayNamingFilesOutsideClusterAndPresets(t *testing.T) {
	at4 := func(name string, changes map[string]string, msg string) rejectCase {
		return rejectCase{name: name, changes: changes, file: overlayFile, line: 4, col: 5, msg: msg}
	}
	runRejects(t, []rejectCase{
		at4("another cluster's file", resource("../gpu-00000/cluster.yaml"),
			`"../gpu-00000/cluster.yaml" resolves to clusters/gpu-00000/cluster.yaml, outside clusters/example-us-central1 and presets; overlays may only name files in their own directory and presets/`),
		at4("another cluster's directory", resource("../gpu-00001"),
			`"../gpu-00001" resolves to clusters/gpu-00001, outside clusters/example-us-central1 and presets`),
		at4("fleet.yaml", resource("../../fleet.yaml"),
			`"../../fleet.yaml" resolves to fleet.yaml, outside`),
		at4("out of the repository", resource("../../../etc/passwd"),
			`"../../../etc/passwd" resolves to ../etc/passwd, outside`),
		at4("out and back in", resource("../../../repo/clusters/example-us-central1/priority.yaml"),
			`resolves to ../repo/clusters/example-us-central1/priority.yaml, outside`),
		at4("absolute path", resource("/etc/passwd"),
			`"/etc/passwd" is an absolute path; name files relative to clusters/example-us-central1`),
		at4("https URL", resource("https://github.com/kubernetes-sigs/kueue//config/default?ref=v0.17.0"),
			`"https://github.com/kubernetes-sigs/kueue//config/default?ref=v0.17.0" is remote; kustomizations in a fleet may only name files in the repository`),
		at4("git over ssh", resource("git@github.com:kubernetes-sigs/kueue.git/config/default"),
			`"git@github.com:kubernetes-sigs/kueue.git/config/default" is remote`),
		at4("ssh URL", resource("ssh://git@github.com/kubernetes-sigs/kueue.git"),
			`"ssh://git@github.com/kubernetes-sigs/kueue.git" is remote`),
		at4("host path without scheme", resource("github.com/kubernetes-sigs/kueue/config/default?ref=v0.17.0"),
			`"github.com/kubernetes-sigs/kueue/config/default?ref=v0.17.0" is remote; kustomizations in a fleet may only name files in the repository: kustomize reads a path starting with github.com/ as a GitHub repository`),
		at4("missing file", resource("missing.yaml"),
			`"missing.yaml" does not exist in the repository (remote bases are not allowed)`),
		at4("missing preset file", resource("../../presets/gpu/missing.yaml"),
			`"../../presets/gpu/missing.yaml" does not exist in the repository`),
		at4("the whole preset", resource("../../presets/gke-dws"),
			`"../../presets/gke-dws" is a whole preset: the cluster's preset is its base already; list only patches and extra objects`),
		at4("another whole preset", resource("../../presets/gpu/"),
			`"../../presets/gpu/" is a whole preset`),
		at4("all presets", resource("../../presets"),
			`directory "../../presets" has no kustomization.yaml`),
		{
			name: "directory without kustomization.yaml",
			changes: merge(resource("extra"), map[string]string{
				exampleDir + "/extra/priority.yaml": fleetgen.OverlayPriority,
			}),
			file: overlayFile, line: 4, col: 5,
			msg: `directory "extra" has no kustomization.yaml`,
		},
		{
			name:    "file as a component",
			changes: overlay("components:\n  - priority.yaml\n"),
			file:    overlayFile, line: 4, col: 5,
			msg: `"priority.yaml" is a file; a component is a directory with a kustomization.yaml`,
		},
		{
			name:    "patch out of the cluster",
			changes: overlay("patches:\n  - path: ../gpu-00000/cluster.yaml\n"),
			file:    overlayFile, line: 4, col: 5,
			msg: `"../gpu-00000/cluster.yaml" resolves to clusters/gpu-00000/cluster.yaml, outside`,
		},
		{
			name:    "replacement source file remote",
			changes: overlay("replacements:\n  - path: https://example.com/replacement.yaml\n"),
			file:    overlayFile, line: 4, col: 5,
			msg: `"https://example.com/replacement.yaml" is remote`,
		},
	})
}

func TestLoadRejectsOverlayFieldsThatReachOutOfTheRepository(t *testing.T) {
	field := func(name, body, msg string) rejectCase {
		return rejectCase{name: name, changes: overlay(body + "resources:\n  - priority.yaml\n"), file: overlayFile, line: 3, col: 1, msg: msg}
	}
	runRejects(t, []rejectCase{
		field("helmCharts", "helmCharts:\n  - name: kueue\n    repo: oci://registry.k8s.io/kueue/charts\n",
			"helmCharts is not allowed in a fleet kustomization: it runs Helm and fetches charts"),
		field("helmGlobals", "helmGlobals:\n  chartHome: charts\n",
			"helmGlobals is not allowed in a fleet kustomization: it runs Helm"),
		field("generators", "generators:\n  - generator.yaml\n",
			"generators is not allowed in a fleet kustomization: it runs plugins"),
		field("transformers", "transformers:\n  - transformer.yaml\n",
			"transformers is not allowed in a fleet kustomization: it runs plugins"),
		field("validators", "validators:\n  - validator.yaml\n",
			"validators is not allowed in a fleet kustomization: it runs plugins"),
		field("namespace", "namespace: kueue-system\n",
			"namespace is not allowed in a fleet kustomization: flotilla places namespaced objects in the fleet's workload namespaces"),
		field("secretGenerator", "secretGenerator:\n  - name: token\n    literals: [token=x]\n",
			"secretGenerator is not allowed in a fleet kustomization: secrets do not belong in a fleet repository unencrypted"),
		field("configMapGenerator", "configMapGenerator:\n  - name: settings\n",
			"configMapGenerator is not allowed in a fleet kustomization: Kueue's objects need no ConfigMaps"),
		field("openapi", "openapi:\n  path: https://example.com/schema.json\n",
			"openapi is not allowed in a fleet kustomization: it loads schemas from outside the repository"),
		field("configurations", "configurations:\n  - config.yaml\n",
			"configurations is not allowed in a fleet kustomization: it changes kustomize's own configuration"),
		field("crds", "crds:\n  - crd.json\n",
			"crds is not allowed in a fleet kustomization: it changes kustomize's own configuration"),
		field("bases", "bases:\n  - ../../presets/gpu\n",
			"bases is not allowed in a fleet kustomization: it is deprecated; list the directory under resources"),
		field("vars", "vars:\n  - name: X\n",
			"vars is not allowed in a fleet kustomization: it is deprecated; use replacements"),
		field("patchesStrategicMerge", "patchesStrategicMerge:\n  - priority.yaml\n",
			"patchesStrategicMerge is not allowed in a fleet kustomization: it is deprecated; list the patch under patches"),
		field("patchesJson6902", "patchesJson6902:\n  - target: {kind: ClusterQueue, name: cluster-queue}\n    path: /etc/patch.yaml\n",
			"patchesJson6902 is not allowed in a fleet kustomization: it is deprecated; list the patch under patches"),
		field("unknown field", "resource:\n  - priority.yaml\n",
			`unknown field "resource"`),
		{
			name: "wrong kind",
			changes: map[string]string{
				overlayFile:                   "apiVersion: apps/v1\nkind: Deployment\nresources:\n  - priority.yaml\n",
				exampleDir + "/priority.yaml": fleetgen.OverlayPriority,
			},
			file: overlayFile, line: 2, col: 1,
			msg: `kind must be Kustomization or Component, not "Deployment"`,
		},
		{
			name:    "unknown nested field",
			changes: overlay("patches:\n  - path: priority.yaml\n    taget: {kind: ClusterQueue}\n"),
			file:    overlayFile, line: 5, col: 5,
			msg: `unknown field "patches[0].taget"`,
		},
		{
			name:    "second document",
			changes: overlay("resources:\n  - priority.yaml\n---\nresources: []\n"),
			file:    overlayFile, line: 5, col: 1,
			msg: "file must hold a single YAML document",
		},
	})
}

func TestLoadAcceptsOverlayOfItsOwnFilesAndPresetFiles(t *testing.T) {
	cases := map[string]map[string]string{
		"fleetgen overlay": {overlayFile: fleetgen.Overlay, exampleDir + "/priority.yaml": fleetgen.OverlayPriority},
		"preset file":      resource("../../presets/gpu/queues.yaml"),
		"own file with ./": resource("./priority.yaml"),
		"own component": merge(overlay("components:\n  - extra\n"), map[string]string{
			exampleDir + "/extra/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\nresources:\n  - priority.yaml\n",
			exampleDir + "/extra/priority.yaml":      fleetgen.OverlayPriority,
		}),
		"inline patch and labels": overlay("labels:\n  - pairs: {team: ml}\npatches:\n  - target: {kind: LocalQueue}\n    patch: |-\n      - op: add\n        path: /metadata/annotations\n        value: {a: b}\n"),
		"patch file":              overlay("patches:\n  - path: priority.yaml\n"),
	}
	for name, changes := range cases {
		t.Run(name, func(t *testing.T) {
			f := loadWith(t, changes)
			wantNoErrors(t, f)
			if f.Clusters[example].Overlay() == nil {
				t.Fatal("the overlay is not kept")
			}
		})
	}
}
