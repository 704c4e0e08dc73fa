// Package dispatch keeps the hub's Kueue objects of each tenant from Git, so that
// Kueue's MultiKueue on the hub dispatches jobs to the tenant's workers through their
// tunnels:
//
//   - per registered worker, a kubeconfig Secret in Kueue's namespace (the hub's API
//     proxy as server, the proxy's CA inline, a bearer token for this worker alone) and
//     a MultiKueueCluster named after the worker's identity;
//   - per dispatch pool (fleet.PoolOf), a MultiKueueConfig of its members, a MultiKueue
//     AdmissionCheck, a ResourceFlavor and a ClusterQueue whose quota is the sum of its
//     dispatchable members' quotas (names: PoolNamesOf);
//   - per workload namespace that fleet.yaml names and the hub's configuration gives
//     the tenant (Tenant.HubNamespaces), the namespace on the hub, labelled with its
//     tenant, and a LocalQueue named after each pool, which users submit to.
//
// Tenants stay apart, whatever order they sync in:
//
//   - A pool's ClusterQueue, ResourceFlavor and AdmissionCheck are named
//     <tenant>.<pool> and its MultiKueueConfig <len(tenant)>-<tenant>-<pool>: tenants
//     and pools are DNS labels, so no two tenants' pools share a name. Hubs before
//     named all four <tenant>-<pool>, which tenant "acme" with pool "us-eu" shares
//     with tenant "acme-us" with pool "eu". A pool whose ClusterQueue the tenant holds
//     under that name keeps it: a workload's admission records the names of its
//     ClusterQueue, flavor and admission check, and a LocalQueue's ClusterQueue cannot
//     change, so renaming would requeue its work.
//   - A pool any of whose names something else holds on the hub (another tenant's
//     object, one of no tenant, or a pool of old names that takes the MultiKueueConfig's
//     name) is refused: what holds the names is left alone, the pool's ClusterQueue
//     holds (nothing new is admitted, admitted work runs on) and Sync's Report says
//     which object is whose. It is judged by what the hub holds, never by which tenant
//     synced first; the tenant's other pools are unaffected.
//   - Each tenant's ClusterQueues admit only from namespaces labelled with the tenant,
//     and a tenant queues only in the namespaces the hub's configuration gives it,
//     which no two tenants share: a namespace that exists on the hub as another's, or
//     nobody's, gets no LocalQueue of the tenant until an operator labels it so.
//
// Everything is applied with the agent's applier (agent/apply) under the tenant's
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
