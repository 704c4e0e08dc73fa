package v1alpha1

import (
	"time"

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
	// ConditionReady sums the others up for people: True when the cluster is
	// registered, connected and configured at the current desired state. Its message is
	// the first unmet condition's.
	ConditionReady = "Ready"
	// ConditionCredentialCurrent is True while the agent's credential is outside the last
	// third of its lifetime (the hub rotates it long before); False once it is inside it
	// (rotations have not succeeded) or past it. Unset until an agent enrolled.
	ConditionCredentialCurrent = "CredentialCurrent"
)

// Reasons of a WorkerCluster's conditions. The package that owns the status
// (reconciler/conditions) sets them; anyone reading a status may compare against them.
const (
	// ReasonEnrolled (Registered True): an agent redeemed the enrollment token.
	ReasonEnrolled = "Enrolled"
	// ReasonTunnelUp (Connected True): the agent's tunnel is up.
	ReasonTunnelUp = "TunnelUp"
	// ReasonTunnelDown (Connected False): the agent hung up, or has not come back to a
	// restarted hub.
	ReasonTunnelDown = "TunnelDown"
	// ReasonSendTimeout (Connected False): the hub disconnected an agent that took
	// nothing it sent within the tunnel's write timeout.
	ReasonSendTimeout = "SendTimeout"
	// ReasonTooManyReports (Connected False): the hub disconnected an agent that kept
	// sending reports faster than its budget allows (an agent in a loop, or whoever
	// holds its credential).
	ReasonTooManyReports = "TooManyReports"
	// ReasonApplied (WorkerConfigured True): the agent applied the desired state whole.
	ReasonApplied = "Applied"
	// ReasonAdoptionRefused (WorkerConfigured False): an object the desired state names
	// exists on the worker and is not the agent's to take over.
	ReasonAdoptionRefused = "AdoptionRefused"
	// ReasonApplyFailed (WorkerConfigured False): the agent could not apply an object.
	ReasonApplyFailed = "ApplyFailed"
	// ReasonComponentsConverging (WorkerConfigured False): the agent is installing or
	// upgrading Kueue or JobSet, or waits for one to answer; the worker's ClusterQueues
	// admit no new work meanwhile.
	ReasonComponentsConverging = "ComponentsConverging"
	// ReasonComponentRefused (WorkerConfigured False): a Kueue or JobSet the agent did not
	// install is in the way, and the cluster has not opted in to handing it over.
	ReasonComponentRefused = "ComponentRefused"
	// ReasonRegistryNotAllowed (WorkerConfigured False): the desired state names a
	// registry the worker's administrator does not allow the components' images to come
	// from (the agent chart's components.allowedRegistries); nothing was installed.
	ReasonRegistryNotAllowed = "RegistryNotAllowed"
	// ReasonDigestNotAllowed (WorkerConfigured False): a component's image lacks the
	// digest the worker's administrator requires (the agent chart's
	// components.requiredDigests), or names another; nothing was installed.
	ReasonDigestNotAllowed = "DigestNotAllowed"
	// ReasonComponentFailed (WorkerConfigured False): installing or upgrading a component
	// failed.
	ReasonComponentFailed = "ComponentFailed"
	// ReasonOutdated (WorkerConfigured False): the agent last applied an older desired
	// state or generation than the current one; it is on its way, not failing.
	ReasonOutdated = "OutdatedGeneration"
	// ReasonReady (Ready True): registered, connected and configured.
	ReasonReady = "Ready"
	// ReasonAwaitingEnrollment, ReasonAwaitingConnection and ReasonAwaitingApply (Ready
	// False): the cluster has not reached that step yet.
	ReasonAwaitingEnrollment = "AwaitingEnrollment"
	ReasonAwaitingConnection = "AwaitingConnection"
	ReasonAwaitingApply      = "AwaitingApply"
	// ReasonMultiKueueNotConfigured (DispatchReady Unknown): the hub does not dispatch to
	// the cluster yet.
	ReasonMultiKueueNotConfigured = "MultiKueueNotConfigured"
	// ReasonDispatchable (DispatchReady True): Kueue's MultiKueue dispatches to the
	// cluster.
	ReasonDispatchable = "Dispatchable"
	// ReasonDispatchDisabled (DispatchReady False): fleet.yaml turns dispatch off.
	ReasonDispatchDisabled = "DispatchDisabled"
	// ReasonPoolFull (DispatchReady False): the cluster's pool already holds as many
	// clusters as Kueue allows; it was registered after them.
	ReasonPoolFull = "PoolFull"
	// ReasonCordoned (DispatchReady False): Git cordons the cluster; its work runs on.
	ReasonCordoned = "Cordoned"
	// ReasonAgentTooOld (DispatchReady False): the agent speaks no API proxy.
	ReasonAgentTooOld = "AgentTooOld"
	// ReasonAwaitingKueue (DispatchReady False): the hub's Kueue has not yet judged the
	// cluster's MultiKueueCluster.
	ReasonAwaitingKueue = "AwaitingKueue"
	// ReasonDraining (DispatchReady False): the cluster left the fleet and waits for the
	// work placed on it to finish before it is pruned.
	ReasonDraining = "Draining"
	// ReasonCredentialFresh (CredentialCurrent True): the credential is outside the last
	// third of its lifetime.
	ReasonCredentialFresh = "Fresh"
	// ReasonRotationFailing (CredentialCurrent False): the credential is in the last
	// third of its lifetime and the agent has not confirmed the new one the hub sent.
	ReasonRotationFailing = "RotationFailing"
	// ReasonExpiresSoon (CredentialCurrent False): the credential is in the last third of
	// its lifetime and the hub could not send a new one: the agent has not been connected.
	ReasonExpiresSoon = "ExpiresSoon"
	// ReasonCredentialExpired (CredentialCurrent False, Ready False): the credential's
	// lifetime is over and the hub refuses it; the cluster needs a new enrollment token.
	ReasonCredentialExpired = "CredentialExpired"
	// ReasonCredentialRevoked (CredentialCurrent False, Connected False): the credential
	// was issued under a lower spec.revocation than the cluster's; the hub refuses it.
	ReasonCredentialRevoked = "CredentialRevoked"
	// ReasonLifetimeNotRecorded (CredentialCurrent Unknown): the credential was issued by
	// a hub that recorded no lifetime; its lifetime starts when the agent next connects.
	ReasonLifetimeNotRecorded = "LifetimeNotRecorded"
)

// SourceStatus is where in the fleet repository a cluster's desired state comes from.
// It is status, recorded with the agent's acknowledgement when that comes promptly,
// so that a change to every cluster costs one write of each WorkerCluster, not one
// for the commit and another for the state.
type SourceStatus struct {
	// Commit is the newest commit that changed the cluster's inputs (its directory,
	// fleet.yaml's spec, or what the presets render of it): where its commit status
	// goes.
	// +kubebuilder:validation:MaxLength=64
	Commit string `json:"commit"`

	// InputsDigest is a digest of those inputs, so that a hub re-reading everything
	// after a restart can tell which clusters really changed. A hub that renders a
	// cluster differently from the one before it changes the digest too: the head,
	// which the new state is rendered from, then shows the cluster's status.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	InputsDigest string `json:"inputsDigest,omitempty"`
}

// Source is where the cluster's desired state comes from: status.source, or, on a
// WorkerCluster a hub of before status.source wrote last, the annotations that hub kept
// it in (so that the first reconcile after an upgrade still tells an unchanged cluster
// from a changed one, and posts its status on the commit it was posted on before).
// Empty until a hub recorded one.
func (wc *WorkerCluster) Source() SourceStatus {
	if wc.Status.Source != nil {
		return *wc.Status.Source
	}
	return SourceStatus{Commit: wc.Annotations[LegacySourceCommitAnnotation], InputsDigest: wc.Annotations[LegacySourceDigestAnnotation]}
}

// SourceCommit is the commit the cluster's desired state comes from, where its commit
// status goes; empty until the hub recorded one.
func (wc *WorkerCluster) SourceCommit() string { return wc.Source().Commit }

// Annotations in which hubs before status.source kept it. Source reads them; the hub's
// next write of the WorkerCluster's spec removes them.
const (
	LegacySourceCommitAnnotation = "flotilla.dev/source-commit"
	LegacySourceDigestAnnotation = "flotilla.dev/source-digest"
)

// DefaultCredentialLifetime is how long an agent credential is accepted when neither
// fleet.yaml nor cluster.yaml says: the hub rotates it daily, so a working cluster never
// comes near it, and a cluster whose rotations fail has a month's warning.
const DefaultCredentialLifetime = 90 * 24 * time.Hour

// Bounds of a credential lifetime in fleet.yaml and cluster.yaml: short enough that a
// leaked credential is not good for years, long enough that rotation has room to retry.
const (
	MinCredentialLifetime = time.Hour
	MaxCredentialLifetime = 366 * 24 * time.Hour
)

// Annotations the hub keeps on a WorkerCluster.
const (
	// EnrollmentBlobAnnotation is git's object name of the enrollment file whose token
	// hash is spec.enrollmentTokenHash, so that a hub that starts afresh on a fleet it
	// enrolled before decrypts (asks the key service about) only the files that
	// changed.
	EnrollmentBlobAnnotation = "flotilla.dev/enrollment-blob"
	// DecommissionAnnotation marks a cluster whose directory left the fleet: the agent
	// is asked to prune what it owns before the WorkerCluster is deleted.
	DecommissionAnnotation = "flotilla.dev/decommission"
	// DecommissionSinceAnnotation is when the decommission began (RFC 3339): a
	// connected agent has until maxPruneWaits StaleAfters after it to report its prune,
	// however often the fleet changes and however often the hub restarts meanwhile.
	DecommissionSinceAnnotation = "flotilla.dev/decommission-since"
	// DrainingSinceAnnotation marks a removed cluster whose work dispatched from the hub
	// still runs: it keeps its place in the hub's Kueue, held, until that work is done
	// or fleet.yaml's drainGracePeriod from this time (RFC 3339) is over. Then its
	// decommission begins.
	DrainingSinceAnnotation = "flotilla.dev/draining-since"
	// DrainedAnnotation marks a removed cluster whose drain is over.
	DrainedAnnotation = "flotilla.dev/drained"
	// HubErrorAnnotation holds the detail of the hub's last failure to reconcile the
	// cluster (the hub cluster's API, a key service) for its operators; the commit
	// status, which every reader of the repository sees, says only what kind of fault
	// it was. It is removed by the next reconcile that succeeds.
	HubErrorAnnotation = "flotilla.dev/hub-error"
	// InvalidAnnotation holds why the cluster's directory does not validate at the
	// source commit; the worker keeps its last good state meanwhile.
	InvalidAnnotation = "flotilla.dev/invalid"
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
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.revocation) || (has(self.revocation) && self.revocation >= oldSelf.revocation)",message="spec.revocation can only be raised: a lower count would let the credentials it revoked in again"
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

	// Revocation counts the revocations of the cluster's agent credentials: `flotilla
	// cluster rotate-token --revoke` raises it with a new enrollment token. The hub
	// stamps every credential it issues with the count in force, and refuses, and
	// disconnects, every credential stamped lower. A counter, not a time: the hub issues
	// credentials on its own (rotations), and the clocks of laptops drift.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Revocation int64 `json:"revocation,omitempty"`

	// Components overrides, for this cluster, how the fleet's Kueue and JobSet get there.
	// +optional
	Components *ClusterComponents `json:"components,omitempty"`

	// ExpectedGPUs are the GPUs the cluster should report once its agent is connected.
	// +listType=map
	// +listMapKey=product
	// +optional
	ExpectedGPUs []ExpectedGPU `json:"expectedGPUs,omitempty"`

	// CredentialLifetime is how long each credential of the cluster's agent is accepted
	// (a duration such as 720h). The hub rotates it over the tunnel long before; one
	// that runs out is refused, and the cluster needs a new enrollment token. Unset in
	// cluster.yaml, the hub sets fleet.yaml's; unset in both, 90 days.
	// +optional
	CredentialLifetime *metav1.Duration `json:"credentialLifetime,omitempty"`

	// EnrollmentTokenHash is the SHA-256 of the cluster's one-shot enrollment token, set
	// by the hub from the decrypted enrollment file; the token itself is never stored.
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-f]{64}$`
	// +optional
	EnrollmentTokenHash string `json:"enrollmentTokenHash,omitempty"`
}

// ComponentStatus is one component on a worker, as its agent last reported it.
type ComponentStatus struct {
	// Name is kueue or jobset.
	Name string `json:"name"`
	// Version is the version the fleet asks for.
	Version string `json:"version"`
	// Managed: the agent installs and upgrades it.
	// +optional
	Managed bool `json:"managed,omitempty"`
	// Ready: the component answers (its webhooks; for Kueue, the worker's ClusterQueues).
	Ready bool `json:"ready"`
	// Message says what the agent found or waits for.
	// +optional
	Message string `json:"message,omitempty"`
}

// ClusterComponents is one cluster's say in how its Kueue and JobSet are run.
type ClusterComponents struct {
	// Managed overrides fleet.yaml's spec.components.managed for this cluster: false
	// when the cluster's platform team runs Kueue and JobSet itself.
	// +optional
	Managed *bool `json:"managed,omitempty"`

	// Adopt hands over to the agent a Kueue or JobSet that was installed without it (by
	// hand, or by another Helm release): the agent takes ownership of the objects once,
	// keeping them and their UIDs. Without it such an installation is refused.
	// +optional
	Adopt bool `json:"adopt,omitempty"`
}

// Enrollment records the redemption of an enrollment token and the agent credential
// that replaced it.
type Enrollment struct {
	// TokenHash is the hash of the redeemed token: presenting it again is refused.
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-f]{64}$`
	TokenHash string `json:"tokenHash"`
	// RedeemedAt is when the token was redeemed.
	RedeemedAt metav1.Time `json:"redeemedAt"`
	// CredentialFingerprint names the agent credential in force (a prefix of its hash).
	// +optional
	CredentialFingerprint string `json:"credentialFingerprint,omitempty"`
	// CredentialIssuedAt is when that credential was issued.
	// +optional
	CredentialIssuedAt *metav1.Time `json:"credentialIssuedAt,omitempty"`
}

// CredentialStatus is the lifetime of the agent credential in force. The hub keeps the
// same, with the credential's hash, in the cluster's credential Secret.
type CredentialStatus struct {
	// IssuedAt is when the credential's lifetime began: when it was issued, or, for a
	// credential issued before the hub recorded lifetimes, when the hub first saw its
	// agent since (LifetimeAssumed).
	IssuedAt metav1.Time `json:"issuedAt"`
	// ExpiresAt is when the hub stops accepting the credential.
	ExpiresAt metav1.Time `json:"expiresAt"`
	// RotatedAt is when the agent last confirmed storing a credential the hub rotated
	// over the tunnel; unset until the first rotation.
	// +optional
	RotatedAt *metav1.Time `json:"rotatedAt,omitempty"`
	// RotationPendingSince is when the hub first sent the agent the new credential it
	// has not confirmed yet; unset while no rotation waits.
	// +optional
	RotationPendingSince *metav1.Time `json:"rotationPendingSince,omitempty"`
	// LifetimeAssumed: the credential was issued before the hub recorded lifetimes, and
	// its lifetime counts from IssuedAt, the hub's first sight of it since.
	// +optional
	LifetimeAssumed bool `json:"lifetimeAssumed,omitempty"`
	// Revocation is the spec.revocation the credential was issued under: one lower than
	// the spec's is revoked, and its agent needs the new enrollment token.
	// +optional
	Revocation int64 `json:"revocation,omitempty"`
}

// AgentInfo is what the agent said of itself on its last connection.
type AgentInfo struct {
	// +optional
	Version string `json:"version,omitempty"`
	// +optional
	KubernetesVersion string `json:"kubernetesVersion,omitempty"`
	// ProtocolVersion is the tunnel protocol version the hub and the agent agreed on;
	// dispatch needs at least 2.
	// +optional
	ProtocolVersion int32 `json:"protocolVersion,omitempty"`
}

// GPUTotal counts one GPU product on the cluster's Ready, schedulable nodes.
type GPUTotal struct {
	Product string `json:"product"`
	Count   int64  `json:"count"`
	Nodes   int32  `json:"nodes"`
}

// DispatchPlacement says whether a cluster is in its pool's MultiKueueConfig.
// +kubebuilder:validation:Enum=Member;PoolFull;Disabled;Draining
type DispatchPlacement string

const (
	// PlacementMember: the cluster is in its pool's MultiKueueConfig.
	PlacementMember DispatchPlacement = "Member"
	// PlacementPoolFull: the pool holds Kueue's most clusters already.
	PlacementPoolFull DispatchPlacement = "PoolFull"
	// PlacementDisabled: the fleet does not dispatch.
	PlacementDisabled DispatchPlacement = "Disabled"
	// PlacementDraining: the cluster left the fleet; it stays a member, cordoned, until
	// the work placed on it is done.
	PlacementDraining DispatchPlacement = "Draining"
)

// DispatchStatus is a cluster's place in the hub's Kueue.
type DispatchStatus struct {
	// Pool is the dispatch pool Git puts the cluster in.
	// +optional
	Pool string `json:"pool,omitempty"`
	// Placement says whether the cluster is in its pool's MultiKueueConfig.
	// +optional
	Placement DispatchPlacement `json:"placement,omitempty"`
	// Withdrawn is set once the hub's pool ClusterQueue no longer counts the cluster's
	// quota (it is cordoned or draining): a cordon is in force on the hub, not only on
	// the worker.
	// +optional
	Withdrawn bool `json:"withdrawn,omitempty"`
	// Active is the Active condition of the cluster's MultiKueueCluster as Kueue judges
	// it: whether Kueue reaches the worker.
	// +optional
	Active *KueueCondition `json:"active,omitempty"`
}

// KueueCondition is a condition Kueue set, carried over.
type KueueCondition struct {
	Status metav1.ConditionStatus `json:"status"`
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
	// LastTransitionTime is when Kueue last changed the condition's status: for a worker
	// Kueue cannot reach, since when, which tells whether its agent came back after.
	// +optional
	LastTransitionTime metav1.Time `json:"lastTransitionTime,omitempty"`
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

	// Source is the commit of the fleet repository the desired state comes from.
	// +optional
	Source *SourceStatus `json:"source,omitempty"`

	// Enrollment is set once an agent redeemed the enrollment token.
	// +optional
	Enrollment *Enrollment `json:"enrollment,omitempty"`

	// Credential is the lifetime of the agent credential in force; unset until an agent
	// enrolled, and for a credential of an older hub until its agent connects again.
	// +optional
	Credential *CredentialStatus `json:"credential,omitempty"`

	// LastSeen is when the hub last heard from the agent, recorded coarsely (about once
	// a minute while connected, less often with more than 600 agents connected to the
	// hub: ten records a second in all) so that heartbeats do not write to the API
	// server.
	// +optional
	LastSeen *metav1.Time `json:"lastSeen,omitempty"`

	// Agent is what the agent reported of itself.
	// +optional
	Agent *AgentInfo `json:"agent,omitempty"`

	// GPUs are the GPU totals the agent last reported.
	// +listType=map
	// +listMapKey=product
	// +optional
	GPUs []GPUTotal `json:"gpus,omitempty"`

	// UnavailableGPUNodes counts GPU nodes that are not Ready or are cordoned.
	// +optional
	UnavailableGPUNodes int32 `json:"unavailableGPUNodes,omitempty"`

	// Dispatch is the cluster's place in the hub's Kueue, as the hub last recorded it;
	// unset while the hub does not dispatch.
	// +optional
	Dispatch *DispatchStatus `json:"dispatch,omitempty"`

	// Components are the Kueue and JobSet the agent last reported on the worker.
	// +listType=map
	// +listMapKey=name
	// +optional
	Components []ComponentStatus `json:"components,omitempty"`

	// Conditions are Registered, Connected, WorkerConfigured, Ready, DispatchReady and
	// CredentialCurrent.
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
// +kubebuilder:printcolumn:name="Registered",type=string,JSONPath=`.status.conditions[?(@.type=="Registered")].status`
// +kubebuilder:printcolumn:name="Connected",type=string,JSONPath=`.status.conditions[?(@.type=="Connected")].status`
// +kubebuilder:printcolumn:name="Configured",type=string,JSONPath=`.status.conditions[?(@.type=="WorkerConfigured")].status`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Dispatch",type=string,JSONPath=`.status.conditions[?(@.type=="DispatchReady")].status`,priority=1
// +kubebuilder:printcolumn:name="GPUs",type=string,JSONPath=`.status.gpus[*].count`
// +kubebuilder:printcolumn:name="Product",type=string,JSONPath=`.status.gpus[*].product`,priority=1
// +kubebuilder:printcolumn:name="Credential Expires",type=string,JSONPath=`.status.credential.expiresAt`
// +kubebuilder:printcolumn:name="Credential",type=string,JSONPath=`.status.conditions[?(@.type=="CredentialCurrent")].reason`,priority=1
// +kubebuilder:printcolumn:name="Rotated",type=date,JSONPath=`.status.credential.rotatedAt`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
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
