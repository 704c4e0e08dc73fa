// Package dispatch proves, end to end with real parts, that a job submitted on the hub
// runs on a worker of its pool through the agents' tunnels: three control planes (the
// hub, a worker in the eu residency and one in us), the real Kueue manager on each (the
// hub's with dispatch.HubKueueConfiguration, the workers' with
// dispatch.WorkerKueueConfiguration), the hub in-process (fleet repository on a real git
// server, tunnel, API proxy over TLS from the hub's serving CA, dispatcher, the
// MultiKueueCluster informer that carries Kueue's judgement over) and one agent per
// worker, whose API proxy runs as the worker's agent ServiceAccount under exactly the
// chart's dispatch RBAC.
//
// What the tests prove, as a user sees it:
//   - both clusters turn DispatchReady (Dispatchable) and their commits say so, and the
//     hub's Kueue objects exist with the workers' quotas;
//   - a Job submitted on the hub to the eu pool runs on the eu worker only, and its
//     completion reaches the hub; a us job lands on us only;
//   - a cordon keeps a running job running (same UID on the worker, not evicted) while
//     the next job of the pool waits on the hub instead of going anywhere else;
//   - a tunnel cut and redial within the proxy's resume window keeps a job admitted
//     longer ago than the hub's workerLostTimeout, and DispatchReady returns;
//   - another tenant's job, from its own namespace and LocalQueue naming this tenant's
//     pool ClusterQueue, is held by Kueue on the hub and reaches no worker;
//   - the proxy refuses what MultiKueue does not need (Secrets, ConfigMaps, pods/exec,
//     another worker's path) with the worker's own token, and refuses a wrong or another
//     worker's token without saying why;
//   - removal drains first: a cluster removed from Git while a job placed on it runs
//     takes no new work (DispatchReady Draining, its ClusterQueue held) but keeps its
//     place in the hub's Kueue, the job runs on untouched and the agent keeps its
//     credential well past the hub's StaleAfter; once the job finished, or once
//     fleet.yaml's drainGracePeriod is over for one that never does, the
//     MultiKueueCluster goes, the agent prunes what it applied and is revoked, and the
//     commit says decommissioned.
//
// TestMain starts the three planes once for the package. TestDispatchThroughTheTunnel
// starts the rest once (newWorld) and runs its subtests in order on it, each leaving
// both clusters dispatchable. TestRemovalDrainsFirst, which removes both clusters, and
// BenchmarkDispatch each start a world of their own after it, with another tenant and
// workload namespace, so that all may run in one process. The Kueue
// managers belong to a world rather than to TestMain, because controlplane.Main runs
// the tests itself and a world's managers are stopped, with their webhooks, before its
// planes' objects are cleaned up.
//
// No kubelet runs here: the tests play the worker's nodes by writing the worker Job's
// status (test/dispatchtest) and say so where they do.
//
// The benchmarks measure submit-on-hub to Job-created-on-worker latency and the API
// proxy's overhead against the worker's API server, side by side.
package dispatch
