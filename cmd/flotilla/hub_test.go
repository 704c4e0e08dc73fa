package main

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/secrets"
)

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
	// The agent's credential was rotated a day and a half ago, for 90 days, and a rotation has
	// waited for the agent's confirmation for two hours.
	rotatedAgo         = 36 * time.Hour
	pendingAgo         = 2 * time.Hour
	credentialLifetime = 90 * 24 * time.Hour
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
				Labels: map[string]string{v1alpha1.WorkerClusterLabel: "4-acme-gpu-east"}},
			Spec: v1alpha1.WorkerClusterSpec{DisplayName: "East GPUs", Region: "us-east1", Zone: "us-east1-b", Residency: "us", Preset: "gke-dws",
				Quota:               corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("16")},
				ExpectedGPUs:        []v1alpha1.ExpectedGPU{{Product: "NVIDIA-H100-80GB-HBM3", Count: 16}, {Product: "NVIDIA-L4", Count: 4}},
				EnrollmentTokenHash: tok.Hash().String()},
			Status: v1alpha1.WorkerClusterStatus{
				ObservedGeneration: 1, DesiredHash: hash, AppliedHash: hash, Source: &v1alpha1.SourceStatus{Commit: strings.Repeat("1f", 20)},
				Enrollment: &v1alpha1.Enrollment{TokenHash: tok.Hash().String(), RedeemedAt: at(redeemedAgo),
					CredentialFingerprint: fx.credentialFP, CredentialIssuedAt: &issued},
				Credential: &v1alpha1.CredentialStatus{IssuedAt: at(rotatedAgo), ExpiresAt: at(rotatedAgo - credentialLifetime),
					RotatedAt: ptrTo(at(rotatedAgo)), RotationPendingSince: ptrTo(at(pendingAgo))},
				LastSeen:            ptrTo(at(seenAgo)),
				Agent:               &v1alpha1.AgentInfo{Version: "v0.4.0", KubernetesVersion: "v1.37.2"},
				GPUs:                []v1alpha1.GPUTotal{{Product: "NVIDIA-H100-80GB-HBM3", Count: 16, Nodes: 2}},
				UnavailableGPUNodes: 1,
				Conditions: []metav1.Condition{
					// Stored out of order: status prints them in the order a cluster reaches them.
					cond(v1alpha1.ConditionCredentialCurrent, metav1.ConditionTrue, "Fresh", "expires at a time"),
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
