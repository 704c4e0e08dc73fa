package fleet_test

import (
	"bytes"
	"cmp"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"go.yaml.in/yaml/v3"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// fuzzFiles are the files FuzzLoad can replace, by its second argument.
var fuzzFiles = []string{fleet.FleetFile, clusterFile, overlayFile, enrollmentFile}

// Second arguments of FuzzLoad.
const (
	fuzzFleet uint8 = iota
	fuzzCluster
	fuzzOverlay
	fuzzEnrollment
)

// fuzzMarker stands for a token committed in plain text to the enrollment file.
const fuzzMarker = "PLAINTEXT-TOKEN-4f1d9a"

// FuzzLoad loads the template with one file replaced by arbitrary bytes. Load must not
// panic, must place every error in a file with a message, and must never repeat a
// plaintext value of the enrollment file.
func FuzzLoad(f *testing.F) {
	tmpl := fleetgen.Template()
	for i, p := range fuzzFiles {
		if d, ok := tmpl[p]; ok {
			f.Add(d.Data, uint8(i))
		}
	}
	f.Add([]byte(fleetgen.Overlay), fuzzOverlay)
	f.Add([]byte(overlayHead+"resources:\n  - ../../presets/gpu\n  - https://example.com/x\n  - /etc/passwd\n  - ../../../x\n"), fuzzOverlay)
	f.Add([]byte(overlayHead+"helmCharts:\n  - name: x\nnamespace: y\n"), fuzzOverlay)
	f.Add([]byte(overlayHead+"components:\n  - priority.yaml\npatches:\n  - path: ../../fleet.yaml\n"), fuzzOverlay)
	f.Add([]byte("token: "+fuzzMarker+"\nsops:\n    age:\n        - recipient: x\n    mac: y\n"), fuzzEnrollment)
	f.Add([]byte("token: \""+fuzzMarker+"\nsops: {}\n"), fuzzEnrollment)
	f.Add([]byte("token: *"+fuzzMarker+"\n"), fuzzEnrollment)
	f.Add([]byte("- "+fuzzMarker+"\n---\ntoken: "+fuzzMarker+"\n"), fuzzEnrollment)
	f.Add([]byte("a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n"), fuzzCluster)
	f.Add([]byte("spec:\n  quota:\n    cpu: -1\n    x/y/z: true\n    memory: null\nspec: 1\n"), fuzzCluster)
	f.Add([]byte("apiVersion: flotilla.dev/v1alpha1\nkind: WorkerCluster\nmetadata: {name: Example}\nspec: {cordonned: true, expectedGPUs: [{count: x}, 5]}\n"), fuzzCluster)
	f.Add([]byte("a: 1\n---\nb: 2\n"), fuzzCluster)
	f.Add([]byte("spec:\n  quota:\n    cpu: 1e-999999999\n    memory: 0.000000000000000000000000001Ki\n"), fuzzCluster)
	f.Add([]byte("a: \x00\n\xff"), fuzzCluster)
	f.Add([]byte("spec:\n  tenant: A\n  workloadNamespaces: [x, x, X]\n  hubURL: http://\n  allowedResidencies: ['', '']\n"), fuzzFleet)
	f.Add([]byte("? [a]\n: b\n? {c: d}\n: e\n"), fuzzFleet)

	f.Fuzz(func(t *testing.T, data []byte, which uint8) {
		file := fuzzFiles[int(which)%len(fuzzFiles)]
		fsys := maps.Clone(tmpl)
		fsys[file] = &fstest.MapFile{Data: data, Mode: 0o644}
		if file == overlayFile {
			fsys[exampleDir+"/priority.yaml"] = &fstest.MapFile{Data: []byte(fleetgen.OverlayPriority), Mode: 0o644}
		}

		fl := fleet.Load(fsys)
		all := fl.AllErrors()
		for _, e := range all {
			if e.File == "" || e.Message == "" {
				t.Fatalf("error without a file or message: %#v", e)
			}
			if e.Line < 0 || e.Column < 0 || (e.Line == 0 && e.Column != 0) {
				t.Fatalf("error with an impossible place: %#v", e)
			}
			if strings.HasPrefix(e.File, exampleDir) != (e.Cluster == example) {
				t.Fatalf("error of %s belongs to cluster %q: %#v", e.File, e.Cluster, e)
			}
		}
		if !slices.IsSortedFunc(all, func(a, b fleet.Error) int {
			return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
		}) {
			t.Fatalf("AllErrors is not sorted:\n%s", describe(all))
		}
		_ = all.Error()

		c := fl.Clusters[example]
		if c == nil {
			t.Fatal("the example cluster is missing")
		}
		if c.Valid() && (c.Object == nil || len(c.Errors) > 0) {
			t.Fatal("Valid disagrees with Object and Errors")
		}
		if fl.Spec == nil && len(fl.Errors) == 0 {
			t.Fatal("fleet.yaml gave no Spec and no error")
		}

		if file == enrollmentFile && bytes.Contains(data, []byte(fuzzMarker)) && !inKey(data, fuzzMarker) {
			for _, e := range all {
				if strings.Contains(e.Error(), fuzzMarker) {
					t.Fatalf("an error repeats a value of the enrollment file: %s", e)
				}
			}
		}

		// Reading the cluster again gives what the first read did.
		before := *c
		again := fl.LoadCluster(fsys, example)
		if again == nil || !reflect.DeepEqual(before, *again) {
			t.Fatalf("LoadCluster of an unchanged cluster differs:\n%s\nthen:\n%s", describe(before.Errors), describe(again.Errors))
		}
	})
}

// inKey reports whether s appears in a mapping key of the YAML data. SOPS leaves keys
// in clear text, so a key is no secret and may be named in an error.
func inKey(data []byte, s string) bool {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	found := false
	for {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			return found
		}
		var walk func(n *yaml.Node)
		walk = func(n *yaml.Node) {
			if n.Kind == yaml.MappingNode {
				for i := 0; i < len(n.Content); i += 2 {
					if strings.Contains(n.Content[i].Value, s) {
						found = true
					}
				}
			}
			for _, c := range n.Content {
				walk(c)
			}
		}
		walk(&n)
	}
}
