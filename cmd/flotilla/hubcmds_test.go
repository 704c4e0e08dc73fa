package main

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/secrets"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// planes[0] plays the hub's Kubernetes cluster.
var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) { controlplane.Main(m, 1, &planes, controlplane.Options{}) }

// hubFixture is a hub with two tenants' namespaces and a kubeconfig whose contexts point
// at each of them, as an engineer's would.
type hubFixture struct {
	kubeconfig   string
	acme, beta   string // namespaces
	token        secrets.Token
	credentialFP string
}

// The ages the fixture's times print as: whole days, so that the seconds a test takes
// never change them.
const (
	redeemedAgo = 3 * 24 * time.Hour
	seenAgo     = 2 * 24 * time.Hour
)

func newHubFixture(t *testing.T) hubFixture {
	t.Helper()
	ctx := t.Context()
	c := planes[0].Client
	fx := hubFixture{credentialFP: "c0ffee123456"}
	for _, ns := range []*string{&fx.acme, &fx.beta} {
		obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "tenant-"}}
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		*ns = obj.Name
	}
	tok, err := secrets.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	fx.token = tok
	now := time.Now()
	at := func(ago time.Duration) metav1.Time { return metav1.NewTime(now.Add(-ago)) }
	cond := func(typ string, status metav1.ConditionStatus, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, LastTransitionTime: at(redeemedAgo), ObservedGeneration: 1}
	}
	hash := "sha256:" + strings.Repeat("ab", 32)
	issued := at(redeemedAgo)
	clusters := []*v1alpha1.WorkerCluster{
		{
			// Created first, listed last: the table is sorted by name.
			ObjectMeta: metav1.ObjectMeta{Namespace: fx.acme, Name: "gpu-west"},
			Spec: v1alpha1.WorkerClusterSpec{Region: "us-west1", Residency: "us", Preset: "gpu", Cordoned: true,
				ExpectedGPUs: []v1alpha1.ExpectedGPU{{Product: "NVIDIA-A100-SXM4-40GB", Count: 8}}},
			Status: v1alpha1.WorkerClusterStatus{Conditions: []metav1.Condition{
				cond(v1alpha1.ConditionRegistered, metav1.ConditionFalse, "AwaitingEnrollment", "waiting for the agent to redeem its enrollment token"),
			}},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Namespace: fx.acme, Name: "gpu-east",
				Labels:      map[string]string{v1alpha1.WorkerClusterLabel: "4-acme-gpu-east"},
				Annotations: map[string]string{v1alpha1.SourceCommitAnnotation: strings.Repeat("1f", 20)}},
			Spec: v1alpha1.WorkerClusterSpec{DisplayName: "East GPUs", Region: "us-east1", Zone: "us-east1-b", Residency: "us", Preset: "gke-dws",
				Quota:               corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("16")},
				ExpectedGPUs:        []v1alpha1.ExpectedGPU{{Product: "NVIDIA-H100-80GB-HBM3", Count: 16}, {Product: "NVIDIA-L4", Count: 4}},
				EnrollmentTokenHash: tok.Hash().String()},
			Status: v1alpha1.WorkerClusterStatus{
				ObservedGeneration: 1, DesiredHash: hash, AppliedHash: hash,
				Enrollment: &v1alpha1.Enrollment{TokenHash: tok.Hash().String(), RedeemedAt: at(redeemedAgo),
					CredentialFingerprint: fx.credentialFP, CredentialIssuedAt: &issued},
				LastSeen:            ptrTo(at(seenAgo)),
				Agent:               &v1alpha1.AgentInfo{Version: "v0.4.0", KubernetesVersion: "v1.37.2"},
				GPUs:                []v1alpha1.GPUTotal{{Product: "NVIDIA-H100-80GB-HBM3", Count: 16, Nodes: 2}},
				UnavailableGPUNodes: 1,
				Conditions: []metav1.Condition{
					// Stored out of order: status prints them in the order a cluster reaches them.
					cond(v1alpha1.ConditionDispatchReady, metav1.ConditionUnknown, "MultiKueueNotConfigured", "the hub has no MultiKueue member for this cluster yet"),
					cond(v1alpha1.ConditionReady, metav1.ConditionTrue, "Ready", "ready · 16× H100 80GB on 2 nodes"),
					cond(v1alpha1.ConditionWorkerConfigured, metav1.ConditionTrue, "Applied", "applied 7 objects"),
					cond(v1alpha1.ConditionConnected, metav1.ConditionTrue, "Connected", "tunnel up"),
					cond(v1alpha1.ConditionRegistered, metav1.ConditionTrue, "Redeemed", "enrollment token redeemed"),
				},
			},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Namespace: fx.beta, Name: "tpu-lab"},
			Spec:       v1alpha1.WorkerClusterSpec{Region: "europe-west4", Residency: "eu", Preset: "gke-dws"},
		},
	}
	for _, wc := range clusters {
		status := wc.Status
		if err := c.Create(ctx, wc); err != nil {
			t.Fatalf("creating %s/%s: %v", wc.Namespace, wc.Name, err)
		}
		wc.Status = status
		if err := c.Status().Update(ctx, wc); err != nil {
			t.Fatalf("writing the status of %s/%s: %v", wc.Namespace, wc.Name, err)
		}
	}

	// The engineer's kubeconfig: the plane's admin credentials under three contexts.
	cfg, err := clientcmd.Load(planes[0].KubeConfig)
	if err != nil {
		t.Fatal(err)
	}
	cur := cfg.Contexts[cfg.CurrentContext]
	for name, ns := range map[string]string{"acme": fx.acme, "beta": fx.beta, "plain": ""} {
		ctxCopy := *cur
		ctxCopy.Namespace = ns
		cfg.Contexts[name] = &ctxCopy
	}
	cfg.CurrentContext = "acme"
	fx.kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, fx.kubeconfig); err != nil {
		t.Fatal(err)
	}
	return fx
}

func ptrTo[T any](v T) *T { return &v }

// tableRows splits kubectl-style table output into its cells, found from the header's
// column positions, so that a cell with a space in it stays one cell.
func tableRows(t *testing.T, out string) (header []string, rows [][]string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	cols := regexp.MustCompile(`\S+( \S+)*`).FindAllStringIndex(lines[0], -1)
	for _, c := range cols {
		header = append(header, lines[0][c[0]:c[1]])
	}
	for _, l := range lines[1:] {
		runes := []rune(l)
		var row []string
		for i, c := range cols {
			end := len(runes)
			if i+1 < len(cols) {
				end = min(cols[i+1][0], len(runes))
			}
			row = append(row, strings.TrimSpace(string(runes[min(c[0], len(runes)):end])))
		}
		rows = append(rows, row)
	}
	return header, rows
}

func TestClusterListShowsTheNamespaceOfTheContext(t *testing.T) {
	fx := newHubFixture(t)
	acmeRows := [][]string{
		{"gpu-east", "us-east1", "gke-dws", "false", "True", "True", "True", "True", "16× NVIDIA-H100-80GB-HBM3", "2d"},
		{"gpu-west", "us-west1", "gpu", "true", "False", "Unknown", "Unknown", "Unknown", "<none>", "<never>"},
	}
	betaRows := [][]string{
		{"tpu-lab", "europe-west4", "gke-dws", "false", "Unknown", "Unknown", "Unknown", "Unknown", "<none>", "<never>"},
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
			wantHeader := []string{"NAME", "REGION", "PRESET", "CORDONED", "REGISTERED", "CONNECTED", "CONFIGURED", "READY", "GPUS", "LAST SEEN"}
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
			if east.Status.UnavailableGPUNodes != 1 || len(east.Status.Conditions) != 5 || len(east.ManagedFields) != 0 {
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
			`  DispatchReady +Unknown +MultiKueueNotConfigured +3d +the hub has no MultiKueue member for this cluster yet\n$`),
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

func TestHubCommandsRefuse(t *testing.T) {
	fx := newHubFixture(t)
	kc := []string{"--kubeconfig", fx.kubeconfig}
	tests := []struct {
		name string
		args []string
		msg  string
	}{
		{"status of a cluster the namespace lacks", []string{"cluster", "status", "tpu-lab"},
			`no WorkerCluster "tpu-lab" in namespace "` + fx.acme + `" (context "acme") on the hub`},
		{"status of a cluster in another namespace", []string{"-n", fx.beta, "cluster", "status", "gpu-east"},
			`no WorkerCluster "gpu-east" in namespace "` + fx.beta + `"`},
		{"device ls of a missing cluster", []string{"device", "ls", "--cluster", "nope"}, `no WorkerCluster "nope" in namespace "` + fx.acme + `"`},
		{"device ls without --cluster", []string{"device", "ls"}, `required flag(s) "cluster" not set`},
		{"status with an unknown format", []string{"cluster", "status", "gpu-east", "-o", "wide"}, `--output must be json or yaml, not "wide"`},
		{"device ls as yaml", []string{"device", "ls", "--cluster", "gpu-east", "-o", "yaml"}, `--output must be json, not "yaml"`},
		{"an unknown context", []string{"--context", "nope", "cluster", "list"}, `context "nope" does not exist`},
		{"an invalid namespace", []string{"-n", "Acme", "cluster", "list"}, `namespace "Acme"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, append(kc, tt.args...)...)
			if code != 1 || out != "" || !strings.Contains(errOut, tt.msg) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and %q", code, out, errOut, tt.msg)
			}
		})
	}
	t.Run("a kubeconfig that does not exist", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "nope")
		code, _, errOut := runCLI(t, "--kubeconfig", missing, "cluster", "list")
		if code != 1 || !strings.Contains(errOut, "reading the hub's kubeconfig") || !strings.Contains(errOut, missing) {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
	})
}

func TestDeviceListShowsTheInventory(t *testing.T) {
	fx := newHubFixture(t)
	code, out, errOut := runCLI(t, "--kubeconfig", fx.kubeconfig, "device", "ls", "--cluster", "gpu-east")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	lines := strings.Split(out, "\n")
	if lines[0] != "Cluster gpu-east, reported 2d ago." {
		t.Errorf("first line %q", lines[0])
	}
	header, rows := tableRows(t, strings.Join(lines[1:len(lines)-2], "\n"))
	got := strings.Join(header, "|")
	for _, r := range rows {
		got += "\n" + strings.Join(r, "|")
	}
	// The L4s the cluster should have and does not report are a row of their own.
	want := "PRODUCT|GPUS|NODES|EXPECTED\nNVIDIA-H100-80GB-HBM3|16|2|16\nNVIDIA-L4|0|0|4"
	if got != want {
		t.Errorf("table\n%s\nwant\n%s", got, want)
	}
	if l := lines[len(lines)-2]; l != "Unavailable GPU nodes: 1 (not Ready or cordoned; their GPUs are not counted above)" {
		t.Errorf("last line %q", l)
	}

	code, out, errOut = runCLI(t, "--kubeconfig", fx.kubeconfig, "device", "ls", "--cluster", "gpu-east", "-o", "json")
	if code != 0 {
		t.Fatalf("-o json: exit %d: %s", code, errOut)
	}
	var inv struct {
		Cluster   string     `json:"cluster"`
		Namespace string     `json:"namespace"`
		LastSeen  *time.Time `json:"lastSeen"`
		GPUs      []struct {
			Product  string `json:"product"`
			Count    int64  `json:"count"`
			Nodes    int32  `json:"nodes"`
			Expected int32  `json:"expected"`
		} `json:"gpus"`
		UnavailableGPUNodes int32 `json:"unavailableGPUNodes"`
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&inv); err != nil {
		t.Fatalf("-o json does not parse: %v\n%s", err, out)
	}
	if inv.Cluster != "gpu-east" || inv.Namespace != fx.acme || inv.LastSeen == nil || inv.UnavailableGPUNodes != 1 || len(inv.GPUs) != 2 ||
		inv.GPUs[0].Product != "NVIDIA-H100-80GB-HBM3" || inv.GPUs[0].Count != 16 || inv.GPUs[0].Nodes != 2 || inv.GPUs[1].Expected != 4 {
		t.Errorf("inventory %+v", inv)
	}

	code, out, _ = runCLI(t, "--kubeconfig", fx.kubeconfig, "-n", fx.beta, "device", "ls", "--cluster", "tpu-lab")
	if code != 0 || out != "Cluster tpu-lab has never been seen by the hub; no GPUs reported.\nUnavailable GPU nodes: 0\n" {
		t.Errorf("a cluster never seen: exit %d, %q", code, out)
	}
}
