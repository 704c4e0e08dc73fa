// Package converge brings a worker's Kueue and JobSet to what the hub's desired state
// names before the state's objects are applied, and judges them ready by what they
// answer, not by their Deployments.
//
// A change of components goes: hold the worker's ClusterQueues (stopPolicy Hold, so no
// new work is admitted while Kueue is replaced, and running work carries on); run the
// installer, a separate short-lived binary that links Helm (see package components);
// wait until each component's webhooks answer; apply the desired objects as they are,
// which releases the hold; wait until Kueue reports every ClusterQueue of the state
// Active. Until then the report names the component, its version and what it waits for,
// and the worker's ClusterQueues stay held. A worker whose team runs Kueue itself
// (Spec.Managed false) is left as today, and the running versions are compared with the
// fleet's.
//
// Before any of that, the images the state names are checked against the worker's
// components.ImagePolicy (Options.Images, from the agent's Helm values). A state outside
// it changes nothing: no hold, no installer, none of its objects applied; every component
// is reported refused with the policy's reason and a message naming the registry or
// digest and the value that allows it. The installer checks again (package installer).
package converge
