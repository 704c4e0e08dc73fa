// Package installer installs, upgrades and uninstalls the components flotilla runs on a
// worker, JobSet and Kueue, with the Helm SDK from the charts embedded in this build
// (package charts). It links Helm, which costs more resident memory than the agent's
// whole budget, so only the short-lived flotilla-components binary uses it; the agent
// runs that binary while components change (package components).
//
// # Releases
//
// Each component is the Helm release components.ReleaseName in components.Namespace
// (kueue-system/kueue, jobset-system/jobset), the names the charts' own documentation
// uses, created with its namespace when missing. A release flotilla made carries the
// release label app.kubernetes.io/managed-by=flotilla (ReleaseLabel) on Helm's records.
// Images are the release images, registry.k8s.io or the fleet's mirror, pulled
// IfNotPresent, optionally pinned by digest (the charts have no digest value: the tag
// becomes v0.17.0@sha256:...). Kueue's configuration is the chart's default with
// integrations.frameworks set to the hub's. Nothing waits for readiness: the agent
// judges it by the components' own answers. Objects are server-side applied, forcing
// conflicts on the fields the chart sets; Helm keeps five revisions.
//
// # Images the worker allows
//
// Before it reads or writes anything, Apply checks the images spec names against
// Installer.Images, the worker's components.ImagePolicy, which the agent hands over in
// its request: a spec outside it installs nothing, and every component is reported
// refused with the policy's reason. The agent checked the same policy with the same
// function before it ran the installer; the check is made again here because this is
// where the image references are written into the charts' values and the rights to run
// them are used, so that the rule holds for every way of running an install (a path of
// the agent's that skipped its check, the binary run by hand) and not only for the one
// the agent's converger takes. It does not defend against a compromised agent, which
// writes the request: that is the admission policy's job, which the agent's chart
// renders from the same values.
//
// A deployed release of flotilla's at the same chart version with the same values is
// left alone (unchanged): no new revision. Anything else is an upgrade; a failed release
// is upgraded too.
//
// # CRDs, never deleted
//
// JobSet keeps its CRD in the chart's crds/, which Helm installs once and never
// upgrades: the installer server-side applies crds/ itself (field manager
// flotilla-components, forcing conflicts) before every install or upgrade, and installs
// the release without them. Kueue keeps its CRDs in templates/, so Helm upgrades them
// with the release; a post-renderer gives each helm.sh/resource-policy: keep, so that an
// uninstall leaves them and every ClusterQueue, Workload and LocalQueue with them.
// Every CRD the installer writes carries InstalledByAnnotation, which is how a later run
// knows the CRDs an uninstall left behind are its own.
//
// # Brownfield
//
// Without a release of flotilla's, a run first looks for what the chart would create:
// a server-side dry run renders it, and every object of it and of its crds/ is read. If
// any exists that the installer did not mark, or a Helm release of someone else's holds
// flotilla's release name, the component is refused: nothing on the worker changes, and
// the message says what was found (installed without Helm, or by which Helm release; the
// key CRD and the controller's Deployment with their creation times) and how to hand it
// over (spec.components.adopt: true in cluster.yaml) or keep it
// (spec.components.managed: false). With adoption declared, the install (or the upgrade of
// the release under flotilla's name) runs once with Helm's TakeOwnership: the objects are
// updated in place, their UIDs kept, and from then on the release is flotilla's and later
// runs are ordinary ones. Objects of a Helm release under another name or in another
// namespace are refused even then: that release keeps its own controller running, and
// taking over the CRDs would put a second one beside it.
//
// # Interrupted runs
//
// A run killed half-way leaves its revision pending-install, pending-upgrade or
// uninstalling, and Helm refuses to upgrade a pending release for ever. A run that finds
// one younger than five minutes fails that component (another run may still be at work;
// a run takes seconds); an older one is marked failed in Helm's records and upgraded
// like any failed release, deleting nothing.
//
// # Order and failures
//
// JobSet goes first, so that the kinds Kueue's integrations watch exist when Kueue
// starts. A component that fails stops the ones after it (Kueue is then not touched and
// keeps running as it is): a JobSet that failed half-way may have left its CRDs behind
// the version Kueue expects. A refused JobSet does not stop Kueue: it is a running
// JobSet, CRDs included. A failure is reported in the component's Status; Apply returns
// an error only when no run could be made, such as an API server that does not answer.
//
// # Uninstall
//
// Uninstall removes the releases flotilla made and nothing else: never a CRD, never a
// release without flotilla's label, never an object the release no longer owns. Its
// report lists what it removes; a dry run lists the same and removes nothing. The
// namespaces stay.
package installer
