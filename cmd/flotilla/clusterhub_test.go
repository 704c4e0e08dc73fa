package main

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

func TestClusterListShowsTheNamespaceOfTheContext(t *testing.T) {
	fx := newHubFixture(t)
	acmeRows := [][]string{
		{"gpu-east", "us-east1", "gke-dws", "false", "True", "True", "True", "True", "16× NVIDIA-H100-80GB-HBM3", "2d", "in 88d"},
		{"gpu-west", "us-west1", "gpu", "true", "False", "Unknown", "Unknown", "Unknown", "<none>", "<never>", "<none>"},
	}
	betaRows := [][]string{
		{"tpu-lab", "europe-west4", "gke-dws", "false", "Unknown", "Unknown", "Unknown", "Unknown", "<none>", "<never>", "<none>"},
	}
	tests := []struct {
		name string
		env  bool // KUBECONFIG instead of --kubeconfig
		args []string
		want [][]string
	}{
		{"the current context's namespace by default", false, []string{"cluster", "list"}, acmeRows},
		{"-n before the subcommand", false, []string{"-n", fx.beta, "cluster", "list"}, betaRows},
		{"--namespace after the subcommand", false, []string{"cluster", "list", "--namespace", fx.beta}, betaRows},
		{"--context picks the context's namespace", false, []string{"--context", "beta", "cluster", "ls"}, betaRows},
		{"-n wins over the context's namespace", false, []string{"--context", "beta", "-n", fx.acme, "cluster", "list"}, acmeRows},
		{"KUBECONFIG when --kubeconfig is not given", true, []string{"cluster", "list"}, acmeRows},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if tt.env {
				t.Setenv("KUBECONFIG", fx.kubeconfig)
			} else {
				t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "absent"))
				args = append([]string{"--kubeconfig", fx.kubeconfig}, args...)
			}
			code, out, errOut := runCLI(t, args...)
			if code != 0 || errOut != "" {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
			header, rows := tableRows(t, out)
			wantHeader := []string{"NAME", "REGION", "PRESET", "CORDONED", "REGISTERED", "CONNECTED", "CONFIGURED", "READY", "GPUS", "LAST SEEN", "CREDENTIAL EXPIRES"}
			if strings.Join(header, "|") != strings.Join(wantHeader, "|") {
				t.Fatalf("header %q, want %q", header, wantHeader)
			}
			if len(rows) != len(tt.want) {
				t.Fatalf("%d rows, want %d:\n%s", len(rows), len(tt.want), out)
			}
			for i := range rows {
				if strings.Join(rows[i], "|") != strings.Join(tt.want[i], "|") {
					t.Errorf("row %d is %q, want %q", i, rows[i], tt.want[i])
				}
			}
		})
	}
}

func TestClusterListOfAnEmptyNamespaceSaysSo(t *testing.T) {
	fx := newHubFixture(t)
	code, out, errOut := runCLI(t, "--kubeconfig", fx.kubeconfig, "--context", "plain", "cluster", "list")
	if code != 0 || out != "" || !strings.Contains(errOut, `No worker clusters in namespace "default" (context "plain")`) {
		t.Fatalf("exit %d, stdout %q, stderr %q; want the default namespace named on stderr", code, out, errOut)
	}
}

func TestClusterListForMachines(t *testing.T) {
	fx := newHubFixture(t)
	for _, format := range []string{"json", "yaml"} {
		t.Run(format, func(t *testing.T) {
			code, out, errOut := runCLI(t, "--kubeconfig", fx.kubeconfig, "cluster", "list", "-o", format)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			var list v1alpha1.WorkerClusterList
			if err := yaml.UnmarshalStrict([]byte(out), &list); err != nil {
				t.Fatalf("output does not parse as a WorkerClusterList: %v\n%s", err, out)
			}
			if list.Kind != "WorkerClusterList" || list.APIVersion != "flotilla.dev/v1alpha1" || len(list.Items) != 2 {
				t.Fatalf("got %s %s with %d items", list.APIVersion, list.Kind, len(list.Items))
			}
			east, west := list.Items[0], list.Items[1]
			if east.Name != "gpu-east" || west.Name != "gpu-west" || east.Kind != "WorkerCluster" {
				t.Errorf("items %s (%s), %s; want gpu-east, gpu-west sorted, with their kind", east.Name, east.Kind, west.Name)
			}
			if east.Status.UnavailableGPUNodes != 1 || len(east.Status.Conditions) != 6 || len(east.ManagedFields) != 0 {
				t.Errorf("gpu-east has %d unavailable nodes, %d conditions and %d managed fields", east.Status.UnavailableGPUNodes, len(east.Status.Conditions), len(east.ManagedFields))
			}
			if format == "json" && !json.Valid([]byte(out)) {
				t.Error("-o json is not JSON")
			}
		})
	}
}

func TestClusterStatusDescribesOneCluster(t *testing.T) {
	fx := newHubFixture(t)
	code, out, errOut := runCLI(t, "--kubeconfig", fx.kubeconfig, "cluster", "status", "gpu-east")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	fp := fx.token.Hash().Fingerprint()
	want := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^Name: +gpu-east$`),
		regexp.MustCompile(`(?m)^Namespace: +` + fx.acme + `$`),
		regexp.MustCompile(`(?m)^Identity: +4-acme-gpu-east$`),
		regexp.MustCompile(`(?m)^Region: +us-east1 \(zone us-east1-b\)$`),
		regexp.MustCompile(`(?m)^Preset: +gke-dws$`),
		regexp.MustCompile(`(?m)^Cordoned: +false$`),
		regexp.MustCompile(`(?m)^Quota: +nvidia.com/gpu=16$`),
		regexp.MustCompile(`(?m)^Expected GPUs: +16× NVIDIA-H100-80GB-HBM3, 4× NVIDIA-L4$`),
		regexp.MustCompile(`(?m)^  Token in Git: +fingerprint ` + fp + `$`),
		regexp.MustCompile(`(?m)^  Redeemed: +\d{4}-\d\d-\d\dT\S+Z \(3d ago\), token fingerprint ` + fp + `$`),
		regexp.MustCompile(`(?m)^  Credential: +fingerprint ` + fx.credentialFP + `$`),
		// The credential's lifetime: its end, its last rotation and one unconfirmed.
		regexp.MustCompile(`(?m)^  Expires: +\d{4}-\d\d-\d\dT\S+Z \(in 88d\)$`),
		regexp.MustCompile(`(?m)^  Last rotated: +\d{4}-\d\d-\d\dT\S+Z \(36h ago\)$`),
		regexp.MustCompile(`(?m)^  Rotation: +unconfirmed since \S+Z \(120m ago\): the agent has not confirmed storing the new credential \(see its log\)$`),
		regexp.MustCompile(`(?m)^Agent: +v0\.4\.0$`),
		regexp.MustCompile(`(?m)^Kubernetes: +v1\.37\.2$`),
		regexp.MustCompile(`(?m)^Last seen: +\S+ \(2d ago\)$`),
		regexp.MustCompile(`(?m)^Desired hash: +sha256:(ab){32}$`),
		regexp.MustCompile(`(?m)^Applied hash: +sha256:(ab){32} \(current\)$`),
		regexp.MustCompile(`(?m)^GPUs: +16× NVIDIA-H100-80GB-HBM3 on 2 nodes$`),
		regexp.MustCompile(`(?m)^Unavailable: +1 GPU node not Ready or cordoned$`),
		// Every condition, in the order a cluster reaches them, with reason, age and message.
		regexp.MustCompile(`(?s)Conditions:\n  TYPE +STATUS +REASON +AGE +MESSAGE\n` +
			`  Registered +True +Redeemed +3d +enrollment token redeemed\n` +
			`  Connected +True +Connected +3d +tunnel up\n` +
			`  WorkerConfigured +True +Applied +3d +applied 7 objects\n` +
			`  Ready +True +Ready +3d +ready · 16× H100 80GB on 2 nodes\n` +
			`  DispatchReady +Unknown +MultiKueueNotConfigured +3d +the hub has no MultiKueue member for this cluster yet\n` +
			`  CredentialCurrent +True +Fresh +3d +expires at a time\n$`),
	}
	for _, re := range want {
		if !re.MatchString(out) {
			t.Errorf("output does not match %s:\n%s", re, out)
		}
	}
	if strings.Contains(out, fx.token.Reveal()) || strings.Contains(out, fx.token.Hash().String()) {
		t.Error("status printed the token or its full hash")
	}

	code, out, errOut = runCLI(t, "--kubeconfig", fx.kubeconfig, "cluster", "status", "gpu-west")
	if code != 0 {
		t.Fatalf("a cluster without an agent: exit %d: %s", code, errOut)
	}
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^Cordoned: +true: no new jobs are dispatched; running ones carry on$`),
		regexp.MustCompile(`(?m)^  Redeemed: +not yet: no agent has presented the enrollment token$`),
		regexp.MustCompile(`(?m)^Agent: +<never connected>$`),
		regexp.MustCompile(`(?m)^Last seen: +<never>$`),
		regexp.MustCompile(`(?m)^  Registered +False +AwaitingEnrollment +3d +waiting for the agent to redeem its enrollment token$`),
	} {
		if !re.MatchString(out) {
			t.Errorf("status of a cluster without an agent does not match %s:\n%s", re, out)
		}
	}
}
