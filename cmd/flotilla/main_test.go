package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// planes[0] plays the hub's Kubernetes cluster, for the commands that read the hub.
var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) { controlplane.Main(m, 1, &planes, controlplane.Options{}) }

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(t.Context(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestValidateAcceptsTheShippedTemplate(t *testing.T) {
	code, out, errOut := runCLI(t, "validate", filepath.Join("..", "..", "fleet-template"))
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	if want := `fleet "example" is valid: 1 cluster, 2 presets`; !strings.Contains(out, want) || strings.Count(out, "\n") != 1 {
		t.Errorf("stdout %q, want one line containing %q", out, want)
	}
}

func TestValidateReportsEveryErrorWithPosition(t *testing.T) {
	fsys := fleetgen.Fleet(3, fleetgen.Options{})
	p := "clusters/" + fleetgen.ClusterName(1) + "/cluster.yaml"
	fsys[p] = &fstest.MapFile{Data: []byte(strings.Replace(string(fsys[p].Data), "cordoned: false", "cordonned: true", 1))}
	q := "clusters/" + fleetgen.ClusterName(2) + "/cluster.yaml"
	fsys[q] = &fstest.MapFile{Data: []byte(strings.Replace(string(fsys[q].Data), "preset: gke-dws", "preset: tpu", 1))}
	code, out, errOut := runCLI(t, "validate", fleetgen.WriteDir(t, fsys))
	if code != 1 || out != "" {
		t.Fatalf("exit %d, stdout %q; want exit 1 and nothing on stdout", code, out)
	}
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	want := []*regexp.Regexp{
		regexp.MustCompile(`^clusters/gpu-00001/cluster\.yaml:\d+:\d+: .*cordonned`),
		regexp.MustCompile(`^clusters/gpu-00002/cluster\.yaml:\d+:\d+: preset "tpu" does not exist under presets/ \(have: gke-dws, gpu\)$`),
		regexp.MustCompile(`: 2 errors$`),
	}
	if len(lines) != len(want) {
		t.Fatalf("stderr has %d lines, want %d:\n%s", len(lines), len(want), errOut)
	}
	for i, re := range want {
		if !re.MatchString(lines[i]) {
			t.Errorf("line %d %q does not match %s", i+1, lines[i], re)
		}
	}
}

func TestValidateReportsRenderProblems(t *testing.T) {
	fsys := fleetgen.Fleet(1, fleetgen.Options{})
	p := "clusters/" + fleetgen.ClusterName(0) + "/cluster.yaml"
	fsys[p] = &fstest.MapFile{Data: []byte(strings.Replace(string(fsys[p].Data), "  quota:\n", "  quota:\n    example.com/fpga: 2\n", 1))}
	code, _, errOut := runCLI(t, "validate", fleetgen.WriteDir(t, fsys))
	if code != 1 || !strings.Contains(errOut, "clusters/gpu-00000/cluster.yaml:1:1: quota for example.com/fpga: no ClusterQueue") {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
}

func TestValidateRefusesMissingDirectory(t *testing.T) {
	code, _, errOut := runCLI(t, "validate", filepath.Join(t.TempDir(), "nope"))
	if code != 1 || !strings.Contains(errOut, "no such file or directory") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

func TestRenderPrintsWhatTheHubSends(t *testing.T) {
	dir := filepath.Join("..", "..", "fleet-template")
	code, yamlOut, errOut := runCLI(t, "render", dir, "--cluster", fleetgen.ExampleCluster)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	hash := regexp.MustCompile(`(?m)^# desired generation: (sha256:[0-9a-f]{64})$`).FindStringSubmatch(yamlOut)
	if hash == nil {
		t.Fatalf("YAML output has no desired generation:\n%s", yamlOut)
	}
	if !strings.Contains(yamlOut, "kind: ClusterQueue") || !strings.Contains(yamlOut, "flotilla.dev/worker-cluster: 7-example-example-us-central1") {
		t.Errorf("YAML output lacks the ClusterQueue or the ownership label:\n%s", yamlOut)
	}

	code, jsonOut, errOut := runCLI(t, "render", dir, "--cluster", fleetgen.ExampleCluster, "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Hash    string           `json:"hash"`
		Objects []map[string]any `json:"objects"`
	}
	if err := json.Unmarshal([]byte(jsonOut), &doc); err != nil {
		t.Fatalf("JSON output does not parse: %v", err)
	}
	if doc.Hash != hash[1] || len(doc.Objects) != strings.Count(yamlOut, "\n---\n") {
		t.Errorf("JSON has hash %s and %d objects; YAML has hash %s and %d", doc.Hash, len(doc.Objects), hash[1], strings.Count(yamlOut, "\n---\n"))
	}
}

func TestRenderRefuses(t *testing.T) {
	dir := filepath.Join("..", "..", "fleet-template")
	broken := fleetgen.Template()
	p := "clusters/" + fleetgen.ExampleCluster + "/cluster.yaml"
	broken[p] = &fstest.MapFile{Data: []byte(strings.Replace(string(broken[p].Data), "residency: us", "residency: mars", 1))}
	cases := []struct {
		name string
		args []string
		msg  string
	}{
		{"no cluster flag", []string{"render", dir}, `required flag(s) "cluster" not set`},
		{"an unknown cluster", []string{"render", dir, "--cluster", "nope"}, `no cluster "nope" in the fleet`},
		{"an unknown format", []string{"render", dir, "--cluster", fleetgen.ExampleCluster, "-o", "toml"}, "--output must be yaml or json"},
		{"an invalid cluster", []string{"render", fleetgen.WriteDir(t, broken), "--cluster", fleetgen.ExampleCluster}, `cluster.yaml:10:3: residency "mars" is not allowed`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.args...)
			if code != 1 || out != "" || !strings.Contains(errOut, tc.msg) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and %q", code, out, errOut, tc.msg)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := runCLI(t, "--version")
	if code != 0 || !strings.HasPrefix(out, "flotilla ") {
		t.Fatalf("exit %d, %q", code, out)
	}
}
