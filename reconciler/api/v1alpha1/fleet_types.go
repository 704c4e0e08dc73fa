package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FleetSpec is what fleet.yaml declares for every cluster of a tenant.
type FleetSpec struct {
	// Tenant owns the fleet. Worker names are unique inside a tenant, and the tenant is
	// part of every worker's identity.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Tenant string `json:"tenant"`

	// WorkloadNamespaces are the namespaces on every worker where jobs run. Each gets the
	// preset's LocalQueues. flotilla creates them when missing and never deletes them.
	// +kubebuilder:validation:MinItems=1
	// +listType=set
	WorkloadNamespaces []string `json:"workloadNamespaces"`

	// HubURL is where agents dial the hub (wss://...).
	// +kubebuilder:validation:Pattern=`^wss?://`
	HubURL string `json:"hubURL"`

	// KueueVersion is the Kueue release the workers run, e.g. v0.17.0.
	// +kubebuilder:validation:Pattern=`^v[0-9]+\.[0-9]+\.[0-9]+`
	KueueVersion string `json:"kueueVersion"`

	// JobSetVersion is the JobSet release the workers run, e.g. v0.11.1.
	// +kubebuilder:validation:Pattern=`^v[0-9]+\.[0-9]+\.[0-9]+`
	// +optional
	JobSetVersion string `json:"jobSetVersion,omitempty"`

	// StatusContextPrefix starts the commit-status context of every cluster
	// (<prefix>/<worker>). Defaults to "flotilla".
	// +kubebuilder:validation:MaxLength=100
	// +optional
	StatusContextPrefix string `json:"statusContextPrefix,omitempty"`

	// AllowedResidencies, when set, is the only residencies a cluster may declare.
	// +listType=set
	// +optional
	AllowedResidencies []string `json:"allowedResidencies,omitempty"`

	// Decommission is what a worker keeps when its cluster directory leaves the fleet.
	// Prune (the default) deletes every object the agent applied for the cluster; Keep
	// leaves them running, for a cluster handed over to other hands, and only revokes
	// the agent. Either way the WorkerCluster goes and nothing unlabeled is touched.
	// +kubebuilder:validation:Enum=Prune;Keep
	// +optional
	Decommission DecommissionPolicy `json:"decommission,omitempty"`
}

// DecommissionPolicy says what happens on a worker whose cluster leaves the fleet.
type DecommissionPolicy string

const (
	// DecommissionPrune deletes what the agent owns on the worker.
	DecommissionPrune DecommissionPolicy = "Prune"
	// DecommissionKeep leaves the worker's objects in place.
	DecommissionKeep DecommissionPolicy = "Keep"
)

// Fleet is the fleet.yaml at the root of a fleet repository.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced
type Fleet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec FleetSpec `json:"spec"`
}

// FleetList is a list of Fleets.
//
// +kubebuilder:object:root=true
type FleetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Fleet `json:"items"`
}
