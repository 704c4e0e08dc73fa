package fleet_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// componentHead is the first two lines of every nested component below; what follows
// starts at line 3.
const componentHead = "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\n"

// nested returns an overlay that includes the directory sub of the example cluster
// (under field, resources or components) whose kustomization is head and body, with
// priority.yaml beside it.
func nested(field, sub, head, body string) map[string]string {
	return merge(overlay(field+":\n  - "+sub+"\n"), map[string]string{
		exampleDir + "/" + sub + "/kustomization.yaml": head + body,
		exampleDir + "/" + sub + "/priority.yaml":      fleetgen.OverlayPriority,
	})
}

// localTwin is resource(ref) with a directory of that very name in the cluster, holding
// a valid kustomization: kustomize would still read ref as remote.
func localTwin(ref string) map[string]string {
	dir := exampleDir + "/" + strings.ReplaceAll(ref, "//", "/")
	return merge(resource(ref), map[string]string{
		dir + "/kustomization.yaml": overlayHead + "resources:\n  - priority.yaml\n",
		dir + "/priority.yaml":      fleetgen.OverlayPriority,
	})
}

func TestLoadRefusesEveryPathKustomizeWouldFetchOrClone(t *testing.T) {
	const remote = "is remote; kustomizations in a fleet may only name files in the repository"
	at4 := func(name string, changes map[string]string, msg string) rejectCase {
		return rejectCase{name: name, changes: changes, file: overlayFile, line: 4, col: 5, msg: msg}
	}
	subFile := exampleDir + "/sub/kustomization.yaml"
	runRejects(t, []rejectCase{
		{
			name:    "URL in a kustomization the overlay includes",
			changes: nested("resources", "sub", overlayHead, "resources:\n  - http://169.254.169.254/latest/meta-data\n"),
			file:    subFile, line: 4, col: 5,
			msg: `"http://169.254.169.254/latest/meta-data" ` + remote,
		},
		{
			name: "URL two kustomizations down",
			changes: merge(nested("resources", "sub", overlayHead, "resources:\n  - deeper\n"), map[string]string{
				exampleDir + "/sub/deeper/kustomization.yaml": overlayHead + "resources:\n  - priority.yaml\n  - https://example.com/obj.yaml\n",
				exampleDir + "/sub/deeper/priority.yaml":      fleetgen.OverlayPriority,
			}),
			file: exampleDir + "/sub/deeper/kustomization.yaml", line: 5, col: 5,
			msg: `"https://example.com/obj.yaml" ` + remote,
		},
		{
			name:    "component that names a remote resource",
			changes: nested("components", "sub", componentHead, "resources:\n  - https://example.com/obj.yaml\n"),
			file:    subFile, line: 4, col: 5,
			msg: `"https://example.com/obj.yaml" ` + remote,
		},
		{
			name:    "component that names a remote component",
			changes: nested("components", "sub", componentHead, "components:\n  - github.com/org/repo//component?ref=main\n"),
			file:    subFile, line: 4, col: 5,
			msg: `"github.com/org/repo//component?ref=main" ` + remote,
		},
		{
			name:    "patch file of a component over HTTP",
			changes: nested("components", "sub", componentHead, "patches:\n  - path: https://example.com/patch.yaml\n"),
			file:    subFile, line: 4, col: 5,
			msg: `"https://example.com/patch.yaml" ` + remote,
		},
		{
			name:    "replacement file of a nested kustomization over HTTP",
			changes: nested("resources", "sub", overlayHead, "resources:\n  - priority.yaml\nreplacements:\n  - path: http://example.com/r.yaml\n"),
			file:    subFile, line: 6, col: 5,
			msg: `"http://example.com/r.yaml" ` + remote,
		},
		at4("git shorthand beside a local directory of that name", localTwin("github.com/org/repo//dir"),
			`"github.com/org/repo//dir" `+remote+`: kustomize reads a path starting with github.com/ as a GitHub repository`),
		at4("git shorthand without a directory beside a local one", localTwin("github.com/org/repo"),
			`"github.com/org/repo" `+remote),
		at4("git shorthand in capitals", localTwin("GitHub.COM/org/repo"),
			`"GitHub.COM/org/repo" `+remote),
		at4("ref query beside a local directory of that name", localTwin("sub?ref=main"),
			`"sub?ref=main" `+remote+`: kustomize reads a query such as ?ref=`),
		at4("version query", localTwin("sub?version=v1"), `"sub?version=v1" `+remote),
		at4("timeout query", localTwin("sub?timeout=600"), `"sub?timeout=600" `+remote),
		at4("double slash beside a local directory", localTwin("org/repo//dir"),
			`"org/repo//dir" `+remote+`: kustomize reads // as the boundary between a git repository and a directory in it`),
		at4("scheme in capitals", resource("HTTPS://example.com/obj.yaml"), `"HTTPS://example.com/obj.yaml" `+remote),
		at4("forced git protocol", resource("git::https://example.com/org/repo//dir"), `"git::https://example.com/org/repo//dir" `+remote),
		at4("file scheme", resource("file:///srv/repo//dir"), `"file:///srv/repo//dir" `+remote),
		at4("ssh scheme", resource("ssh://git@example.com/org/repo.git//dir"), `"ssh://git@example.com/org/repo.git//dir" `+remote),
		at4("scp-like git address", resource("git@example.com:org/repo.git"), `"git@example.com:org/repo.git" `+remote),
		at4("scp-like git address beside a local directory", localTwin("deploy@example.com/org/repo"),
			`"deploy@example.com/org/repo" `+remote+`: kustomize reads user@host as a git repository`),
		at4("go-getter shorthand beside a local directory", localTwin("gh:org/repo"),
			`"gh:org/repo" `+remote+`: kustomize reads a colon as a URL scheme`),
		at4("backslash", localTwin(`sub\dir`), `"sub\\dir" `+remote),
		{
			// Kustomize's YAML library decodes !!binary; ours keeps the text. The file of
			// that name exists, so that only comparing with kustomize's reading finds it.
			name: "path that kustomize decodes from binary",
			changes: merge(overlay("resources:\n  - !!binary aHR0cDovLzE2OS4yNTQuMTY5LjI1NC9sYXRlc3QvbWV0YS1kYXRh\n"), map[string]string{
				exampleDir + "/aHR0cDovLzE2OS4yNTQuMTY5LjI1NC9sYXRlc3QvbWV0YS1kYXRh": fleetgen.OverlayPriority,
			}),
			file: overlayFile, line: 4, col: 5,
			msg: `kustomize reads this path as "http://169.254.169.254/latest/meta-data", not "aHR0cDovLzE2OS4yNTQuMTY5LjI1NC9sYXRlc3QvbWV0YS1kYXRh"`,
		},
		{
			// YAML 1.1, which kustomize's library speaks, reads yes as true.
			name:    "value that kustomize reads as another type",
			changes: overlay("commonAnnotations: {note: yes}\nresources:\n  - priority.yaml\n"),
			file:    overlayFile,
			msg:     "kustomize cannot read this file: invalid Kustomization",
		},
		{
			name:    "field name in another case, which kustomize matches",
			changes: overlay("Resources:\n  - https://example.com/obj.yaml\n"),
			file:    overlayFile, line: 3, col: 1,
			msg: `unknown field "Resources"`,
		},
		{
			name:    "refused field in a nested kustomization",
			changes: nested("resources", "sub", overlayHead, "helmCharts:\n  - name: kueue\n    repo: https://example.com/charts\n"),
			file:    subFile, line: 3, col: 1,
			msg: "helmCharts is not allowed in a fleet kustomization: it runs Helm and fetches charts",
		},
		{
			name: "second kustomization file beside a nested one",
			changes: merge(nested("resources", "sub", overlayHead, "resources:\n  - priority.yaml\n"), map[string]string{
				exampleDir + "/sub/Kustomization": overlayHead + "resources:\n  - https://example.com/obj.yaml\n",
			}),
			file: exampleDir + "/sub/Kustomization",
			msg:  "kustomize would read this file as well as or instead of kustomization.yaml",
		},
	})
}

func TestLoadRefusesKustomizationsThatIncludeOneAnotherEndlessly(t *testing.T) {
	dir := func(name, body string) map[string]string {
		return map[string]string{exampleDir + "/" + name + "/kustomization.yaml": overlayHead + body}
	}
	// chain returns n directories d1 ... dn in the cluster, each including the next,
	// and the overlay including d1.
	chain := func(n int) map[string]string {
		changes := overlay("resources:\n  - d1\n")
		for i := 1; i <= n; i++ {
			body := "resources:\n  - ../priority.yaml\n"
			if i < n {
				body = fmt.Sprintf("resources:\n  - ../d%d\n", i+1)
			}
			changes = merge(changes, dir(fmt.Sprintf("d%d", i), body))
		}
		return changes
	}
	// doubling returns n directories that each include the next twice: kustomize would
	// load the last one 2^n times.
	doubling := func(n int) map[string]string {
		changes := overlay("resources:\n  - l1\n  - ./l1\n")
		for i := 1; i <= n; i++ {
			body := "resources:\n  - ../priority.yaml\n"
			if i < n {
				body = fmt.Sprintf("resources:\n  - ../l%d\n  - ../l%d/\n", i+1, i+1)
			}
			changes = merge(changes, dir(fmt.Sprintf("l%d", i), body))
		}
		return changes
	}
	var many strings.Builder
	for range 120 {
		many.WriteString("  - many\n")
	}
	runRejects(t, []rejectCase{
		{
			name:    "overlay that includes itself",
			changes: resource("."),
			file:    overlayFile, line: 4, col: 5,
			msg: `"." includes clusters/example-us-central1 again: kustomizations may not include one another in a cycle`,
		},
		{
			name:    "nested kustomization that includes the overlay",
			changes: merge(resource("a"), dir("a", "resources:\n  - ..\n")),
			file:    exampleDir + "/a/kustomization.yaml", line: 4, col: 5,
			msg: `".." includes clusters/example-us-central1 again`,
		},
		{
			name:    "two kustomizations that include each other",
			changes: merge(resource("a"), dir("a", "resources:\n  - ../b\n"), dir("b", "resources:\n  - ../a\n")),
			file:    exampleDir + "/b/kustomization.yaml", line: 4, col: 5,
			msg: `"../a" includes clusters/example-us-central1/a again`,
		},
		{
			name:    "component cycle",
			changes: merge(overlay("components:\n  - a\n"), map[string]string{exampleDir + "/a/kustomization.yaml": componentHead + "components:\n  - .\n"}),
			file:    exampleDir + "/a/kustomization.yaml", line: 4, col: 5,
			msg: `"." includes clusters/example-us-central1/a again`,
		},
		{
			// The overlay is the first of the chain, d9 the tenth.
			name:    "chain deeper than kustomizations may nest",
			changes: chain(12),
			file:    exampleDir + "/d9/kustomization.yaml", line: 4, col: 5,
			msg: `"../d10" nests kustomizations 11 deep; at most 10 may include one another in a chain`,
		},
		{
			// The overlay is load 1 and the first 99 entries loads 2 to 100.
			name:    "one directory included more often than kustomize may load kustomizations",
			changes: merge(overlay("resources:\n"+many.String()), dir("many", "resources:\n  - ../priority.yaml\n")),
			file:    overlayFile, line: 103, col: 5,
			msg: `"many" makes kustomize load more than 100 kustomizations for clusters/example-us-central1; kustomize loads a directory again each time it is included`,
		},
		{
			// Kustomize would load l8 2^8 times. Depth first, the overlay and the first
			// l1, l2 and l3 subtree are loads 1 to 66, the second l3 67, its first l4
			// subtree 68 to 98, the second l4 99 and its first l5 100.
			name:    "directories that each include the next twice",
			changes: doubling(8),
			file:    exampleDir + "/l5/kustomization.yaml", line: 4, col: 5,
			msg: `"../l6" makes kustomize load more than 100 kustomizations`,
		},
	})
}

func TestLoadRefusesRemotePathInAPresetsNestedKustomization(t *testing.T) {
	sub := map[string]string{
		"presets/gpu/sub/kustomization.yaml": overlayHead + "resources:\n  - http://169.254.169.254/latest/meta-data\n",
	}
	t.Run("included by the preset", func(t *testing.T) {
		f := loadWith(t, merge(sub, map[string]string{
			"presets/gpu/kustomization.yaml": edited(t, "presets/gpu/kustomization.yaml", "resources:\n", "resources:\n  - sub\n"),
		}))
		wantOnlyError(t, f.Errors, "presets/gpu/sub/kustomization.yaml", 4, 5, `"http://169.254.169.254/latest/meta-data" is remote`)
		broken := fleetgen.ClusterName(1)
		wantOnlyError(t, clusterErrors(t, f, broken), "clusters/"+broken+"/cluster.yaml", 9, 3, `preset "gpu" has errors`)
	})
	t.Run("included by an overlay only", func(t *testing.T) {
		f := loadWith(t, merge(sub, resource("../../presets/gpu/sub")))
		if !f.Valid() {
			t.Fatalf("the preset fails although it does not include sub:\n%s", describe(f.Errors))
		}
		e := wantOnlyError(t, clusterErrors(t, f, example), "presets/gpu/sub/kustomization.yaml", 4, 5, `"http://169.254.169.254/latest/meta-data" is remote`)
		if e.Cluster != example {
			t.Errorf("the error belongs to %q, want the cluster whose overlay includes it", e.Cluster)
		}
	})
}

func TestLoadAcceptsNestedLocalKustomizations(t *testing.T) {
	cases := map[string]map[string]string{
		"component including its own file and the cluster's": nested("components", "sub", componentHead,
			"resources:\n  - priority.yaml\npatches:\n  - path: ../priority.yaml\n"),
		"component including a component": merge(nested("components", "sub", componentHead, "components:\n  - inner\n"), map[string]string{
			exampleDir + "/sub/inner/kustomization.yaml": componentHead + "resources:\n  - ../priority.yaml\n",
		}),
		"kustomization including a preset's file": nested("resources", "sub", overlayHead, "resources:\n  - ../../../presets/gpu/queues.yaml\n"),
		"one directory included twice, as kustomize allows": merge(nested("components", "sub", componentHead, "components:\n  - ../shared\n"), map[string]string{
			overlayFile: overlayHead + "components:\n  - sub\n  - shared\n",
			exampleDir + "/shared/kustomization.yaml": componentHead + "labels:\n  - pairs: {team: ml}\n",
		}),
		"every allowed field, which kustomize reads the same": overlay(`metadata:
  name: overlay
labels:
  - pairs: {team: ml}
    includeSelectors: false
commonLabels: {tier: gpu}
commonAnnotations: {note: "yes"}
resources:
  - priority.yaml
patches:
  - target: {kind: ClusterQueue, name: cluster-queue}
    options: {allowNameChange: false}
    patch: |-
      - op: add
        path: /metadata/annotations
        value: {a: b}
replacements:
  - source: {kind: ClusterQueue, name: cluster-queue, fieldPath: metadata.name}
    targets:
      - select: {kind: LocalQueue}
        fieldPaths: [spec.clusterQueue]
`),
		"chain as deep as kustomizations may nest": func() map[string]string {
			changes := overlay("resources:\n  - d1\n")
			for i := 1; i <= 9; i++ {
				body := "resources:\n  - ../priority.yaml\n"
				if i < 9 {
					body = fmt.Sprintf("resources:\n  - ../d%d\n", i+1)
				}
				changes[exampleDir+fmt.Sprintf("/d%d/kustomization.yaml", i)] = overlayHead + body
			}
			return changes
		}(),
	}
	for name, changes := range cases {
		t.Run(name, func(t *testing.T) {
			wantNoErrors(t, loadWith(t, changes))
		})
	}
}

func TestProveLocalAcceptsTheTemplateAndRefusesARemoteBase(t *testing.T) {
	files := map[string][]byte{}
	for p, f := range fleetgen.Template() {
		files[p] = f.Data
	}
	dirs := []string{"presets/gpu", "presets/gke-dws"}
	if errs := fleet.ProveLocal(files, dirs...); len(errs) > 0 {
		t.Fatalf("the template's presets are not proven local:\n%s", describe(errs))
	}
	files["presets/gpu/kustomization.yaml"] = []byte("resources:\n  - github.com/org/repo//dir\n")
	files["presets/gpu/github.com/org/repo/dir/kustomization.yaml"] = []byte("resources: []\n")
	wantOnlyError(t, fleet.ProveLocal(files, dirs...), "presets/gpu/kustomization.yaml", 2, 5, `"github.com/org/repo//dir" is remote`)
	delete(files, "presets/gpu/kustomization.yaml")
	wantOnlyError(t, fleet.ProveLocal(files, dirs...), "presets/gpu", 0, 0, "directory has no kustomization.yaml")
}

// BenchmarkProveLocal is what render adds to kustomize's run for a cluster with an
// overlay: proving its preset and its overlay local once more.
func BenchmarkProveLocal(b *testing.B) {
	files := map[string][]byte{}
	for p, f := range fleetgen.Template() {
		files[p] = f.Data
	}
	files[overlayFile] = []byte(fleetgen.Overlay)
	files[exampleDir+"/priority.yaml"] = []byte(fleetgen.OverlayPriority)
	b.ReportAllocs()
	for b.Loop() {
		if errs := fleet.ProveLocal(files, "presets/gke-dws", exampleDir); len(errs) > 0 {
			b.Fatal(errs)
		}
	}
}

func TestProveLocalRefusesDirectoriesOutsidePresetsAndClusters(t *testing.T) {
	files := map[string][]byte{}
	for p, f := range fleetgen.Template() {
		files[p] = f.Data
	}
	for _, dir := range []string{".", "fleet.yaml", "../presets/gpu", "presets/../clusters", "clusters/x//y", "clusters/github.com"} {
		wantOnlyError(t, fleet.ProveLocal(files, dir), dir, 0, 0, "kustomize may only run on a directory of presets/ or clusters/")
	}
}

func TestLocalInputsNamesTheFilesKustomizeReadsAndNoOther(t *testing.T) {
	files := map[string][]byte{}
	for p, f := range fleetgen.Template() {
		files[p] = f.Data
	}
	files[overlayFile] = []byte(fleetgen.Overlay)
	files[exampleDir+"/priority.yaml"] = []byte(fleetgen.OverlayPriority)
	inputs, errs := fleet.LocalInputs(files, "presets/gpu", exampleDir)
	if len(errs) > 0 {
		t.Fatalf("the template's preset and overlay are not proven local:\n%s", describe(errs))
	}
	// Not cluster.yaml, with the quota, nor the enrollment file, nor the other preset.
	want := []string{exampleDir + "/kustomization.yaml", exampleDir + "/priority.yaml", "presets/gpu/kustomization.yaml", "presets/gpu/queues.yaml"}
	if fmt.Sprint(inputs) != fmt.Sprint(want) {
		t.Errorf("inputs are %q, want %q", inputs, want)
	}
	files["presets/gpu/kustomization.yaml"] = []byte("resources:\n  - github.com/org/repo//dir\n")
	inputs, errs = fleet.LocalInputs(files, "presets/gpu", exampleDir)
	wantOnlyError(t, errs, "presets/gpu/kustomization.yaml", 2, 5, `"github.com/org/repo//dir" is remote`)
	if inputs != nil {
		t.Errorf("inputs %q named for a fleet that is not proven local", inputs)
	}
}
