package componenttest

import (
	"context"
	"fmt"
	"slices"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// probeNamespace is where the JobSet probe is created (dry run): a namespace every API server
// makes.
const probeNamespace = metav1.NamespaceDefault

// probe reports whether the API server calls c's webhooks, with dry-run creates that only a
// webhook changes: a ClusterQueue gets Kueue's resource-in-use finalizer from Kueue's mutating
// webhook; a JobSet gets its network defaults from JobSet's. Both pass the validating webhooks
// of their kinds on the way.
func probe(ctx context.Context, plane *controlplane.ControlPlane, c Component) (bool, string, error) {
	switch c {
	case Kueue:
		cq := &kueue.ClusterQueue{ObjectMeta: metav1.ObjectMeta{GenerateName: "componenttest-probe-"}}
		if err := plane.Client.Create(ctx, cq, client.DryRunAll); err != nil {
			return false, fmt.Sprintf("dry-run ClusterQueue: %v", err), nil
		}
		if !slices.Contains(cq.Finalizers, kueue.ResourceInUseFinalizerName) {
			return false, "a dry-run ClusterQueue came back without kueue's finalizer: the API server does not call kueue's mutating webhook yet", nil
		}
		return true, "", nil
	case JobSet:
		js := ProbeJobSet(probeNamespace)
		if err := plane.Client.Create(ctx, js, client.DryRunAll); err != nil {
			return false, fmt.Sprintf("dry-run JobSet: %v", err), nil
		}
		if js.Spec.Network == nil || js.Spec.Network.EnableDNSHostnames == nil {
			return false, "a dry-run JobSet came back without jobset's network defaults: the API server does not call jobset's mutating webhook yet", nil
		}
		return true, "", nil
	}
	return false, "", fmt.Errorf("no probe for component %q", c)
}

// ProbeJobSet is a small valid JobSet in namespace, named by the API server, for dry runs:
// only JobSet's mutating webhook sets its spec.network (the CRD's schema has no default there).
func ProbeJobSet(namespace string) *jobset.JobSet {
	return &jobset.JobSet{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "componenttest-probe-", Namespace: namespace},
		Spec: jobset.JobSetSpec{ReplicatedJobs: []jobset.ReplicatedJob{{
			Name:     "workers",
			Replicas: 1,
			Template: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "worker", Image: "registry.k8s.io/pause:3.10"}},
			}}}},
		}}},
	}
}
