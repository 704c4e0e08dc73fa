package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

const exampleClusterFile = "clusters/" + fleetgen.ExampleCluster + "/cluster.yaml"

// templateWith is a checkout of the shipped fleet template with the example cluster's
// cluster.yaml passed through edit.
func templateWith(t *testing.T, edit func(string) string) (dir string, original []byte) {
	t.Helper()
	fsys := fleetgen.Template()
	data := []byte(edit(string(fsys[exampleClusterFile].Data)))
	fsys[exampleClusterFile] = &fstest.MapFile{Data: data, Mode: 0o644}
	return fleetgen.WriteDir(t, fsys), data
}

func readFile(t *testing.T, dir, rel string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// changedFiles is what differs between two snapshots of a directory.
func changedFiles(before, after map[string]string) []string {
	var changed []string
	for p, v := range after {
		if before[p] != v {
			changed = append(changed, p)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			changed = append(changed, p)
		}
	}
	return changed
}

func same(s string) string { return s }

func TestClusterCordonChangesOnlyTheCordonedValue(t *testing.T) {
	withoutCordoned := func(s string) string {
		return strings.Replace(s, "  # Set to true to stop new jobs from reaching this cluster; running jobs carry on.\n  cordoned: false\n", "", 1)
	}
	tests := []struct {
		name string
		edit func(string) string
		args []string
		// want is the file expected from the original one; nil when nothing may change.
		want    func(string) string
		cordon  bool
		message string
	}{
		{"cordon sets true and keeps every other byte", same, nil,
			func(s string) string { return strings.Replace(s, "cordoned: false", "cordoned: true", 1) }, true,
			"Set cordoned: true in " + exampleClusterFile},
		{"uncordon sets false and keeps every other byte",
			func(s string) string { return strings.Replace(s, "cordoned: false", "cordoned: true", 1) }, []string{"--uncordon"},
			func(s string) string { return strings.Replace(s, "cordoned: true", "cordoned: false", 1) }, false,
			"Set cordoned: false in " + exampleClusterFile},
		{"a trailing comment stays",
			func(s string) string {
				return strings.Replace(s, "cordoned: false", "cordoned: false  # ask #gpu-ops first", 1)
			}, nil,
			func(s string) string { return strings.Replace(s, "cordoned: false", "cordoned: true", 1) }, true,
			"Set cordoned: true"},
		{"a file without the key gets it as the first key of spec", withoutCordoned, nil,
			func(s string) string { return strings.Replace(s, "spec:\n", "spec:\n  cordoned: true\n", 1) }, true,
			"Set cordoned: true"},
		{"a cordoned cluster is left alone",
			func(s string) string { return strings.Replace(s, "cordoned: false", "cordoned: true", 1) }, nil,
			nil, true, "is already cordoned in " + exampleClusterFile + "; nothing changed"},
		{"uncordoning a file without the key leaves it alone", withoutCordoned, []string{"--uncordon"},
			nil, false, "is already uncordoned"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, original := templateWith(t, tt.edit)
			before := snapshot(t, dir)
			args := append([]string{"cluster", "cordon", fleetgen.ExampleCluster, "--dir", dir}, tt.args...)
			code, out, errOut := runCLI(t, args...)
			if code != 0 || errOut != "" {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
			if !strings.Contains(out, tt.message) {
				t.Errorf("output lacks %q:\n%s", tt.message, out)
			}
			got := readFile(t, dir, exampleClusterFile)
			changed := changedFiles(before, snapshot(t, dir))
			if tt.want == nil {
				if len(changed) > 0 {
					t.Errorf("changed %v; want nothing changed", changed)
				}
				return
			}
			if want := tt.want(string(original)); got != want {
				t.Errorf("cluster.yaml is\n%s\nwant\n%s", got, want)
			}
			if len(changed) != 1 || !strings.HasSuffix(changed[0], filepath.FromSlash(exampleClusterFile)) {
				t.Errorf("changed %v; want only %s", changed, exampleClusterFile)
			}
			for _, w := range []string{"git switch -c", "git add " + exampleClusterFile, "open a pull request"} {
				if !strings.Contains(out, w) {
					t.Errorf("the next step lacks %q:\n%s", w, out)
				}
			}
			f := fleet.Load(fleet.DirFS(dir))
			if c := f.Clusters[fleetgen.ExampleCluster]; !c.Valid() || c.Object.Spec.Cordoned != tt.cordon {
				t.Errorf("the cluster loads with cordoned %v and errors %v; want cordoned %v", c.Object != nil && c.Object.Spec.Cordoned, c.Errors, tt.cordon)
			}
		})
	}
}

func TestClusterCordonThenUncordonRestoresTheFile(t *testing.T) {
	dir, original := templateWith(t, same)
	for _, args := range [][]string{{}, {"--uncordon"}} {
		if code, _, errOut := runCLI(t, append([]string{"cluster", "cordon", fleetgen.ExampleCluster, "--dir", dir}, args...)...); code != 0 {
			t.Fatalf("cordon %v: exit %d: %s", args, code, errOut)
		}
	}
	if got := readFile(t, dir, exampleClusterFile); got != string(original) {
		t.Errorf("after cordon and uncordon cluster.yaml is\n%s\nwant it as it was:\n%s", got, original)
	}
}

func TestClusterEditsRefuseAndChangeNothing(t *testing.T) {
	notACluster := func(t *testing.T, dir string) {
		os.MkdirAll(filepath.Join(dir, "clusters", "notes"), 0o755)
		if err := os.WriteFile(filepath.Join(dir, "clusters", "notes", "README.md"), []byte("# not a cluster\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name  string
		edit  func(string) string
		setup func(t *testing.T, dir string)
		args  []string
		msg   string // DIR stands for the checkout
	}{
		{"cordon of an unknown cluster", same, nil, []string{"cordon", "gpu-west"},
			`no cluster "gpu-west" under clusters/ of DIR (have: example-us-central1)`},
		{"cordon of an invalid name", same, nil, []string{"cordon", "GPU_West"}, `cluster name "GPU_West"`},
		{"cordon of a cluster that does not validate",
			func(s string) string { return strings.Replace(s, "residency: us", "residency: mars", 1) }, nil,
			[]string{"cordon", fleetgen.ExampleCluster}, exampleClusterFile + `:10:3: residency "mars" is not allowed`},
		{"cordon of a cluster whose cordoned is not a bool",
			func(s string) string { return strings.Replace(s, "cordoned: false", "cordoned: maybe", 1) }, nil,
			[]string{"cordon", fleetgen.ExampleCluster}, exampleClusterFile + ":17:3: spec.cordoned: expected true or false"},
		{"cordon in a fleet whose fleet.yaml is broken", same, func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "fleet.yaml"), []byte("kind: Fleet\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, []string{"cordon", fleetgen.ExampleCluster}, "fix the fleet's own files first"},
		{"remove of an unknown cluster", same, nil, []string{"remove", "gpu-west"}, `no cluster "gpu-west" under clusters/`},
		{"remove of an invalid name", same, nil, []string{"remove", "../presets"}, `cluster name "../presets"`},
		{"remove of a directory that is not a cluster", same, notACluster, []string{"remove", "notes"},
			"clusters/notes:1:1: no cluster.yaml, so clusters/notes is not a cluster of this fleet"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, _ := templateWith(t, tt.edit)
			if tt.setup != nil {
				tt.setup(t, dir)
			}
			before := snapshot(t, dir)
			args := append(append([]string{"cluster"}, tt.args...), "--dir", dir)
			code, out, errOut := runCLI(t, args...)
			msg := strings.ReplaceAll(tt.msg, "DIR", dir)
			if code != 1 || out != "" || !strings.Contains(errOut, msg) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and %q", code, out, errOut, msg)
			}
			if changed := changedFiles(before, snapshot(t, dir)); len(changed) > 0 {
				t.Errorf("changed %v", changed)
			}
		})
	}
}

func TestClusterRemoveDeletesOnlyTheClusterDirectory(t *testing.T) {
	tests := []struct {
		name       string
		valuesFile bool
		wantValues bool
	}{
		{"with the values file still in the checkout", true, true},
		{"without a values file", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fsys := fleetgen.Fleet(2, fleetgen.Options{OverlayEvery: 1})
			victim, other := fleetgen.ClusterName(0), fleetgen.ClusterName(1)
			dir := fleetgen.WriteDir(t, fsys)
			values := "values." + victim + ".local.yaml"
			if tt.valuesFile {
				if err := os.WriteFile(filepath.Join(dir, values), []byte("enrollment:\n  token: x\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			before := snapshot(t, dir)
			code, out, errOut := runCLI(t, "cluster", "remove", victim, "--dir", dir)
			if code != 0 || errOut != "" {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}

			victimDir := filepath.Join(dir, "clusters", victim)
			if _, err := os.Lstat(victimDir); !os.IsNotExist(err) {
				t.Errorf("%s is still there (%v)", victimDir, err)
			}
			after := snapshot(t, dir)
			for _, p := range changedFiles(before, after) {
				if p != victimDir && !strings.HasPrefix(p, victimDir+string(filepath.Separator)) {
					t.Errorf("%s changed, but it is not under clusters/%s", p, victim)
				}
			}
			removed := []string{"cluster.yaml", "enrollment.sops.yaml", "kustomization.yaml", "priority.yaml"}
			for _, f := range removed {
				if !strings.Contains(out, "  clusters/"+victim+"/"+f+"\n") {
					t.Errorf("output does not list clusters/%s/%s as removed:\n%s", victim, f, out)
				}
			}
			for _, w := range []string{
				"Removed cluster " + victim + " (identity 7-example-" + victim + ")",
				"Merging this decommissions " + victim,
				"flotilla.dev/prune: disabled",
				"git switch -c remove-" + victim,
				"git add -A clusters/" + victim + ` && git commit -m "Decommission ` + victim + `"`,
			} {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if got := strings.Contains(out, "shred -u "+values); got != tt.wantValues {
				t.Errorf("reminder to destroy %s shown: %v, want %v:\n%s", values, got, tt.wantValues, out)
			}
			if tt.valuesFile && !strings.Contains(out, "it is ignored by git") {
				t.Errorf("the reminder does not say the values file is ignored:\n%s", out)
			}
			if tt.valuesFile {
				if _, err := os.Stat(filepath.Join(dir, values)); err != nil {
					t.Errorf("remove deleted the values file, which is for the engineer to destroy: %v", err)
				}
			}

			code, vout, verr := runCLI(t, "validate", dir)
			if code != 0 || !strings.Contains(vout, "1 cluster,") {
				t.Errorf("the fleet after remove: exit %d, %s%s", code, vout, verr)
			}
			if code, _, errOut := runCLI(t, "render", dir, "--cluster", other); code != 0 {
				t.Errorf("the other cluster no longer renders: %s", errOut)
			}
		})
	}
}
