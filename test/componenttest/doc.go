// Package componenttest plays the kubelet, and the deployment controller above it, for the
// Kueue and JobSet Helm charts that the agent installs on a worker control plane from
// test/controlplane. Such a plane is a real kube-apiserver and etcd and nothing else: no
// kubelet runs a pod and no Service reaches one, so without this package the charts'
// Deployments would never run their managers and their webhook configurations would name
// Services that nobody serves. The package runs the real managers as processes on this
// machine in their place:
//
//	k, err := componenttest.Start(ctx, plane, componenttest.Options{})
//	...
//	defer k.Stop()
//	// install the charts (Helm), then:
//	p, err := k.WaitRunning(ctx, componenttest.Kueue)
//
// # What plays the pod
//
// A Kubelet watches the plane for the charts' controller Deployments (Options.Deployments;
// by default kueue-system/kueue-controller-manager and jobset-system/jobset-controller, the
// names the charts render for releases kueue and jobset). When one appears or its pod template
// changes (a Helm upgrade: the configuration checksum, the image, the arguments), it rolls the
// new template out as the deployment controller would: with the RollingUpdate strategy the new
// manager starts beside the old one and the old one stops once the new one is ready (the charts
// keep leader election on, so the two take turns); with Recreate the old one stops first. A
// Deployment scaled to zero or deleted stops its manager. A manager that exits on its own is
// restarted with a back-off, as a container with restartPolicy Always is, and so is one that
// fails to start.
//
// The process is the real manager at the version go.mod requires, whatever image the pod
// template names (the image is recorded and reported; Options.Pull may refuse one, as a
// registry would): Kueue built by test/testbin/kueue.sh and run through test/kueuetest, JobSet
// built by test/testbin/jobset.sh (FLOTILLA_JOBSET). It gets what the container gets:
//   - its arguments, except the flags that name files or ports, which the harness sets;
//   - the configuration file that --config names, read from the ConfigMap that the pod
//     template mounts at that path (the chart's rendered configuration, as the kubelet would
//     mount it), with only what a process on this machine must change overridden: its servers
//     on free ports of 127.0.0.1, its webhook certificate from the harness, internal
//     certificate management off (it would write a Secret and patch configurations for a
//     Service), and the leader-election lease in the Deployment's namespace, which a pod reads
//     from its service account;
//   - the identity of the ServiceAccount the pod template names, through a bound token, so the
//     chart's own RBAC is what the manager is allowed.
//
// # Webhooks
//
// After every install, upgrade and rollout, every webhook whose clientConfig names a Service in
// a component's namespace (or points at an earlier manager of it) is re-pointed at the running
// manager's loopback URL with the CA of its serving certificate: the rewrite controller-runtime's
// envtest.WebhookInstallOptions makes. Helm writes the Service back on every upgrade, and the
// Kubelet, watching the configurations, re-points them again.
//
// The rewrite is applied with server-side apply as the field manager that applied the
// clientConfig (Helm), so that Helm's next apply of its manifest removes the URL and CA bundle
// again and restores the Service reference. A rewrite under a manager of its own would leave the
// URL behind when Helm's apply brings the Service back, and the API server refuses a clientConfig
// with both. Configurations that were not applied server-side are updated in place.
//
// # Status
//
// The Deployment's status is written as the deployment controller would from the process's
// readiness: observedGeneration, replicas, updatedReplicas, readyReplicas, availableReplicas and
// the Available and Progressing conditions, so that kubectl-style readiness reads true once the
// manager is ready for the current generation and false while a rollout or a restart is under
// way. One process plays the Deployment whatever spec.replicas says (above zero).
//
// # What tests get
//
// Kubelet.WaitRunning returns, once the manager runs the Deployment's current pod template, its
// webhooks are re-pointed and the API server calls them (a dry-run ClusterQueue comes back with
// Kueue's finalizer, a dry-run JobSet with JobSet's defaults), a Process: pid, pod-template hash,
// generation, image, arguments, the configuration as the chart rendered it, restarts and
// rollouts. Kubelet.Stop stops every manager and leaves no process; the charts' webhook
// configurations then name managers that are gone, as in a cluster whose controllers are down,
// until the releases are uninstalled.
//
// # Lifetime
//
// Every manager runs with the parent-death signal set to SIGKILL (see test/kueuetest), so none
// outlives the test process, and keeps its files in the plane's directory.
package componenttest
