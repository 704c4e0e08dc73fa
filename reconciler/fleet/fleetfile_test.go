package fleet_test

import (
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/flotilla-gitops/flotilla/reconciler/fleet"
	"github.com/flotilla-gitops/flotilla/test/fleetgen"
)

// Lines of the template's fleet.yaml:
//
//	 2 apiVersion      13 hubURL
//	 3 kind            14 kueueVersion
//	 8 tenant          15 jobSetVersion
//	10 workloadNs:     16 statusContextPrefix
//	11 - ml-training   18 allowedResidencies:
//	                   19 - us, 20 - eu (items at column 7)
//	                   23 decommission

// fleetCase is one bad fleet.yaml: the error it must cause, on the fleet as a whole.
type fleetCase struct {
	name      string
	data      string
	line, col int
	msg       string
}

// runFleetRejects checks that each bad fleet.yaml fails the fleet with its own error,
// while every cluster still loads.
func runFleetRejects(t *testing.T, cases []fleetCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Helper()
			f := loadWith(t, map[string]string{fleet.FleetFile: tc.data})
			wantOnlyError(t, f.Errors, fleet.FleetFile, tc.line, tc.col, tc.msg)
			if f.Spec != nil || f.Valid() {
				t.Fatal("a fleet.yaml with errors gave a Spec")
			}
			wantOthersValid(t, f, "")
		})
	}
}

func TestLoadRejectsInvalidFleetFile(t *testing.T) {
	replace := func(old, new string) string { return edited(t, fleet.FleetFile, old, new) }
	runFleetRejects(t, []fleetCase{
		{name: "missing", data: removed,
			msg: "the repository has no fleet.yaml; every fleet repository starts with one"},
		{name: "tenant upper case", data: replace("tenant: example", "tenant: Example"), line: 8, col: 3,
			msg: `spec.tenant "Example" is not a DNS label: a lowercase RFC 1123 label`},
		{name: "tenant with underscore", data: replace("tenant: example", "tenant: my_tenant"), line: 8, col: 3,
			msg: `spec.tenant "my_tenant" is not a DNS label`},
		{name: "tenant too long", data: replace("tenant: example", "tenant: "+strings.Repeat("t", 64)), line: 8, col: 3,
			msg: "is not a DNS label: must be no more than 63 characters"},
		{name: "tenant empty", data: replace("tenant: example", `tenant: ""`), line: 8, col: 3,
			msg: "spec.tenant is required"},
		{name: "tenant missing", data: replace("  tenant: example\n", ""), line: 9, col: 3,
			msg: "spec.tenant is required"},
		{name: "hubURL https", data: replace("hubURL: wss://hub.example.com", "hubURL: https://hub.example.com"), line: 13, col: 3,
			msg: `spec.hubURL "https://hub.example.com" must be a wss:// URL with a host`},
		{name: "hubURL without host", data: replace("hubURL: wss://hub.example.com", "hubURL: wss://"), line: 13, col: 3,
			msg: `spec.hubURL "wss://" must be a wss:// URL with a host`},
		{name: "hubURL not a URL", data: replace("hubURL: wss://hub.example.com", `hubURL: "wss://hub example:port"`), line: 13, col: 3,
			msg: "must be a wss:// URL with a host"},
		{name: "hubURL missing", data: replace("  hubURL: wss://hub.example.com\n", ""), line: 8, col: 3,
			msg: "spec.hubURL is required: the wss:// address agents dial"},
		{name: "kueueVersion without v", data: replace("kueueVersion: v0.17.0", "kueueVersion: 0.17.0"), line: 14, col: 3,
			msg: `spec.kueueVersion "0.17.0" must be a release such as v0.17.0`},
		{name: "kueueVersion without patch", data: replace("kueueVersion: v0.17.0", "kueueVersion: v0.17"), line: 14, col: 3,
			msg: `spec.kueueVersion "v0.17" must be a release`},
		{name: "kueueVersion a branch", data: replace("kueueVersion: v0.17.0", "kueueVersion: main"), line: 14, col: 3,
			msg: `spec.kueueVersion "main" must be a release`},
		{name: "kueueVersion missing", data: replace("  kueueVersion: v0.17.0\n", ""), line: 8, col: 3,
			msg: `spec.kueueVersion "" must be a release`},
		{name: "kueueVersion not installable", data: replace("kueueVersion: v0.17.0", "kueueVersion: v0.16.2"), line: 14, col: 3,
			msg: "spec.kueueVersion v0.16.2 cannot be installed by this release of flotilla: it installs Kueue v0.17.0"},
		{name: "jobSetVersion not installable", data: replace("jobSetVersion: v0.11.1", "jobSetVersion: v0.12.0"), line: 15, col: 3,
			msg: "spec.jobSetVersion v0.12.0 cannot be installed by this release of flotilla: it installs JobSet v0.11.1"},
		{name: "jobSetVersion a branch", data: replace("jobSetVersion: v0.11.1", "jobSetVersion: latest"), line: 15, col: 3,
			msg: `spec.jobSetVersion "latest" must be a release such as v0.11.1`},
		{name: "statusContextPrefix with a space", data: replace("statusContextPrefix: flotilla", `statusContextPrefix: "my fleet"`), line: 27, col: 3,
			msg: "spec.statusContextPrefix must be at most 100 characters without spaces"},
		{name: "residency listed twice", data: replace("    - eu\n", "    - us\n"), line: 31, col: 7,
			msg: `residency "us" is listed twice`},
		{name: "residency empty", data: replace("    - eu\n", "    - \"\"\n"), line: 31, col: 7,
			msg: "an allowed residency may not be empty"},
		{name: "registry with a scheme", data: replace("    managed: true\n", "    managed: true\n    registry: https://mirror.example.com\n"), line: 25, col: 5,
			msg: `spec.components.registry "https://mirror.example.com" must be a registry host and optional path, without a scheme`},
		{name: "registry with a tag", data: replace("    managed: true\n", "    managed: true\n    registry: mirror.example.com/k8s:latest\n"), line: 25, col: 5,
			msg: `has an invalid path component "k8s:latest"`},
		{name: "registry not a host", data: replace("    managed: true\n", "    managed: true\n    registry: Mirror_Host/k8s\n"), line: 25, col: 5,
			msg: "must start with a registry host such as mirror.example.com"},
		{name: "registry with a bad port", data: replace("    managed: true\n", "    managed: true\n    registry: mirror.example.com:99999\n"), line: 25, col: 5,
			msg: `has an invalid port "99999"`},
		{name: "digest not sha256", data: replace("    managed: true\n", "    managed: true\n    kueueDigest: latest\n"), line: 25, col: 5,
			msg: `spec.components.kueueDigest "latest" must be an image digest, sha256: and 64 hex digits`},
		{name: "jobSet digest too short", data: replace("    managed: true\n", "    managed: true\n    jobSetDigest: sha256:abc\n"), line: 25, col: 5,
			msg: `spec.components.jobSetDigest "sha256:abc" must be an image digest`},
		{name: "wrong apiVersion", data: replace("apiVersion: flotilla.dev/v1alpha1", "apiVersion: flotilla.dev/v1"), line: 2, col: 1,
			msg: `apiVersion must be flotilla.dev/v1alpha1, not "flotilla.dev/v1"`},
		{name: "no apiVersion", data: replace("apiVersion: flotilla.dev/v1alpha1\n", ""), line: 2, col: 1,
			msg: `apiVersion must be flotilla.dev/v1alpha1, not ""`},
		{name: "wrong kind", data: replace("kind: Fleet", "kind: WorkerCluster"), line: 3, col: 1,
			msg: `kind must be Fleet, not "WorkerCluster"`},
		{name: "unknown field", data: replace("  tenant: example\n", "  tenant: example\n  tennant: example\n"), line: 9, col: 3,
			msg: `unknown field "spec.tennant"`},
		{name: "duplicate key", data: replace("  tenant: example\n", "  tenant: example\n  tenant: other\n"), line: 9, col: 3,
			msg: `duplicate key "tenant"; it is already set at line 8`},
		{name: "string for a list", data: replace("  workloadNamespaces:\n    - ml-training\n", "  workloadNamespaces: ml-training\n"), line: 10, col: 3,
			msg: "spec.workloadNamespaces: expected a list, got string"},
		{name: "unknown decommission policy", data: replace("decommission: Prune", "decommission: Delete"), line: 34, col: 3,
			msg: `spec.decommission "Delete" must be Prune or Keep`},
		{name: "second document", data: template(t, fleet.FleetFile) + "---\nkind: Fleet\n", line: strings.Count(template(t, fleet.FleetFile), "\n") + 1, col: 1,
			msg: "file must hold a single YAML document; a second one starts here"},
		{name: "invalid YAML", data: replace("tenant: example", "tenant: [example"), line: 8,
			msg: "invalid YAML: did not find expected ',' or ']'"},
		{name: "empty", data: "", msg: "file is empty"},
		{name: "NUL byte", data: replace("tenant: example", "tenant: exa\x00mple"), line: 8, col: 14,
			msg: "file contains a NUL byte; fleet files must be UTF-8 text"},
		{name: "invalid UTF-8", data: replace("tenant: example", "tenant: ex\xe9mple"), line: 8, col: 13,
			msg: "file is not valid UTF-8"},
	})

	t.Run("fleet.yaml is a directory", func(t *testing.T) {
		f := loadWith(t, map[string]string{fleet.FleetFile: removed, "fleet.yaml/fleet.yaml": template(t, fleet.FleetFile)})
		wantOnlyError(t, f.Errors, fleet.FleetFile, 0, 0, "expected a file, found a directory")
	})
}

func TestLoadRejectsInvalidWorkloadNamespaces(t *testing.T) {
	replace := func(old, new string) string { return edited(t, fleet.FleetFile, old, new) }
	runFleetRejects(t, []fleetCase{
		{name: "upper case", data: replace("    - ml-training\n", "    - ML-Training\n"), line: 11, col: 7,
			msg: `workload namespace "ML-Training" is not a valid namespace name: a lowercase RFC 1123 label`},
		{name: "with a dot", data: replace("    - ml-training\n", "    - ml.training\n"), line: 11, col: 7,
			msg: `workload namespace "ml.training" is not a valid namespace name`},
		{name: "empty", data: replace("    - ml-training\n", "    - \"\"\n"), line: 11, col: 7,
			msg: `workload namespace "" is not a valid namespace name`},
		{name: "too long", data: replace("    - ml-training\n", "    - "+strings.Repeat("n", 64)+"\n"), line: 11, col: 7,
			msg: "must be no more than 63 characters"},
		{name: "listed twice", data: replace("    - ml-training\n", "    - ml-training\n    - inference\n    - ml-training\n"), line: 13, col: 7,
			msg: `workload namespace "ml-training" is listed twice`},
		{name: "a Kubernetes system namespace", data: replace("    - ml-training\n", "    - ml-training\n    - kube-system\n"), line: 12, col: 7,
			msg: `workload namespace "kube-system" is a Kubernetes system namespace`},
		{name: "another kube- namespace", data: replace("    - ml-training\n", "    - kube-public\n"), line: 11, col: 7,
			msg: `workload namespace "kube-public" is a Kubernetes system namespace`},
		{name: "the default namespace", data: replace("    - ml-training\n", "    - default\n"), line: 11, col: 7,
			msg: `workload namespace "default" is the default namespace`},
		{name: "Kueue's namespace", data: replace("    - ml-training\n", "    - kueue-system\n"), line: 11, col: 7,
			msg: `workload namespace "kueue-system" is where the worker's Kueue and JobSet run`},
		{name: "JobSet's namespace", data: replace("    - ml-training\n", "    - jobset-system\n"), line: 11, col: 7,
			msg: `workload namespace "jobset-system" is where the worker's Kueue and JobSet run`},
		{name: "empty list", data: replace("  workloadNamespaces:\n    - ml-training\n", "  workloadNamespaces: []\n"), line: 10, col: 3,
			msg: "spec.workloadNamespaces needs at least one namespace where jobs run"},
		{name: "no list", data: replace("  workloadNamespaces:\n    - ml-training\n", ""), line: 8, col: 3,
			msg: "spec.workloadNamespaces needs at least one namespace where jobs run"},
	})

	f := loadWith(t, map[string]string{fleet.FleetFile: replace("    - ml-training\n", "    - ml-training\n    - inference\n")})
	wantNoErrors(t, f)
	if got := f.Spec.Spec.WorkloadNamespaces; len(got) != 2 || got[1] != "inference" {
		t.Fatalf("workload namespaces = %v", got)
	}
}

func TestLoadOfShippedTemplateHasNoErrors(t *testing.T) {
	f := fleet.Load(fleetgen.Template())
	wantNoErrors(t, f)
	if f.Spec.Spec.Tenant != "example" || f.Spec.Spec.HubURL != "wss://hub.example.com" {
		t.Fatalf("unexpected spec %+v", f.Spec.Spec)
	}
	if got := f.ClusterNames(); len(got) != 1 || got[0] != example {
		t.Fatalf("clusters = %v", got)
	}
	if !f.Clusters[example].Valid() {
		t.Fatal("the example cluster is not valid")
	}
	for _, name := range []string{"gke-dws", "gpu"} {
		p, ok := f.Presets[name]
		if !ok || len(p.Errors) > 0 || len(p.Files) == 0 || p.Digest == "" {
			t.Fatalf("preset %s: %+v", name, p)
		}
	}
	if len(f.Presets) != 2 {
		t.Fatalf("presets = %v", len(f.Presets))
	}
	if got := f.StatusContextPrefix(); got != "flotilla" {
		t.Fatalf("StatusContextPrefix = %q", got)
	}

	t.Run("on disk", func(t *testing.T) {
		onDisk := fleet.Load(diskFS(t, fleetgen.Template()))
		wantNoErrors(t, onDisk)
		if onDisk.Clusters[example].Digest != f.Clusters[example].Digest {
			t.Fatal("the same cluster on disk and in memory has another digest")
		}
	})
	t.Run("variants", func(t *testing.T) {
		for _, v := range fleetgen.Variants() {
			wantNoErrors(t, fleet.Load(v.FS))
		}
	})
	t.Run("synthetic fleet", func(t *testing.T) {
		const n = 40
		f := fleet.Load(fleetgen.Fleet(n, fleetgen.Options{CordonEvery: 4, OverlayEvery: 5}))
		wantNoErrors(t, f)
		if len(f.Clusters) != n {
			t.Fatalf("%d clusters, want %d", len(f.Clusters), n)
		}
		cordoned, overlays := 0, 0
		for i := range n {
			c := f.Clusters[fleetgen.ClusterName(i)]
			if !c.Valid() {
				t.Fatalf("cluster %s is not valid", c.Name)
			}
			if c.Object.Spec.Cordoned {
				cordoned++
			}
			if c.Overlay() != nil {
				overlays++
			}
		}
		if cordoned != n/4 || overlays != n/5 {
			t.Fatalf("%d cordoned and %d overlays, want %d and %d", cordoned, overlays, n/4, n/5)
		}
	})
}

func TestStatusContextPrefixDefaultsToFlotilla(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"  statusContextPrefix: flotilla\n", "flotilla"},
		{"", "flotilla"},
		{"  statusContextPrefix: acme-gpu\n", "acme-gpu"},
	} {
		f := loadWith(t, map[string]string{fleet.FleetFile: edited(t, fleet.FleetFile, "  statusContextPrefix: flotilla\n", tc.line)})
		wantNoErrors(t, f)
		if got := f.StatusContextPrefix(); got != tc.want {
			t.Errorf("StatusContextPrefix with %q = %q, want %q", tc.line, got, tc.want)
		}
	}
	if got := fleet.Load(fstest.MapFS{}).StatusContextPrefix(); got != "flotilla" {
		t.Errorf("StatusContextPrefix without fleet.yaml = %q", got)
	}
}

func TestLoadOfEmptyOrMissingClustersIsAValidFleet(t *testing.T) {
	withoutClusters := func() fstest.MapFS {
		fsys := fleetgen.Template()
		for p := range fsys {
			if strings.HasPrefix(p, "clusters/") {
				delete(fsys, p)
			}
		}
		return fsys
	}
	empty := withoutClusters()
	empty["clusters"] = &fstest.MapFile{Mode: 0o755 | fs.ModeDir}
	withReadme := withoutClusters()
	withReadme["clusters/README.md"] = &fstest.MapFile{Data: []byte("# Clusters\n")}

	cases := map[string]*fleet.Fleet{
		"missing clusters/":            fleet.Load(withoutClusters()),
		"empty clusters/":              fleet.Load(empty),
		"clusters/ with only a README": fleet.Load(withReadme),
		"empty clusters/ on disk":      fleet.Load(diskFS(t, empty)),
		"empty synthetic fleet":        fleet.Load(fleetgen.Fleet(0, fleetgen.Options{})),
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			wantNoErrors(t, f)
			if len(f.Clusters) != 0 || len(f.ClusterNames()) != 0 {
				t.Fatalf("clusters = %v", f.ClusterNames())
			}
		})
	}

	t.Run("clusters is a file", func(t *testing.T) {
		fsys := withoutClusters()
		fsys["clusters"] = &fstest.MapFile{Data: []byte("example-us-central1\n")}
		f := fleet.Load(fsys)
		wantOnlyError(t, f.AllErrors(), "clusters", 0, 0, "cannot read directory")
	})
}
