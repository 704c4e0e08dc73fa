// Package dispatch keeps the hub's Kueue objects of each tenant from Git, so that
// Kueue's MultiKueue on the hub dispatches jobs to the tenant's workers through their
// tunnels:
//
//   - per registered worker, a kubeconfig Secret in Kueue's namespace (the hub's API
//     proxy as server, the proxy's CA inline, a bearer token for this worker alone) and
//     a MultiKueueCluster named after the worker's identity;
//   - per dispatch pool (fleet.PoolOf), a MultiKueueConfig of its members, a MultiKueue
//     AdmissionCheck, a ResourceFlavor and a ClusterQueue whose quota is the sum of its
//     dispatchable members' quotas, all named <tenant>-<pool>;
//   - per workload namespace, the namespace on the hub, labelled with its tenant, and a
//     LocalQueue named after each pool.
//
// Tenants stay apart: cluster-scoped objects carry tenant-qualified names, each
// tenant's ClusterQueues admit only from namespaces labelled with the tenant, and a
// namespace that another tenant (or nobody) owns on the hub gets no LocalQueue of this
// one. Everything is applied with the agent's applier (agent/apply) under the tenant's
// ownership label: an object the tenant does not own is refused, never adopted, and
// what Git no longer asks for is pruned.
//
// A pool holds at most v1alpha1.MaxPoolClusters clusters (Kueue's limit): the members
// are the ones registered first, so a cluster never moves out of its pool for a newer
// one. A cordoned cluster stays a member (taking it out would make Kueue requeue its
// running work); its ClusterQueue on the worker holds instead (reconciler/render).
//
// What dispatch learns, the placement of each cluster and Kueue's judgement of its
// MultiKueueCluster, it records as facts (reconciler/conditions), which derive
// DispatchReady. Kueue retries a worker it cannot reach after a wait that doubles up to
// minutes; when the worker's agent comes back, Redial has Kueue try at once.
package dispatch
