package conditions

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

func enrolled(wc *v1alpha1.WorkerCluster) *v1alpha1.WorkerCluster {
	wc.Status.Enrollment = &v1alpha1.Enrollment{TokenHash: "sha256:" + strings.Repeat("ab", 32), RedeemedAt: metav1.NewTime(at)}
	return wc
}

func withGPUs(wc *v1alpha1.WorkerCluster) *v1alpha1.WorkerCluster {
	wc.Status.GPUs = []v1alpha1.GPUTotal{{Product: "NVIDIA-H100-80GB-HBM3", Count: 64, Nodes: 8}}
	return wc
}

func hashes(desired, applied string) func(*v1alpha1.WorkerCluster) *v1alpha1.WorkerCluster {
	return func(wc *v1alpha1.WorkerCluster) *v1alpha1.WorkerCluster {
		wc.Status.DesiredHash, wc.Status.AppliedHash = desired, applied
		return wc
	}
}

// reportOf makes WorkerConfigured about the agent's report of generation.
func reportOf(generation int64) func(*v1alpha1.WorkerCluster) *v1alpha1.WorkerCluster {
	return func(wc *v1alpha1.WorkerCluster) *v1alpha1.WorkerCluster {
		meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionWorkerConfigured).ObservedGeneration = generation
		return wc
	}
}

// TestDerive pins how a cluster's facts sum up into Ready and its commit status, in
// the order a new cluster meets them.
func TestDerive(t *testing.T) {
	tests := []struct {
		name string
		wc   *v1alpha1.WorkerCluster
		// ready is Ready's status/reason; state the commit status's.
		ready string
		state commitstatus.State
		// says is a part of the commit status's description.
		says string
	}{
		{"a cluster whose agent never came waits for its enrollment", worker(),
			"False/AwaitingEnrollment", commitstatus.Pending, "install the agent with the cluster's values file"},
		{"a redeemed token waits for the connection", enrolled(worker()),
			"False/AwaitingConnection", commitstatus.Pending, "waiting for the agent to connect"},
		{"a connected agent waits for its apply", enrolled(worker("Connected=True/TunnelUp")),
			"False/AwaitingApply", commitstatus.Pending, "waiting for the agent to apply"},
		{"an applied state is ready, with its GPUs", withGPUs(hashes("h1", "h1")(enrolled(worker("Connected=True/TunnelUp", "WorkerConfigured=True/Applied")))),
			"True/Ready", commitstatus.Success, "ready · 64× H100 80GB on 8 nodes"},
		{"a cluster without GPUs is ready and says so", hashes("h1", "h1")(enrolled(worker("Connected=True/TunnelUp", "WorkerConfigured=True/Applied"))),
			"True/Ready", commitstatus.Success, "no GPUs reported"},
		{"a new desired state waits for the agent", hashes("h2", "h1")(enrolled(worker("Connected=True/TunnelUp", "WorkerConfigured=True/Applied"))),
			"False/OutdatedGeneration", commitstatus.Pending, "waiting for the agent to apply h2; it last applied h1"},
		{"a refusal fails the commit", hashes("h1", "")(enrolled(worker("Connected=True/TunnelUp", "WorkerConfigured=False/AdoptionRefused"))),
			"False/AdoptionRefused", commitstatus.Failure, "before"},
		{"a report of a generation newer than the WorkerCluster's is judged by its hash", reportOf(5)(hashes("h1", "h1")(enrolled(worker("Connected=True/TunnelUp", "WorkerConfigured=True/Applied")))),
			"True/Ready", commitstatus.Success, "ready"},
		{"a disconnected agent is pending, not failed", hashes("h1", "h1")(enrolled(worker("Connected=False/TunnelDown", "WorkerConfigured=True/Applied"))),
			"False/TunnelDown", commitstatus.Pending, "before"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			Derive(tt.wc, at)
			c := meta.FindStatusCondition(tt.wc.Status.Conditions, v1alpha1.ConditionReady)
			if got := string(c.Status) + "/" + c.Reason; got != tt.ready {
				t.Errorf("Ready = %s (%q), want %s", got, c.Message, tt.ready)
			}
			st := CommitStatus("flotilla/gpu-a", tt.wc)
			if st.State != tt.state || !strings.Contains(st.Description, tt.says) || st.Context != "flotilla/gpu-a" {
				t.Errorf("commit status = %+v, want %s saying %q", st, tt.state, tt.says)
			}
			if d := meta.FindStatusCondition(tt.wc.Status.Conditions, v1alpha1.ConditionDispatchReady); d == nil || d.Status == metav1.ConditionTrue {
				t.Errorf("DispatchReady = %+v: the hub does not dispatch yet, so it must never be True", d)
			}
			if tt.wc.Status.ObservedGeneration != tt.wc.Generation {
				t.Errorf("observedGeneration %d, want %d", tt.wc.Status.ObservedGeneration, tt.wc.Generation)
			}
		})
	}
}

func TestDeriveJudgesReportsAgainstTheCurrentGeneration(t *testing.T) {
	wc := hashes("h1", "h1")(enrolled(worker("Connected=True/TunnelUp", "WorkerConfigured=True/Applied")))
	Derive(wc, at)
	if c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionReady); c.Status != metav1.ConditionTrue {
		t.Fatalf("Ready = %+v before the spec moved", c)
	}
	wc.Generation = 3 // a merge cordoned the cluster: same objects, new generation
	Derive(wc, at)
	c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionWorkerConfigured)
	if c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonOutdated || !strings.Contains(c.Message, "apply generation 3; it last applied generation 2") {
		t.Fatalf("WorkerConfigured = %+v, want Outdated naming both generations", c)
	}
	if st := CommitStatus("flotilla/gpu-a", wc); st.State != commitstatus.Pending {
		t.Fatalf("commit status %+v, want pending while the agent catches up", st)
	}
}

func TestDeriveIsStable(t *testing.T) {
	wc := withGPUs(hashes("h1", "h1")(enrolled(worker("Connected=True/TunnelUp", "WorkerConfigured=True/Applied"))))
	Derive(wc, at)
	once := wc.DeepCopy()
	Derive(wc, at)
	if !equality.Semantic.DeepEqual(once.Status, wc.Status) {
		t.Fatalf("deriving twice changed the status:\n%+v\n%+v", once.Status, wc.Status)
	}
}

func TestCommitStatusOfAnInvalidDirectory(t *testing.T) {
	wc := withGPUs(hashes("h1", "h1")(enrolled(worker("Connected=True/TunnelUp", "WorkerConfigured=True/Applied"))))
	wc.Annotations = map[string]string{v1alpha1.InvalidAnnotation: "clusters/gpu-a/cluster.yaml:3: unknown preset \"a200\""}
	Derive(wc, at)
	st := CommitStatus("flotilla/gpu-a", wc)
	if st.State != commitstatus.Failure || st.Description != wc.Annotations[v1alpha1.InvalidAnnotation] {
		t.Fatalf("commit status %+v: an invalid directory fails its commit though the worker runs its last good state", st)
	}
}
