// Package podrunner plays the kubelet, the deployment controller and kube-proxy for
// flotilla's own Deployments (the hub's and the agent's charts) on a control plane of
// test/controlplane, where no kubelet runs a pod and no Service reaches one. It runs the
// binaries built from this repository in place of the charts' images, each as the pod
// template says, so that a test installs the charts as a user does and the processes act
// with exactly what the charts give them:
//
//	r, err := podrunner.Start(ctx, plane, podrunner.Options{
//		Deployments: []types.NamespacedName{{Namespace: "flotilla-system", Name: "flotilla-hub"}},
//		Images:      map[string]string{"registry.example/flotilla-hub": hubBinary},
//	})
//	...
//	defer r.Stop()
//	addr, err := r.ServiceAddr("flotilla-system", "flotilla-hub-tunnel", 443) // the tunnel's "load balancer"
//
// # Pods
//
// For every replica of a played Deployment the Runner creates a Pod object from the pod
// template (its labels, annotations and spec, bound to a node of the Runner's name), so that
// what a process does to its own Pod (the hub's leader labels it) and what selects Pods (the
// Services) works as in a cluster. It then starts the binary that Options.Images names for
// the container's image repository (any tag: a registry would have served that image) and
// reports the Pod Running and, once the readiness probe passes, Ready. A Pod deleted through
// the API (kubectl delete pod, a drain) has its process stopped with SIGTERM, then SIGKILL
// after the grace period, and is replaced; a process that exits on its own is restarted with
// a back-off, as with restartPolicy Always. A changed pod template rolls out as the
// Deployment's strategy says: RollingUpdate starts the new Pods and stops the old ones once
// the new are ready, Recreate stops the old ones first. The Deployment's status is written
// as the deployment controller would, which kubectl rollout status reads.
//
// # What a container gets
//
// There are no mount namespaces here: a process sees the host's file system. So each volume
// of the Pod (ConfigMap, Secret, projected sources with ServiceAccount tokens from the
// TokenRequest API bound to the Pod, downward API, emptyDir) is written into a directory of
// its own, and every mount path in the container's arguments, environment and the
// configuration files its arguments name is rewritten to that directory. Likewise there is
// one network namespace: every container port gets a free port on 127.0.0.1, and a listen
// address for a container port in those places (":8443", "0.0.0.0:8443") is rewritten to it.
// And there is no cluster DNS: a URL that names a Service by its cluster name
// (https://NAME.NAMESPACE.svc:PORT) is rewritten to that Service's loopback address (see
// below). Nothing else of the chart's configuration changes, and the rewrite is logged.
//
// The process authenticates as the Pod's ServiceAccount, with a token bound to the Pod, through
// a kubeconfig named by KUBECONFIG (which client-go and controller-runtime read when no
// in-cluster environment is there), so it is allowed exactly what the chart's RBAC grants; a
// missing rule fails the test rather than a user's first install. Its environment is the
// container's (values, the downward API's fields, ConfigMap and Secret keys, $(VAR)
// references in the arguments) with PATH, HOME and TMPDIR, and nothing of the test's.
//
// Not played: the security context (the process runs as the test's user), resource limits,
// liveness and startup probes, init and sidecar containers.
//
// # Services
//
// ServiceAddr returns a loopback address that plays one port of a Service: each connection is
// forwarded to a ready played Pod that the Service's selector matches at that moment (in turn,
// when several do), to the container port the targetPort names, as kube-proxy does; with no
// such Pod the connection is closed. Which Pods match is read from the API at each connection,
// so the hub's leader label decides where an agent's tunnel lands, and a new leader is reached
// as soon as it has labelled itself. A LoadBalancer Service with a played port gets 127.0.0.1
// as its load balancer's address, as a cloud's controller writes the one it provisioned.
//
// # Lifetime
//
// Every process runs with the parent-death signal set to SIGKILL, so none outlives the test
// process, and keeps its files in the plane's directory. Stop stops them all and deletes their
// Pods.
package podrunner
