// Package dispatchtest holds what a test or the demo needs to run dispatch with real
// parts on a worker control plane, where no Helm install and no kubelet run:
//
//   - InstallAgentRBAC creates what the agent chart's dispatch.yaml creates (the agent's
//     ServiceAccount, the flotilla-dispatch ServiceAccount bound to exactly
//     agent/proxy's allowlist, and the Role that lets the agent impersonate that one
//     account) and returns a rest.Config that authenticates as the agent's
//     ServiceAccount, so that agent/proxy runs under the chart's RBAC, not as an admin;
//   - StartJob and CompleteJob play the worker's nodes: they write the status a Job's
//     controller writes once its pod runs, and once it succeeded. A test says so where
//     it calls them;
//   - Service plays a Kubernetes Service in front of a hub's replicas, so that a test can
//     move the leadership from one replica to another under the agents and Kueue.
package dispatchtest
