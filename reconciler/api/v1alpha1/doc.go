// Package v1alpha1 holds the flotilla.dev/v1alpha1 API: the Fleet read from a fleet
// repository's fleet.yaml and the WorkerCluster read from clusters/<name>/cluster.yaml.
//
// The same WorkerCluster type is what the hub stores on its Kubernetes cluster: spec
// comes from Git, status from the agent. Validation markers here are what the hub's API
// server enforces; the fleet loader enforces the same rules before anything is stored,
// with errors that point at the file and line a fleet owner has to change.
//
// +kubebuilder:object:generate=true
// +groupName=flotilla.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API group and version of flotilla's objects.
	GroupVersion = schema.GroupVersion{Group: "flotilla.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Fleet{}, &FleetList{}, &WorkerCluster{}, &WorkerClusterList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
