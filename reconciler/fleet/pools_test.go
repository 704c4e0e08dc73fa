package fleet_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// withDispatch is the template's fleet.yaml with section appended under spec, and the
// line the section starts at, so that cases name lines inside their own section.
func withDispatch(t testing.TB, section string) (string, int) {
	t.Helper()
	s := template(t, fleet.FleetFile)
	return s + section, strings.Count(s, "\n") + 1
}

// allowing is the template's fleet.yaml that also allows residency r, with section
// appended.
func allowing(t testing.TB, r, section string) string {
	t.Helper()
	return edited(t, fleet.FleetFile, "    - eu\n", "    - eu\n    - "+r+"\n") + section
}

// clusterList is a YAML list of n cluster names at the indentation of a pool's clusters.
func clusterList(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "          - gpu-%03d\n", i)
	}
	return b.String()
}

func TestPoolOfNamesThePoolGitPutsAClusterIn(t *testing.T) {
	pools := func(ps ...v1alpha1.DispatchPool) *v1alpha1.FleetSpec {
		return &v1alpha1.FleetSpec{Dispatch: &v1alpha1.DispatchSpec{Pools: ps}}
	}
	cases := []struct {
		name      string
		spec      *v1alpha1.FleetSpec
		cluster   string
		residency string
		want      string
		// fail is part of the error; the cluster is in no pool.
		fail string
	}{
		{name: "no dispatch section: the pool of its residency", spec: &v1alpha1.FleetSpec{},
			cluster: "a", residency: "eu", want: "eu"},
		{name: "no pools declared: the pool of its residency", spec: pools(),
			cluster: "a", residency: "us", want: "us"},
		{name: "listed in a pool: that pool",
			spec:    pools(v1alpha1.DispatchPool{Name: "us-h100", Residency: "us", Clusters: []string{"b", "a"}}),
			cluster: "a", residency: "us", want: "us-h100"},
		{name: "listed in a pool: that pool, even beside one named after its residency",
			spec: pools(
				v1alpha1.DispatchPool{Name: "us", Residency: "us", Clusters: []string{"b"}},
				v1alpha1.DispatchPool{Name: "us-spare", Residency: "us", Clusters: []string{"a"}}),
			cluster: "a", residency: "us", want: "us-spare"},
		{name: "unlisted: a declared pool named after its residency takes it",
			spec:    pools(v1alpha1.DispatchPool{Name: "us", Residency: "us", Clusters: []string{"b"}}),
			cluster: "a", residency: "us", want: "us"},
		{name: "unlisted: pools of other names leave it to its residency's pool",
			spec:    pools(v1alpha1.DispatchPool{Name: "us-h100", Residency: "us", Clusters: []string{"b"}}),
			cluster: "a", residency: "us", want: "us"},
		{name: "a residency of 40 characters names a pool", spec: &v1alpha1.FleetSpec{},
			cluster: "a", residency: strings.Repeat("r", 40), want: strings.Repeat("r", 40)},
		{name: "a residency that is no DNS label, listed in a pool of it",
			spec:    pools(v1alpha1.DispatchPool{Name: "us-east", Residency: "US_East", Clusters: []string{"a"}}),
			cluster: "a", residency: "US_East", want: "us-east"},
		{name: "listed in a pool of another residency",
			spec:    pools(v1alpha1.DispatchPool{Name: "eu-batch", Residency: "eu", Clusters: []string{"a"}}),
			cluster: "a", residency: "us",
			fail: `fleet.yaml puts this cluster in dispatch pool "eu-batch" of residency "eu", but its residency is "us": a pool's jobs never leave its residency`},
		{name: "unlisted, and the pool named after its residency is another residency's",
			spec:    pools(v1alpha1.DispatchPool{Name: "us", Residency: "eu", Clusters: []string{"b"}}),
			cluster: "a", residency: "us",
			fail: `joins the pool named after its residency "us", but fleet.yaml declares that pool for residency "eu": list this cluster in a pool`},
		{name: "unlisted, residency in upper case", spec: &v1alpha1.FleetSpec{},
			cluster: "a", residency: "US",
			fail: `residency "US" cannot name a dispatch pool (a DNS label of at most 40 characters): list this cluster in a pool of fleet.yaml`},
		{name: "unlisted, residency with an underscore", spec: pools(),
			cluster: "a", residency: "us_east", fail: `residency "us_east" cannot name a dispatch pool`},
		{name: "unlisted, residency of 41 characters", spec: &v1alpha1.FleetSpec{},
			cluster: "a", residency: strings.Repeat("r", 41), fail: "list this cluster in a pool of fleet.yaml"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fleet.PoolOf(tc.spec, tc.cluster, tc.residency)
			switch {
			case tc.fail != "" && (err == nil || !strings.Contains(err.Error(), tc.fail)):
				t.Fatalf("PoolOf = %q, %v; want an error containing %q", got, err, tc.fail)
			case tc.fail == "" && err != nil:
				t.Fatalf("PoolOf: %v; want pool %q", err, tc.want)
			case got != tc.want:
				t.Fatalf("PoolOf = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLoadRejectsInvalidDispatchSection(t *testing.T) {
	// Each case is a dispatch section appended to fleet.yaml; line is counted from the
	// section's first line (0), col is the column in the file.
	cases := []struct {
		name      string
		section   string
		line, col int
		msg       string
	}{
		{name: "pool name in upper case",
			section: "  dispatch:\n    pools:\n      - name: EU\n        residency: eu\n", line: 2, col: 9,
			msg: `dispatch pool name "EU" must be a DNS label of at most 40 characters`},
		{name: "pool name with an underscore",
			section: "  dispatch:\n    pools:\n      - name: eu_batch\n        residency: eu\n", line: 2, col: 9,
			msg: `dispatch pool name "eu_batch" must be a DNS label`},
		{name: "pool name of 41 characters",
			section: "  dispatch:\n    pools:\n      - name: " + strings.Repeat("p", 41) + "\n        residency: eu\n", line: 2, col: 9,
			msg: "must be a DNS label of at most 40 characters"},
		{name: "pool name empty",
			section: "  dispatch:\n    pools:\n      - name: \"\"\n        residency: eu\n", line: 2, col: 9,
			msg: `dispatch pool name "" must be a DNS label`},
		{name: "pool declared twice",
			section: "  dispatch:\n    pools:\n      - name: eu\n        residency: eu\n      - name: eu\n        residency: eu\n", line: 4, col: 9,
			msg: `dispatch pool "eu" is declared twice`},
		{name: "a cluster in two pools",
			section: "  dispatch:\n    pools:\n" +
				"      - name: us-a\n        residency: us\n        clusters:\n          - gpu-00000\n" +
				"      - name: us-b\n        residency: us\n        clusters:\n          - gpu-00002\n          - gpu-00000\n",
			line: 10, col: 13,
			msg: `cluster "gpu-00000" is in dispatch pools "us-a" and "us-b"; a cluster is in one pool`},
		{name: "a pool of 21 clusters",
			section: "  dispatch:\n    pools:\n      - name: us\n        residency: us\n        clusters:\n" + clusterList(21), line: 4, col: 9,
			msg: `dispatch pool "us" lists 21 clusters; Kueue takes at most 20 in one pool: split it`},
		{name: "a pool without residency",
			section: "  dispatch:\n    pools:\n      - name: us\n        clusters:\n          - gpu-00000\n", line: 2, col: 9,
			msg: `dispatch pool "us" needs a residency`},
		{name: "a pool with an empty residency",
			section: "  dispatch:\n    pools:\n      - name: us\n        residency: \"\"\n", line: 3, col: 9,
			msg: `dispatch pool "us" needs a residency`},
		{name: "negative drainGracePeriod",
			section: "  dispatch:\n    drainGracePeriod: -1m\n", line: 1, col: 5,
			msg: "spec.dispatch.drainGracePeriod may not be negative"},
		{name: "a misspelt pool field",
			section: "  dispatch:\n    pools:\n      - name: us\n        residency: us\n        cluster:\n          - gpu-00000\n", line: 4, col: 9,
			msg: `unknown field "spec.dispatch.pools[0].cluster"`},
	}
	var fc []fleetCase
	for _, tc := range cases {
		data, first := withDispatch(t, tc.section)
		fc = append(fc, fleetCase{name: tc.name, data: data, line: first + tc.line, col: tc.col, msg: tc.msg})
	}
	runFleetRejects(t, fc)

	t.Run("a pool of 20 clusters", func(t *testing.T) {
		data, _ := withDispatch(t, "  dispatch:\n    pools:\n      - name: us\n        residency: us\n        clusters:\n"+clusterList(20))
		wantNoErrors(t, loadWith(t, map[string]string{fleet.FleetFile: data}))
	})
}

func TestLoadRejectsAClusterThatCanBeInNoPool(t *testing.T) {
	// The siblings' cluster.yaml names its residency at line 8: gpu-00000 and gpu-00002
	// are in us, gpu-00001 in eu.
	inPool := func(name, residency string, clusters ...string) string {
		s := "      - name: " + name + "\n        residency: " + residency + "\n"
		if len(clusters) > 0 {
			s += "        clusters:\n"
			for _, c := range clusters {
				s += "          - " + c + "\n"
			}
		}
		return s
	}
	dispatch := func(pools ...string) string {
		s, _ := withDispatch(t, "  dispatch:\n    pools:\n"+strings.Join(pools, ""))
		return s
	}
	residency := func(r string) string { return edited(t, clusterFile, "residency: us", "residency: "+r) }
	runRejects(t, []rejectCase{
		{
			name:    "listed in a pool of another residency",
			changes: map[string]string{fleet.FleetFile: dispatch(inPool("eu-batch", "eu", example))},
			file:    clusterFile, line: 10, col: 3,
			msg: `fleet.yaml puts this cluster in dispatch pool "eu-batch" of residency "eu", but its residency is "us": a pool's jobs never leave its residency`,
		},
		{
			name:    "listed in a pool of another residency, beside clusters of the right one",
			changes: map[string]string{fleet.FleetFile: dispatch(inPool("eu-h100", "eu", fleetgen.ClusterName(1), example))},
			file:    clusterFile, line: 10, col: 3,
			msg: `in dispatch pool "eu-h100" of residency "eu", but its residency is "us"`,
		},
		{
			name:    "unlisted, and the pool named after its residency is another residency's",
			changes: map[string]string{fleet.FleetFile: dispatch(inPool("us", "eu", fleetgen.ClusterName(1)), inPool("us-rest", "us", fleetgen.ClusterName(0), fleetgen.ClusterName(2)))},
			file:    clusterFile, line: 10, col: 3,
			msg: `a cluster that no dispatch pool lists joins the pool named after its residency "us", but fleet.yaml declares that pool for residency "eu": list this cluster in a pool`,
		},
		{
			// Every unlisted cluster of the residency fails alike; the eu cluster is fine.
			name:    "unlisted clusters of a residency whose name another residency's pool took",
			changes: map[string]string{fleet.FleetFile: dispatch(inPool("us", "eu"))},
			file:    clusterFile, line: 10, col: 3,
			alsoBroken: []string{fleetgen.ClusterName(0), fleetgen.ClusterName(2)},
			msg:        `declares that pool for residency "eu": list this cluster in a pool`,
		},
		{
			name: "a residency with an underscore",
			changes: map[string]string{
				fleet.FleetFile: allowing(t, "us_east", ""),
				clusterFile:     residency("us_east"),
			},
			file: clusterFile, line: 10, col: 3,
			msg: `residency "us_east" cannot name a dispatch pool (a DNS label of at most 40 characters): list this cluster in a pool of fleet.yaml`,
		},
		{
			name: "a residency in upper case",
			changes: map[string]string{
				fleet.FleetFile: allowing(t, "US", ""),
				clusterFile:     residency("US"),
			},
			file: clusterFile, line: 10, col: 3,
			msg: `residency "US" cannot name a dispatch pool`,
		},
		{
			name: "a residency of 41 characters",
			changes: map[string]string{
				fleet.FleetFile: allowing(t, strings.Repeat("r", 41), ""),
				clusterFile:     residency(strings.Repeat("r", 41)),
			},
			file: clusterFile, line: 10, col: 3,
			msg: "cannot name a dispatch pool (a DNS label of at most 40 characters): list this cluster in a pool",
		},
	})

	t.Run("the other clusters' errors sit at their own residency", func(t *testing.T) {
		f := loadWith(t, map[string]string{fleet.FleetFile: dispatch(inPool("us", "eu"))})
		for _, name := range []string{fleetgen.ClusterName(0), fleetgen.ClusterName(2)} {
			wantOnlyError(t, clusterErrors(t, f, name), "clusters/"+name+"/cluster.yaml", 8, 3,
				`joins the pool named after its residency "us", but fleet.yaml declares that pool for residency "eu"`)
		}
	})
}

func TestLoadPutsEveryClusterInOnePool(t *testing.T) {
	const pools = "  dispatch:\n    pools:\n"
	var (
		c0, c1, c2 = fleetgen.ClusterName(0), fleetgen.ClusterName(1), fleetgen.ClusterName(2)
	)
	cases := []struct {
		name    string
		changes map[string]string
		// want is each cluster's pool; the siblings are in us, eu and us.
		want map[string]string
	}{
		{
			name:    "no dispatch section: one pool per residency",
			changes: map[string]string{},
			want:    map[string]string{example: "us", c0: "us", c1: "eu", c2: "us"},
		},
		{
			name:    "dispatch turned on without pools: one pool per residency",
			changes: map[string]string{fleet.FleetFile: template(t, fleet.FleetFile) + "  dispatch:\n    enabled: true\n"},
			want:    map[string]string{example: "us", c0: "us", c1: "eu", c2: "us"},
		},
		{
			name: "a declared pool takes the clusters it lists, the rest stay in their residency's pool",
			changes: map[string]string{fleet.FleetFile: template(t, fleet.FleetFile) + pools +
				"      - name: us-h100\n        residency: us\n        clusters:\n          - " + example + "\n          - " + c2 + "\n"},
			want: map[string]string{example: "us-h100", c0: "us", c1: "eu", c2: "us-h100"},
		},
		{
			name: "a declared pool named after a residency takes that residency's unlisted clusters",
			changes: map[string]string{fleet.FleetFile: template(t, fleet.FleetFile) + pools +
				"      - name: us\n        residency: us\n        clusters:\n          - " + c0 + "\n" +
				"      - name: us-spare\n        residency: us\n        clusters:\n          - " + c2 + "\n"},
			want: map[string]string{example: "us", c0: "us", c1: "eu", c2: "us-spare"},
		},
		{
			name: "a residency that is no DNS label, its cluster listed in a pool of it",
			changes: map[string]string{
				fleet.FleetFile: allowing(t, "US_East", pools+"      - name: us-east\n        residency: US_East\n        clusters:\n          - "+example+"\n"),
				clusterFile:     edited(t, clusterFile, "residency: us", "residency: US_East"),
			},
			want: map[string]string{example: "us-east", c0: "us", c1: "eu", c2: "us"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := loadWith(t, tc.changes)
			wantNoErrors(t, f)
			if !f.Spec.Spec.DispatchEnabled() {
				t.Fatal("dispatch is off although fleet.yaml does not turn it off")
			}
			for name, want := range tc.want {
				c := f.Clusters[name]
				got, err := fleet.PoolOf(&f.Spec.Spec, name, c.Object.Spec.Residency)
				if err != nil || got != want {
					t.Errorf("cluster %s is in pool %q (%v), want %q", name, got, err, want)
				}
			}
		})
	}
}

func TestLoadLeavesPoolsUncheckedOnClustersWhenDispatchIsOff(t *testing.T) {
	const off = "  dispatch:\n    enabled: false\n"
	cases := []struct {
		name    string
		changes map[string]string
	}{
		{
			name: "a residency that cannot name a pool",
			changes: map[string]string{
				fleet.FleetFile: allowing(t, "us_east", off),
				clusterFile:     edited(t, clusterFile, "residency: us", "residency: us_east"),
			},
		},
		{
			name: "a cluster listed in a pool of another residency",
			changes: map[string]string{fleet.FleetFile: template(t, fleet.FleetFile) + off +
				"    pools:\n      - name: eu-batch\n        residency: eu\n        clusters:\n          - " + example + "\n"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := loadWith(t, tc.changes)
			wantNoErrors(t, f)
			if f.Spec.Spec.DispatchEnabled() {
				t.Fatal("dispatch is on although fleet.yaml turns it off")
			}
		})
	}

	// The section itself is still checked: turning dispatch off keeps its pools for later.
	data, first := withDispatch(t, off+"    pools:\n      - name: EU\n        residency: eu\n")
	f := loadWith(t, map[string]string{fleet.FleetFile: data})
	wantOnlyError(t, f.Errors, fleet.FleetFile, first+3, 9, `dispatch pool name "EU" must be a DNS label`)
}

func TestTemplateDispatchExampleLoadsOnceUncommented(t *testing.T) {
	const start = "  # dispatch:\n"
	s := template(t, fleet.FleetFile)
	i := strings.Index(s, start)
	if i < 0 {
		t.Fatalf("the template's fleet.yaml has no commented %q", strings.TrimSpace(start))
	}
	lines := strings.SplitAfter(s[i:], "\n")
	for j, l := range lines {
		if l != "" && !strings.HasPrefix(l, "  # ") {
			t.Fatalf("the commented dispatch section ends before the file does, at %q", l)
		}
		lines[j] = strings.Replace(l, "# ", "", 1)
	}
	f := loadWith(t, map[string]string{fleet.FleetFile: s[:i] + strings.Join(lines, "")})
	wantNoErrors(t, f)

	d := f.Spec.Spec.Dispatch
	if d == nil || !ptr.Deref(d.Enabled, false) || d.DrainGracePeriod == nil || d.DrainGracePeriod.Duration != time.Hour {
		t.Fatalf("dispatch section = %+v, want enabled: true and drainGracePeriod: 1h", d)
	}
	for name, want := range map[string]string{example: "us-h100", fleetgen.ClusterName(0): "us", fleetgen.ClusterName(1): "eu"} {
		if got, err := fleet.PoolOf(&f.Spec.Spec, name, f.Clusters[name].Object.Spec.Residency); err != nil || got != want {
			t.Errorf("cluster %s is in pool %q (%v), want %q", name, got, err, want)
		}
	}
}
