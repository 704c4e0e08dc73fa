package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxPoolClusters is the most clusters a dispatch pool may hold: Kueue allows at most
// 20 in one MultiKueueConfig.
const MaxPoolClusters = 20

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

	// Dispatch is how the hub's Kueue dispatches jobs to the fleet's workers.
	// +optional
	Dispatch *DispatchSpec `json:"dispatch,omitempty"`

	// CredentialLifetime is how long each agent credential is accepted (a duration such
	// as 2160h, between 1h and 8784h); a cluster.yaml may set its own. The hub rotates
	// credentials over the tunnel daily, or at half their lifetime when that is sooner,
	// so only a cluster whose rotations fail comes near the end. Default 2160h (90 days).
	// +optional
	CredentialLifetime *metav1.Duration `json:"credentialLifetime,omitempty"`

	// Components is how the workers get Kueue and JobSet at kueueVersion and
	// jobSetVersion.
	// +optional
	Components *FleetComponents `json:"components,omitempty"`
}

// FleetComponents configures the Kueue and JobSet the agents install on the workers.
type FleetComponents struct {
	// Managed: each agent installs and upgrades Kueue and JobSet with Helm; a cluster.yaml
	// may say otherwise for its cluster. `flotilla fleet init` writes true. When off, or
	// unset (fleets written before flotilla installed Kueue, whose workers keep the Kueue
	// they have until the fleet opts in), the clusters' platform teams run them, and the
	// agents report a version that is not the fleet's.
	// +optional
	Managed *bool `json:"managed,omitempty"`

	// Registry is a mirror of registry.k8s.io that the workers pull the release images
	// from, e.g. mirror.example.com/k8s. The repository path and the tag stay the
	// release's (kueue/kueue:v0.17.0); no other image can be named.
	// +kubebuilder:validation:MaxLength=200
	// +optional
	Registry string `json:"registry,omitempty"`

	// KueueDigest pins Kueue's release image (sha256:<64 hex digits>).
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-f]{64}$`
	// +optional
	KueueDigest string `json:"kueueDigest,omitempty"`

	// JobSetDigest pins JobSet's release image.
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-f]{64}$`
	// +optional
	JobSetDigest string `json:"jobSetDigest,omitempty"`
}

// DispatchSpec configures dispatch from the hub (Kueue's MultiKueue) to the workers.
type DispatchSpec struct {
	// Enabled turns dispatch on; it is on unless set to false. A fleet whose team only
	// wants its workers configured turns it off: then a cluster is done when it is
	// configured, and DispatchReady says DispatchDisabled.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`

	// Pools group the workers. A job submitted to a pool's LocalQueue on the hub runs
	// only on that pool's clusters. Without pools there is one per residency, named
	// after it, so a job never leaves its residency. A pool holds at most 20 clusters
	// (Kueue's limit for one MultiKueueConfig); the clusters over it, the ones
	// registered last, are not dispatchable until pools are declared.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=100
	// +optional
	Pools []DispatchPool `json:"pools,omitempty"`

	// DrainGracePeriod bounds how long a removed cluster keeps its place in the hub's
	// Kueue while work placed on it runs. Default one hour.
	// +optional
	DrainGracePeriod *metav1.Duration `json:"drainGracePeriod,omitempty"`
}

// DispatchPool is a group of workers behind one hub ClusterQueue.
type DispatchPool struct {
	// Name of the pool: the hub LocalQueue's name, and with the tenant the names of the
	// hub's ClusterQueue, AdmissionCheck and MultiKueueConfig.
	// +kubebuilder:validation:MaxLength=40
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// Residency of every cluster in the pool: a job of the pool never leaves it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Residency string `json:"residency"`

	// Clusters are the worker names in the pool, at most 20. A cluster is in at most
	// one pool. A cluster that no pool names is in the pool named after its residency:
	// a declared one of that name and residency, or one made for it.
	// +kubebuilder:validation:MaxItems=20
	// +listType=set
	// +optional
	Clusters []string `json:"clusters,omitempty"`
}

// DispatchEnabled reports whether the fleet dispatches: unless it says not to.
func (s *FleetSpec) DispatchEnabled() bool {
	return s.Dispatch == nil || s.Dispatch.Enabled == nil || *s.Dispatch.Enabled
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
