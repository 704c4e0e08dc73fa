package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types of a WorkerCluster, in the order a new cluster reaches them.
const (
	// ConditionRegistered is True once an agent of this identity redeemed the one-shot
	// enrollment token.
	ConditionRegistered = "Registered"
	// ConditionConnected is True while the tunnel is up and the heartbeat is current.
	ConditionConnected = "Connected"
	// ConditionWorkerConfigured is True when the agent applied the desired generation
	// with no refused object.
	ConditionWorkerConfigured = "WorkerConfigured"
	// ConditionDispatchReady is True when the cluster is connected, configured at the
	// desired generation, not cordoned, and its MultiKueue member is Active.
	ConditionDispatchReady = "DispatchReady"
)

// ExpectedGPU is a kind of GPU the cluster should report, and how many of it.
type ExpectedGPU struct {
	// Product is the GPU product as the node reports it (nvidia.com/gpu.product), e.g.
	// NVIDIA-H100-80GB-HBM3.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Product string `json:"product"`

	// Count is the number of such GPUs across the cluster's nodes.
	// +kubebuilder:validation:Minimum=1
	Count int32 `json:"count"`
}

// WorkerClusterSpec is what clusters/<name>/cluster.yaml declares.
type WorkerClusterSpec struct {
	// DisplayName is a human name for dashboards and commit statuses.
	// +kubebuilder:validation:MaxLength=100
	// +optional
	DisplayName string `json:"displayName,omitempty"`

	// Region is the cloud or site region of the cluster, e.g. us-central1.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Region string `json:"region"`

	// Zone is the zone inside the region, e.g. us-central1-a.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Zone string `json:"zone,omitempty"`

	// Residency is where the data of jobs on this cluster may live, e.g. eu or us. A
	// fleet may restrict the values.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Residency string `json:"residency"`

	// Preset names the scheduling preset under presets/ whose Kueue objects the cluster
	// gets.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Preset string `json:"preset"`

	// Quota sets the nominal quota of the cluster's ClusterQueues per resource
	// (nvidia.com/gpu, cpu, memory, ...).
	// +optional
	Quota corev1.ResourceList `json:"quota,omitempty"`

	// Cordoned stops new dispatch to the cluster. Running work is never disturbed.
	// +optional
	Cordoned bool `json:"cordoned,omitempty"`

	// ExpectedGPUs are the GPUs the cluster should report once its agent is connected.
	// +listType=map
	// +listMapKey=product
	// +optional
	ExpectedGPUs []ExpectedGPU `json:"expectedGPUs,omitempty"`
}

// WorkerClusterStatus is what the hub last learnt from the cluster's agent.
type WorkerClusterStatus struct {
	// ObservedGeneration is the metadata.generation the status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// DesiredHash is the content hash of the rendered objects: the desired generation.
	// +optional
	DesiredHash string `json:"desiredHash,omitempty"`

	// AppliedHash is the desired generation the agent last applied.
	// +optional
	AppliedHash string `json:"appliedHash,omitempty"`

	// Conditions are Registered, Connected, WorkerConfigured and DispatchReady.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// WorkerCluster is one enrolled GPU worker cluster.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=wc
// +kubebuilder:printcolumn:name="Region",type=string,JSONPath=`.spec.region`
// +kubebuilder:printcolumn:name="Preset",type=string,JSONPath=`.spec.preset`
// +kubebuilder:printcolumn:name="Cordoned",type=boolean,JSONPath=`.spec.cordoned`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="DispatchReady")].status`
type WorkerCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   WorkerClusterSpec   `json:"spec"`
	Status WorkerClusterStatus `json:"status,omitempty"`
}

// WorkerClusterList is a list of WorkerClusters.
//
// +kubebuilder:object:root=true
type WorkerClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WorkerCluster `json:"items"`
}
