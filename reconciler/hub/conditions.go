package hub

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
)

// Reasons the hub sets on conditions.
const (
	ReasonReady                   = "Ready"
	ReasonMultiKueueNotConfigured = "MultiKueueNotConfigured"
	ReasonAwaitingEnrollment      = "AwaitingEnrollment"
	ReasonAwaitingConnection      = "AwaitingConnection"
	ReasonAwaitingApply           = "AwaitingApply"
)

// summarize sets Ready and DispatchReady from the conditions the tunnel keeps, and
// reports whether anything changed.
func summarize(wc *v1alpha1.WorkerCluster) bool {
	before := fmt.Sprint(wc.Status.ObservedGeneration, wc.Status.Conditions)
	wc.Status.ObservedGeneration = wc.Generation
	// An agent's report is about the generation it was sent: once Git moves the spec on,
	// the worker is configured only when it acknowledges the new one.
	if c := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionWorkerConfigured); c != nil && c.Status == metav1.ConditionTrue {
		switch {
		case c.ObservedGeneration != wc.Generation:
			set(wc, v1alpha1.ConditionWorkerConfigured, metav1.ConditionFalse, tunnel.ReasonOutdated,
				fmt.Sprintf("waiting for the agent to apply generation %d; it last applied generation %d", wc.Generation, c.ObservedGeneration))
		case wc.Status.DesiredHash != "" && wc.Status.AppliedHash != wc.Status.DesiredHash:
			set(wc, v1alpha1.ConditionWorkerConfigured, metav1.ConditionFalse, tunnel.ReasonOutdated,
				fmt.Sprintf("waiting for the agent to apply %s; it last applied %s", wc.Status.DesiredHash, wc.Status.AppliedHash))
		}
	}
	ready, reason, msg := readiness(wc)
	set(wc, v1alpha1.ConditionReady, ready, reason, msg)
	// MultiKueue dispatch is not wired up yet: DispatchReady must never claim True.
	set(wc, v1alpha1.ConditionDispatchReady, metav1.ConditionUnknown, ReasonMultiKueueNotConfigured,
		"the hub does not dispatch to this cluster through MultiKueue yet")
	return fmt.Sprint(wc.Status.ObservedGeneration, wc.Status.Conditions) != before
}

// readiness is Ready's value: the first unmet condition, in the order a new cluster
// meets them, decides it.
func readiness(wc *v1alpha1.WorkerCluster) (metav1.ConditionStatus, string, string) {
	steps := []struct {
		typ, reason, missing string
	}{
		{v1alpha1.ConditionRegistered, ReasonAwaitingEnrollment, "waiting for the agent to redeem its enrollment token: install the agent with the cluster's values file"},
		{v1alpha1.ConditionConnected, ReasonAwaitingConnection, "waiting for the agent to connect"},
		{v1alpha1.ConditionWorkerConfigured, ReasonAwaitingApply, "waiting for the agent to apply the desired state"},
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
	// summarize has turned WorkerConfigured False for an outdated hash or generation.
	return metav1.ConditionTrue, ReasonReady, "ready · " + gpuSummary(wc)
}

func set(wc *v1alpha1.WorkerCluster, typ string, s metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&wc.Status.Conditions, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: wc.Generation})
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

// commitStatus is what the cluster's context says: success when ready, failure when the
// worker refused or failed the desired state, pending otherwise.
func commitStatus(context string, wc *v1alpha1.WorkerCluster) commitstatus.Status {
	st := commitstatus.Status{Context: context}
	ready := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionReady)
	configured := meta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionWorkerConfigured)
	switch {
	case ready != nil && ready.Status == metav1.ConditionTrue:
		st.State, st.Description = commitstatus.Success, ready.Message
	case configured != nil && configured.Status == metav1.ConditionFalse && configured.Reason != tunnel.ReasonOutdated:
		st.State, st.Description = commitstatus.Failure, configured.Message
	case ready != nil:
		st.State, st.Description = commitstatus.Pending, ready.Message
	default:
		st.State, st.Description = commitstatus.Pending, "waiting for the hub"
	}
	return st
}
