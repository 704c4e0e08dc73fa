// Package components proves, end to end with real parts, that a worker gets the fleet's
// Kueue and JobSet from its agent and keeps its work through an upgrade: control planes
// for the hub and for workers that start without Kueue or JobSet (no CRDs), the hub's
// tunnel in-process writing the WorkerCluster's status, the agent in-process with its
// installer, the real flotilla-components binary (Helm v4 and the embedded charts), and
// the real Kueue and JobSet managers.
//
// No kubelet runs on a test plane. test/componenttest plays it: it runs the manager built
// from each component's Go module as the process behind the chart's Deployment, as the
// Deployment's pod template says (arguments, the configuration the chart rendered, the
// chart's ServiceAccount), and re-points the charts' webhooks at it after every install or
// upgrade. Its image hook stands in for a registry, which lets a test hold a component
// back. dispatchtest.StartJob plays the nodes of a running Job.
//
// What the tests prove, as a user sees it:
//   - a fresh worker gets JobSet and Kueue through Helm with the release images, and its
//     cluster turns green only once Kueue answers and reports the worker's ClusterQueue
//     Active; until then WorkerConfigured says which component and version it waits for;
//   - an upgrade in place (a registry mirror and a locally bumped chart version) holds the
//     worker's ClusterQueue while the new Kueue is not ready, and a running Job, a JobSet
//     and their Workloads keep their UIDs, admission and status, as do the CRDs;
//   - a Kueue installed by hand is refused, changing nothing, until the cluster declares
//     adoption; then it is taken over in place, its CRDs and Deployment keeping their UIDs;
//   - `flotilla-agent reset --dry-run --components` lists exactly what `reset` then
//     removes, and neither touches the customer's jobs nor the CRDs.
package components
