package conditions

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// Derive sets what sums the recorded facts up, as of now: observedGeneration,
// Registered, CredentialCurrent, WorkerConfigured's judgement against the current
// generation and desired state, Ready, and DispatchReady. Only CredentialCurrent depends
// on now; its messages name times, never ages, so that deriving again later changes
// nothing until the credential enters its last third or runs out.
func Derive(wc *v1alpha1.WorkerCluster, now time.Time) {
	wc.Status.ObservedGeneration = wc.Generation
	if e := wc.Status.Enrollment; e != nil {
		set(wc, v1alpha1.ConditionRegistered, metav1.ConditionTrue, v1alpha1.ReasonEnrolled, "enrolled at "+stamp(e.RedeemedAt.Time))
		st, reason, msg := credentialCurrent(wc, now)
		set(wc, v1alpha1.ConditionCredentialCurrent, st, reason, msg)
	} else {
		meta.RemoveStatusCondition(&wc.Status.Conditions, v1alpha1.ConditionRegistered)
		meta.RemoveStatusCondition(&wc.Status.Conditions, v1alpha1.ConditionCredentialCurrent)
	}
	// An agent's report is about the generation it was sent: once Git moves the spec on,
	// the worker is configured only when it acknowledges the new one. A report newer
	// than the WorkerCluster (one re-created under the same name) is judged by its hash.
	if c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionWorkerConfigured); c != nil && c.Status == metav1.ConditionTrue {
		switch {
		case c.ObservedGeneration < wc.Generation:
			set(wc, v1alpha1.ConditionWorkerConfigured, metav1.ConditionFalse, v1alpha1.ReasonOutdated,
				fmt.Sprintf("waiting for the agent to apply generation %d; it last applied generation %d", wc.Generation, c.ObservedGeneration))
		case wc.Status.DesiredHash != "" && wc.Status.AppliedHash != wc.Status.DesiredHash:
			set(wc, v1alpha1.ConditionWorkerConfigured, metav1.ConditionFalse, v1alpha1.ReasonOutdated,
				fmt.Sprintf("waiting for the agent to apply %s; it last applied %s", wc.Status.DesiredHash, wc.Status.AppliedHash))
		}
	}
	st, reason, msg := readiness(wc)
	set(wc, v1alpha1.ConditionReady, st, reason, msg)
	st, reason, msg = dispatchReadiness(wc)
	set(wc, v1alpha1.ConditionDispatchReady, st, reason, msg)
}

// dispatchReadiness is DispatchReady's value: True only when the cluster is connected,
// configured at the current generation, not cordoned, and Kueue judges its
// MultiKueueCluster Active.
func dispatchReadiness(wc *v1alpha1.WorkerCluster) (metav1.ConditionStatus, string, string) {
	d := wc.Status.Dispatch
	if d == nil {
		return metav1.ConditionUnknown, v1alpha1.ReasonMultiKueueNotConfigured, "the hub does not dispatch through MultiKueue: it runs without its API proxy"
	}
	switch d.Placement {
	case v1alpha1.PlacementDisabled:
		return metav1.ConditionFalse, v1alpha1.ReasonDispatchDisabled, "fleet.yaml turns dispatch off (spec.dispatch.enabled: false): the cluster is configured, and no job is dispatched to it"
	case v1alpha1.PlacementPoolFull:
		return metav1.ConditionFalse, v1alpha1.ReasonPoolFull, fmt.Sprintf("dispatch pool %q already holds %d clusters, the most Kueue allows in one pool, registered before this one: declare pools in fleet.yaml (spec.dispatch.pools) so that every cluster has a place", d.Pool, v1alpha1.MaxPoolClusters)
	case v1alpha1.PlacementDraining:
		return metav1.ConditionFalse, v1alpha1.ReasonDraining, "the cluster left the fleet: no new work; waiting for the work placed on it to finish"
	}
	steps := []string{v1alpha1.ConditionConnected, v1alpha1.ConditionWorkerConfigured}
	for _, typ := range steps {
		if c := meta.FindStatusCondition(wc.Status.Conditions, typ); c == nil || c.Status != metav1.ConditionTrue {
			r, m := v1alpha1.ReasonAwaitingConnection, "waiting for the agent to connect"
			if c != nil {
				r, m = c.Reason, c.Message
			} else if typ == v1alpha1.ConditionWorkerConfigured {
				r, m = v1alpha1.ReasonAwaitingApply, "waiting for the agent to apply the desired state"
			}
			return metav1.ConditionFalse, r, m
		}
	}
	if a := wc.Status.Agent; a != nil && a.ProtocolVersion < protocol.ProxyVersion {
		return metav1.ConditionFalse, v1alpha1.ReasonAgentTooOld, fmt.Sprintf("the agent speaks tunnel protocol %d; dispatch needs %d: upgrade the agent", a.ProtocolVersion, protocol.ProxyVersion)
	}
	if wc.Spec.Cordoned {
		if !d.Withdrawn {
			return metav1.ConditionFalse, v1alpha1.ReasonCordoned, "cordoned in Git: waiting for the hub's Kueue to stop counting its quota; running work continues"
		}
		return metav1.ConditionFalse, v1alpha1.ReasonCordoned, "cordoned in Git: no new work is dispatched to it; running work continues"
	}
	switch a := d.Active; {
	case a == nil:
		return metav1.ConditionFalse, v1alpha1.ReasonAwaitingKueue, fmt.Sprintf("waiting for the hub's Kueue to reach the cluster (pool %q)", d.Pool)
	case a.Status != metav1.ConditionTrue:
		return metav1.ConditionFalse, a.Reason, "the hub's Kueue does not reach the cluster: " + a.Message
	}
	return metav1.ConditionTrue, v1alpha1.ReasonDispatchable, fmt.Sprintf("the hub's Kueue dispatches to this cluster (pool %q)", d.Pool)
}

// readiness is Ready's value: the first unmet condition, in the order a new cluster
// meets them, decides it. An expired or revoked credential comes before the connection:
// the agent cannot connect with it, and what the cluster needs is the new enrollment
// token's values file. A revocation is asked for, an expiry is not: the commit status
// fails for the second only (CommitStatus).
func readiness(wc *v1alpha1.WorkerCluster) (metav1.ConditionStatus, string, string) {
	if c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionCredentialCurrent); c != nil && wc.Status.Enrollment != nil &&
		(c.Reason == v1alpha1.ReasonCredentialExpired || c.Reason == v1alpha1.ReasonCredentialRevoked) {
		return metav1.ConditionFalse, c.Reason, c.Message
	}
	steps := []struct {
		typ, reason, missing string
	}{
		{v1alpha1.ConditionRegistered, v1alpha1.ReasonAwaitingEnrollment, "waiting for the agent to redeem its enrollment token: install the agent with the cluster's values file"},
		{v1alpha1.ConditionConnected, v1alpha1.ReasonAwaitingConnection, "waiting for the agent to connect"},
		{v1alpha1.ConditionWorkerConfigured, v1alpha1.ReasonAwaitingApply, "waiting for the agent to apply the desired state"},
	}
	for _, s := range steps {
		c := meta.FindStatusCondition(wc.Status.Conditions, s.typ)
		switch {
		case c == nil:
			return metav1.ConditionFalse, s.reason, s.missing
		case c.Status != metav1.ConditionTrue:
			return metav1.ConditionFalse, c.Reason, c.Message
		}
	}
	return metav1.ConditionTrue, v1alpha1.ReasonReady, "ready · " + gpuSummary(wc)
}

// gpuSummary is "64× H100 80GB on 8 nodes" for people reading a commit status.
func gpuSummary(wc *v1alpha1.WorkerCluster) string {
	if len(wc.Status.GPUs) == 0 {
		return "no GPUs reported"
	}
	var parts []string
	nodes := int32(0)
	for _, g := range wc.Status.GPUs {
		parts = append(parts, fmt.Sprintf("%d× %s", g.Count, productName(g.Product)))
		nodes += g.Nodes
	}
	unit := "nodes"
	if nodes == 1 {
		unit = "node"
	}
	return fmt.Sprintf("%s on %d %s", strings.Join(parts, ", "), nodes, unit)
}

// productName shortens GFD's product label ("NVIDIA-H100-80GB-HBM3") to what people
// call it ("H100 80GB").
func productName(p string) string {
	p = strings.TrimPrefix(p, "NVIDIA-")
	fields := strings.Split(p, "-")
	if len(fields) >= 2 && strings.HasSuffix(fields[1], "GB") {
		return fields[0] + " " + fields[1]
	}
	return strings.Join(fields, " ")
}
