// Package conditions owns a WorkerCluster's status: it is the only code that writes it.
//
// The tunnel and the hub's reconciler learn facts about a worker cluster (its token was
// redeemed, its agent connected or went away, it applied a desired state, it reported
// its GPUs, the hub rendered a new desired state, the agent's credential was issued,
// rotated or sent for rotation) and hand them to a [Writer] as [Fact] values. The Writer
// records each fact on the status it concerns and derives from the facts, the spec and
// the time everything that sums them up: Registered, CredentialCurrent, the
// outdatedness of WorkerConfigured, Ready, DispatchReady and observedGeneration
// ([Derive]). The commit status that people see on the cluster's source commit is
// derived from the same status ([CommitStatus]).
//
// CredentialCurrent is the one judgement that changes with time alone: True while the
// agent's credential is outside the last third of its lifetime, False once it is inside
// it (RotationFailing, or ExpiresSoon for an agent away) or past it (CredentialExpired,
// which also makes Ready False and the commit status fail). Nothing else records a fact
// at those moments, so whoever watches the credential records no fact then, only asks
// the Writer to derive again ([CredentialDue] says when that would change something).
//
// Keeping the derivation in one place means a status never depends on which of two
// writers came last, and every rule can be tested table by table without a control
// plane. Condition types and reasons are declared with the API types, in
// reconciler/api/v1alpha1.
package conditions
