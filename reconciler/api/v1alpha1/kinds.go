package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
)

// WorkerKinds are the kinds flotilla renders for a worker cluster, in the order its agent
// applies them: what others refer to comes first. The renderer refuses anything else,
// since any other kind could widen what a fleet repository can do to a worker (RBAC,
// workloads), and the agent's RBAC grants exactly these.
func WorkerKinds() []schema.GroupVersionKind {
	return []schema.GroupVersionKind{
		corev1.SchemeGroupVersion.WithKind("Namespace"),
		{Group: "scheduling.k8s.io", Version: "v1", Kind: "PriorityClass"},
		kueue.GroupVersion.WithKind("ResourceFlavor"),
		kueue.GroupVersion.WithKind("Topology"),
		kueue.GroupVersion.WithKind("WorkloadPriorityClass"),
		kueue.GroupVersion.WithKind("ProvisioningRequestConfig"),
		kueue.GroupVersion.WithKind("AdmissionCheck"),
		kueue.GroupVersion.WithKind("Cohort"),
		kueue.GroupVersion.WithKind("ClusterQueue"),
		kueue.GroupVersion.WithKind("LocalQueue"),
	}
}
