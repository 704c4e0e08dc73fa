package v1alpha1

// Labels and annotations that flotilla puts on what it renders. The agent relies on them
// to tell its own objects from everything else on a worker cluster.
const (
	// ManagedByLabel marks every object that flotilla renders for a worker.
	ManagedByLabel = "flotilla.dev/managed-by"
	// ManagedByValue is the value of ManagedByLabel.
	ManagedByValue = "flotilla"
	// WorkerClusterLabel carries the identity of the WorkerCluster that owns an object.
	WorkerClusterLabel = "flotilla.dev/worker-cluster"
	// TenantLabel carries the tenant that owns an object on the hub: its dispatch
	// objects, and the hub namespaces where its jobs are submitted.
	TenantLabel = "flotilla.dev/tenant"

	// ApplyAnnotation set to ApplyIfNotPresent makes the agent create the object when it
	// is missing and otherwise leave it alone (workload namespaces belong to the users
	// that run jobs in them once they exist).
	ApplyAnnotation   = "flotilla.dev/apply"
	ApplyIfNotPresent = "IfNotPresent"
	// PruneAnnotation set to PruneDisabled keeps the agent from ever deleting the object,
	// also when the cluster stops wanting it.
	PruneAnnotation = "flotilla.dev/prune"
	PruneDisabled   = "disabled"

	// AgentConnectedAnnotation on a MultiKueueCluster holds when its worker's agent last
	// connected (RFC 3339), written when Kueue judged the worker unreachable: any change
	// of the object makes Kueue try the worker again at once, not at its next retry.
	AgentConnectedAnnotation = "flotilla.dev/agent-connected"

	// AgentFieldManager is the field manager of everything the agent applies on a
	// worker, its own credential Secret included: the name managedFields show.
	AgentFieldManager = "flotilla-agent"
)
