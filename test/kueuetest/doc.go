// Package kueuetest runs the real Kueue manager (sigs.k8s.io/kueue/cmd/kueue, at the version
// go.mod requires) as a process against a test control plane from test/controlplane, so that
// tests see what a cluster running Kueue does: admission, its webhooks' defaulting and
// refusals, and MultiKueue between a hub plane and worker planes.
//
//	m, err := kueuetest.Start(ctx, planes[0], kueuetest.Options{Config: hubConfig})
//	...
//	defer m.Stop()
//
// # The binary
//
// The manager is built by test/testbin/kueue.sh in a module of its own (Kueue's controllers need
// their own k8s.io versions) and cached beside kube-apiserver. Start takes the directory from
// FLOTILLA_KUEUE (which `make testbin` exports) or, when it is unset, runs the script, which
// builds nothing once the binary is cached; so `go test` works from a fresh clone too.
//
// # Configuration
//
// Options.Config is Kueue's own Configuration type (config.kueue.x-k8s.io/v1beta2), nil meaning
// Kueue's defaults. Start keeps what the caller set (integrations, MultiKueue, feature gates)
// and owns what a process on a shared machine must get right:
//   - namespace kueue-system unless the caller names another; Start creates it;
//   - health and webhook servers on free ports of 127.0.0.1, and no metrics server;
//   - leader election off, internal certificate management off;
//   - the VisibilityOnDemand gate off unless the caller sets it (its server would take port
//     8082 on every interface); when on, it gets a free loopback port too.
//
// Options.Args passes further command-line arguments, as a chart's Deployment gives its container
// (log level, feature gates); Start keeps --config, --kubeconfig and --visibility-server-port to
// itself. Options.LeaderElection keeps the configuration's leader election, with the lease in the
// manager's namespace, so that managers overlapping on one plane take turns as the pods of a
// rolling update do. Options.KubeConfig runs the manager under another identity than the plane's
// admin, e.g. the ServiceAccount a chart made for it.
//
// # Webhooks
//
// Kueue's webhook configurations come from its module's config/components/webhook
// (manifests.yaml and the patches of its kustomization, built with kustomize), named as a real
// install names them (kueue-mutating-webhook-configuration, kueue-validating-webhook-
// configuration). controller-runtime's envtest.WebhookInstallOptions re-points each at the
// manager's loopback URL with a CA generated for this manager, and installs them. Only the
// webhooks of Kueue's own kinds and of the integrations the manager enables (after Kueue's
// defaulting, with the integrations they imply) are installed: for any other kind Kueue serves
// a no-op webhook, and installing it would only make objects of that kind depend on the
// manager's process. The webhooks are installed once the manager reports ready and Start
// returns only after the API server calls them (a dry-run ClusterQueue comes back defaulted and
// a dry-run ResourceFlavor with an invalid node label is refused). They are removed before the
// manager stops, and also when it exits on its own, so a plane never refuses objects for a
// webhook that nobody serves. One plane holds at most one such manager at a time.
//
// With Options.Webhooks set to WebhooksExternal, Start installs no webhook configuration and
// returns once the manager reports ready: the caller points configurations that exist already,
// such as those Kueue's Helm chart installs naming a Service, at Manager.WebhookAddr with
// Manager.CABundle (test/componenttest does, for the charts the agent installs).
//
// # The metrics certificate
//
// With internal certificate management off, Kueue v0.17 reads its metrics serving certificate
// from the fixed path /etc/kueue/metrics/certs/tls.{crt,key} and exits when it is missing,
// whatever metrics.bindAddress says (cmd/kueue/main.go creates the certificate watcher before
// and apart from the metrics server). Start therefore writes a self-signed certificate for
// 127.0.0.1 there when no valid pair is present, atomically, so that test processes running at
// once agree on one pair; this needs write access to /etc, which CI has (it runs as root). The
// file is left in place: with the metrics server off nothing serves it, and later runs reuse it.
//
// # Lifetime
//
// The manager runs with the parent-death signal set to SIGKILL, from an OS thread that lives
// exactly as long as the process (the kernel sends the signal when the forking thread ends), so
// it cannot outlive the test process however that ends. Its files (configuration, kubeconfig,
// webhook certificates) live in the plane's directory, which controlplane.Main removes also
// when the test process dies. Stop removes the webhooks, ends the process (SIGTERM, then SIGKILL
// after a grace period) and removes its files.
package kueuetest
