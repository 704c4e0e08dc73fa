// Package apply is how the agent brings its worker cluster to the desired state the hub
// sends: server-side apply of every object, refusal of objects it
// does not own, and pruning of owned objects the hub no longer wants.
//
// # Ownership
//
// The agent owns an object when its flotilla.dev/worker-cluster label is the agent's
// identity. It never writes to or deletes anything else:
//
//   - A desired object must carry flotilla.dev/managed-by=flotilla and
//     flotilla.dev/worker-cluster=<identity>; one that does not is the hub's bug and is
//     reported failed, not applied.
//   - Before applying, the live object is read. One that exists without this identity's
//     label, unlabeled or labeled for another WorkerCluster, is refused and left exactly
//     as it is: a brownfield ClusterQueue keeps admitting and running workloads. An
//     operator hands it over by labeling it flotilla.dev/worker-cluster=<identity>; the
//     next Apply then adopts it in place, with the same UID.
//   - Pruning lists objects by the label selector managed-by=flotilla,
//     worker-cluster=<identity> only, and deletes with the UID and resourceVersion of
//     what it listed as preconditions, so that an object relabeled in between is not
//     deleted either.
//
// Between reading a missing object and creating it, someone else could create it; the
// agent's apply would then take it over. The window is one round trip and the object
// would have to be created under the very name the hub renders, so it is accepted rather
// than paid for with create-only requests, which would leave fields owned by an Update
// manager that later applies could not remove.
//
// # Apply
//
// Objects are applied one by one in dependency order, what others refer to first:
// Namespace, PriorityClass, ResourceFlavor, Topology, WorkloadPriorityClass,
// ProvisioningRequestConfig, AdmissionCheck, Cohort, ClusterQueue, LocalQueue, then any
// other kind in the order the hub sent. This is the order the renderer already emits;
// the sort is stable, so the hub's order within a kind is kept.
//
// Each object is applied with one server-side apply request. The API server does not
// write an apply that changes nothing, so applying the same state twice writes nothing,
// and an unchanged resourceVersion reports the object unchanged. Field-manager conflicts
// are always forced: the agent owns the fields it renders, and a hand edit of one is
// reverted. An object whose apply fails is never deleted and recreated: recreating
// changes the UID, and deleting a ClusterQueue or LocalQueue because of a change the API
// server rejected would stop or orphan running workloads. Such a change is reported
// failed with the API server's message instead; an immutable field, such as a
// LocalQueue's spec.clusterQueue, is changed by renaming the object in the fleet, which
// creates the new one and prunes the old.
//
// The agent does not use fluxcd/pkg/ssa, which does the same with a dry run first: its
// dependencies link kubectl, whose package initialisation alone holds about 30 MiB
// resident in a process that otherwise needs about 30 MiB, for as long as the agent runs.
//
// Objects annotated flotilla.dev/apply: IfNotPresent (workload namespaces) are created
// when missing and otherwise skipped, whoever owns them: they are never written to once
// they exist, so there is nothing to refuse.
//
// An error on one object fails that object only; the others are still applied. The
// report lists the first 100 objects that failed or were refused, each of their texts
// clipped to 1 KiB, and Applied.Error says how many there were: however many objects
// of a desired state are broken, and however long what they say, what the report says
// of them stays within a control message (protocol.MaxMessageSize), and the log holds no
// more than it. The objects applied and pruned are each listed, as a decommission's
// report must name every object it removed.
//
// # Prune
//
// After applying, the agent lists, for every kind of the desired state and every kind
// of PruneKinds that the API server serves, the objects this identity owns, and deletes
// those the desired state does not name, in reverse dependency order. Namespaces are
// never listed, so never deleted; objects annotated flotilla.dev/prune: disabled are kept
// and reported skipped. A kind whose CRD is not installed is not an error. When an object
// of the desired state cannot be decoded, what it names is unknown, so nothing is pruned
// that time. A decommission prunes everything owned, with the same exceptions, and
// applies nothing.
//
// RBAC.md beside this file lists the permissions this needs.
package apply
