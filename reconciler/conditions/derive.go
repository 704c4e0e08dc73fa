package conditions

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// Derive sets what sums the recorded facts up: observedGeneration, Registered,
// WorkerConfigured's judgement against the current generation and desired state,
// Ready, and DispatchReady.
func Derive(wc *v1alpha1.WorkerCluster) {
	wc.Status.ObservedGeneration = wc.Generation
	if e := wc.Status.Enrollment; e != nil {
		set(wc, v1alpha1.ConditionRegistered, metav1.ConditionTrue, v1alpha1.ReasonEnrolled, "enrolled at "+stamp(e.RedeemedAt.Time))
	} else {
		meta.RemoveStatusCondition(&wc.Status.Conditions, v1alpha1.ConditionRegistered)
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
	ready, reason, msg := readiness(wc)
	set(wc, v1alpha1.ConditionReady, ready, reason, msg)
	// MultiKueue dispatch is not wired up yet: DispatchReady must never claim True.
	set(wc, v1alpha1.ConditionDispatchReady, metav1.ConditionUnknown, v1alpha1.ReasonMultiKueueNotConfigured,
		"the hub does not dispatch to this cluster through MultiKueue yet")
}

// readiness is Ready's value: the first unmet condition, in the order a new cluster
// meets them, decides it.
func readiness(wc *v1alpha1.WorkerCluster) (metav1.ConditionStatus, string, string) {
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
