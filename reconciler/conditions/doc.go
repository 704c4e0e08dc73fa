// Package conditions owns a WorkerCluster's status: it is the only code that writes it.
//
// The tunnel and the hub's reconciler learn facts about a worker cluster (its token was
// redeemed, its agent connected or went away, it applied a desired state, it reported
// its GPUs, the hub rendered a new desired state) and hand them to a [Writer] as
// [Fact] values. The Writer records each fact on the status it concerns and derives from
// the facts and the spec everything that sums them up: Registered, the outdatedness of
// WorkerConfigured, Ready, DispatchReady and observedGeneration ([Derive]). The commit
// status that people see on the cluster's source commit is derived from the same
// status ([CommitStatus]).
//
// Keeping the derivation in one place means a status never depends on which of two
// writers came last, and every rule can be tested table by table without a control
// plane. Condition types and reasons are declared with the API types, in
// reconciler/api/v1alpha1.
package conditions
