package fleet_test

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

func TestErrorPrintsFileLineColumnAndMessage(t *testing.T) {
	for _, tc := range []struct {
		err  fleet.Error
		want string
	}{
		{fleet.Error{File: "clusters/a/cluster.yaml", Line: 7, Column: 3, Cluster: "a", Message: "spec.region is required"},
			"clusters/a/cluster.yaml:7:3: spec.region is required"},
		{fleet.Error{File: "fleet.yaml", Line: 4, Message: "invalid YAML: did not find expected key"},
			"fleet.yaml:4:1: invalid YAML: did not find expected key"},
		{fleet.Error{File: "clusters/a", Message: "cluster directory has no cluster.yaml"},
			"clusters/a:1:1: cluster directory has no cluster.yaml"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
	}
	list := fleet.ErrorList{
		{File: "b.yaml", Line: 2, Column: 1, Message: "second"},
		{File: "a.yaml", Message: "first"},
	}
	if got, want := list.Error(), "b.yaml:2:1: second\na.yaml:1:1: first"; got != want {
		t.Errorf("ErrorList.Error() = %q, want %q", got, want)
	}
	list.Sort()
	if list[0].File != "a.yaml" {
		t.Errorf("Sort left %v first", list[0])
	}
}

func TestAllErrorsAreSortedByFileAndLineAndPrintAsFileLineColumn(t *testing.T) {
	gpu1 := "clusters/" + fleetgen.ClusterName(1) + "/cluster.yaml"
	f := loadWith(t, map[string]string{
		// Two errors of fleet.yaml, on lines 8 and 14.
		fleet.FleetFile: strings.NewReplacer("tenant: example", "tenant: Example", "kueueVersion: v0.17.0", "kueueVersion: main").
			Replace(template(t, fleet.FleetFile)),
		// The example cluster: its enrollment file is missing (the directory as a whole)
		// and cluster.yaml has errors on lines 11 and 8, in that order of checking.
		enrollmentFile: removed,
		clusterFile: strings.NewReplacer("preset: gke-dws", "preset: tpu", "region: us-central1", `region: ""`).
			Replace(template(t, clusterFile)),
		// A synthetic cluster, sorting after the example, with a bad quota.
		gpu1: strings.Replace(sibling(t, 1, "cluster.yaml"), "cpu: 384", "cpu: -384", 1),
	})
	all := f.AllErrors()
	if len(all) != 6 {
		t.Fatalf("want 6 errors; got:\n%s", describe(all))
	}
	sorted := slices.IsSortedFunc(all, func(a, b fleet.Error) int {
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
	if !sorted {
		t.Fatalf("AllErrors is not sorted by file, line and column:\n%s", describe(all))
	}
	want := []string{
		`clusters/example-us-central1:1:1: cluster directory has no enrollment.sops.yaml`,
		`clusters/example-us-central1/cluster.yaml:8:3: spec.region is required`,
		`clusters/example-us-central1/cluster.yaml:11:3: preset "tpu" does not exist under presets/`,
		`clusters/gpu-00001/cluster.yaml:12:10: quota for cpu may not be negative`,
		`fleet.yaml:8:3: spec.tenant "Example" is not a DNS label`,
		`fleet.yaml:14:3: spec.kueueVersion "main" must be a release`,
	}
	lines := strings.Split(all.Error(), "\n")
	if len(lines) != len(want) {
		t.Fatalf("AllErrors prints %d lines, want %d:\n%s", len(lines), len(want), all.Error())
	}
	format := regexp.MustCompile(`^[^:]+:[1-9][0-9]*:[1-9][0-9]*: \S`)
	for i, line := range lines {
		if !strings.HasPrefix(line, want[i]) {
			t.Errorf("line %d of AllErrors is %q, want it to start with %q", i+1, line, want[i])
		}
		if !format.MatchString(line) {
			t.Errorf("line %q is not file:line:col: message", line)
		}
		if line != all[i].Error() {
			t.Errorf("line %d is %q, but the error prints as %q", i+1, line, all[i].Error())
		}
	}
	// The cluster's errors are named after it; the fleet's after nobody.
	for _, e := range all {
		wantCluster := ""
		if strings.HasPrefix(e.File, "clusters/") {
			wantCluster = strings.Split(e.File, "/")[1]
		}
		if e.Cluster != wantCluster {
			t.Errorf("error %s belongs to cluster %q, want %q", e, e.Cluster, wantCluster)
		}
	}
	// AllErrors leaves the lists it is made of alone.
	if got := fmt.Sprint(f.Errors[0].Line, f.Errors[1].Line); got != "8 14" {
		t.Errorf("fleet errors are on lines %s", got)
	}
}

func TestLoadPlacesYAMLSyntaxErrorsAtTheirLine(t *testing.T) {
	replace := func(old, new string) map[string]string {
		return map[string]string{clusterFile: edited(t, clusterFile, old, new)}
	}
	runRejects(t, []rejectCase{
		{name: "unclosed flow sequence", changes: replace("region: us-central1", "region: [us-central1"),
			file: clusterFile, line: 8, msg: "invalid YAML: did not find expected ',' or ']'"},
		{name: "unclosed flow mapping", changes: replace("residency: us", "residency: {us"),
			file: clusterFile, line: 10, msg: "invalid YAML: did not find expected ',' or '}'"},
		{name: "bad indentation", changes: replace("  zone: us-central1-a\n", "   zone: us-central1-a\n"),
			file: clusterFile, line: 9, msg: "invalid YAML: mapping values are not allowed in this context"},
		{name: "bad indentation in a list", changes: replace("      count: 64", "     count: 64"),
			file: clusterFile, line: 19, msg: "invalid YAML: did not find expected '-' indicator"},
		{name: "key without colon on the first line", changes: map[string]string{clusterFile: "apiVersion flotilla.dev/v1alpha1\nkind: WorkerCluster\n"},
			file: clusterFile, line: 2, msg: "invalid YAML: mapping values are not allowed in this context"},
		{name: "tab indentation", changes: replace("  zone: us-central1-a\n", "\tzone: us-central1-a\n"),
			file: clusterFile, line: 8, msg: "invalid YAML: found a tab character that violates indentation"},
		// The scanner leaves the line out of its errors on the first line.
		{name: "tab at the start of the file", changes: map[string]string{clusterFile: "\tapiVersion: flotilla.dev/v1alpha1\n"},
			file: clusterFile, line: 0, msg: "invalid YAML: found character that cannot start any token"},
		{name: "unknown escape", changes: replace("displayName: Example GKE cluster in Iowa", `displayName: "Example \q"`),
			file: clusterFile, line: 7, msg: "invalid YAML: found unknown escape character"},
		{name: "undefined tag handle on the first line", changes: map[string]string{clusterFile: "apiVersion: !x!y flotilla.dev/v1alpha1\n"},
			file: clusterFile, line: 1, msg: "invalid YAML: found undefined tag handle"},
	})
}
