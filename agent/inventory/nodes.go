// Package inventory tells the hub which GPUs a worker cluster has: it reads the cluster's
// Nodes (the nvidia.com/gpu extended resource and the labels of NVIDIA GPU Feature
// Discovery) and, optionally, a DCGM exporter's metrics for the GPUs' health, and turns
// both into the agent protocol's Inventory.
package inventory

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
)

// ResourceGPU is the extended resource the NVIDIA device plugin advertises whole GPUs (or,
// under the MIG "single" strategy, MIG devices) as.
const ResourceGPU corev1.ResourceName = "nvidia.com/gpu"

// UnknownProduct is the product a GPU node without an nvidia.com/gpu.product label is
// counted under in the totals.
const UnknownProduct = "unknown"

// Labels written by GPU Feature Discovery, as its documentation lists them ("Generated
// Labels" in the k8s-device-plugin repository's docs/gpu-feature-discovery/README.md).
const (
	LabelProduct     = "nvidia.com/gpu.product"
	LabelMemory      = "nvidia.com/gpu.memory" // per GPU (per MIG device under "single"), MiB
	LabelCount       = "nvidia.com/gpu.count"
	LabelMIGStrategy = "nvidia.com/mig.strategy"

	// The driver's version. GFD writes both sets; the cuda.driver.* ones are documented as
	// deprecated, and revision is empty for a driver versioned X.Y.
	LabelDriverVersionFull     = "nvidia.com/cuda.driver-version.full"
	LabelDriverVersionMajor    = "nvidia.com/cuda.driver-version.major"
	LabelDriverVersionMinor    = "nvidia.com/cuda.driver-version.minor"
	LabelDriverVersionRevision = "nvidia.com/cuda.driver-version.revision"
	LabelDriverMajor           = "nvidia.com/cuda.driver.major"
	LabelDriverMinor           = "nvidia.com/cuda.driver.minor"
	LabelDriverRev             = "nvidia.com/cuda.driver.rev"

	// The CUDA version the driver supports; cuda.runtime.* are the deprecated names.
	LabelRuntimeVersionFull  = "nvidia.com/cuda.runtime-version.full"
	LabelRuntimeVersionMajor = "nvidia.com/cuda.runtime-version.major"
	LabelRuntimeVersionMinor = "nvidia.com/cuda.runtime-version.minor"
	LabelRuntimeMajor        = "nvidia.com/cuda.runtime.major"
	LabelRuntimeMinor        = "nvidia.com/cuda.runtime.minor"
)

// FromNodes is the inventory of the given nodes, without health. It does not change nodes.
//
// A node is in the inventory when it has nvidia.com/gpu capacity or allocatable above zero,
// or any GFD label; others are left out. Nodes are sorted by name, totals by product.
//
// Allocatable is status.allocatable of nvidia.com/gpu. When the node has no allocatable at
// all, capacity is used, as the API server's defaulting of NodeStatus does; a node whose
// allocatable merely lacks nvidia.com/gpu has none allocatable, as the scheduler sees it.
//
// Totals count the allocatable GPUs, and the nodes, of each product over the nodes that are
// Ready and schedulable; a node without a product label counts under UnknownProduct. The
// other GPU nodes count in UnavailableNodes only.
func FromNodes(nodes []corev1.Node) protocol.Inventory {
	inv := protocol.Inventory{Nodes: []protocol.NodeGPUs{}, Totals: []protocol.ProductTotal{}}
	totals := map[string]*protocol.ProductTotal{}
	for i := range nodes {
		n, ok := nodeGPUs(&nodes[i])
		if !ok {
			continue
		}
		inv.Nodes = append(inv.Nodes, n)
		if !n.Ready || n.Unschedulable {
			inv.UnavailableNodes++
			continue
		}
		product := n.Product
		if product == "" {
			product = UnknownProduct
		}
		t := totals[product]
		if t == nil {
			t = &protocol.ProductTotal{Product: product}
			totals[product] = t
		}
		t.GPUs += n.Allocatable
		t.Nodes++
	}
	slices.SortFunc(inv.Nodes, func(a, b protocol.NodeGPUs) int { return cmp.Compare(a.Name, b.Name) })
	for _, t := range totals {
		inv.Totals = append(inv.Totals, *t)
	}
	slices.SortFunc(inv.Totals, func(a, b protocol.ProductTotal) int { return cmp.Compare(a.Product, b.Product) })
	return inv
}

// nodeGPUs is the node's entry, and whether it is a GPU node at all.
func nodeGPUs(node *corev1.Node) (protocol.NodeGPUs, bool) {
	capacity := quantity(node.Status.Capacity)
	allocatable := capacity
	if node.Status.Allocatable != nil {
		allocatable = quantity(node.Status.Allocatable)
	}
	labels := node.Labels
	if capacity <= 0 && allocatable <= 0 && !hasGFDLabel(labels) {
		return protocol.NodeGPUs{}, false
	}
	driver := version(labels, LabelDriverVersionFull,
		[]string{LabelDriverVersionMajor, LabelDriverVersionMinor, LabelDriverVersionRevision},
		[]string{LabelDriverMajor, LabelDriverMinor, LabelDriverRev})
	cuda := version(labels, LabelRuntimeVersionFull,
		[]string{LabelRuntimeVersionMajor, LabelRuntimeVersionMinor},
		[]string{LabelRuntimeMajor, LabelRuntimeMinor})
	return protocol.NodeGPUs{
		Name:          node.Name,
		Capacity:      capacity,
		Allocatable:   allocatable,
		Product:       labels[LabelProduct],
		MemoryMiB:     integer(labels[LabelMemory]),
		Count:         integer(labels[LabelCount]),
		MIGStrategy:   labels[LabelMIGStrategy],
		DriverVersion: driver,
		CUDAVersion:   cuda,
		Ready:         ready(node),
		Unschedulable: node.Spec.Unschedulable,
	}, true
}

// quantity is the list's nvidia.com/gpu, zero when absent. Extended resources are whole
// numbers (the API server refuses fractions), so Value loses nothing.
func quantity(l corev1.ResourceList) int64 {
	q, ok := l[ResourceGPU]
	if !ok {
		return 0
	}
	return q.Value()
}

// integer is a label's value as a number; zero (left out of the report) when the label is
// absent or not a non-negative integer, since a malformed label is no reason to drop the
// node.
func integer(s string) int64 {
	v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || v < 0 {
		return 0
	}
	return v
}

// version is the full label when set, else the first group of major/minor[/revision]
// labels (the newer names, then the deprecated ones) that gives a version. A group's parts
// are joined up to the first empty one, so that GFD's empty revision for an X.Y driver gives
// "X.Y", not "X.Y.".
func version(labels map[string]string, full string, groups ...[]string) string {
	if v := strings.TrimSpace(labels[full]); v != "" {
		return v
	}
	for _, group := range groups {
		var parts []string
		for _, key := range group {
			v := strings.TrimSpace(labels[key])
			if v == "" {
				break
			}
			parts = append(parts, v)
		}
		if len(parts) > 0 {
			return strings.Join(parts, ".")
		}
	}
	return ""
}

// ready reports whether the node's Ready condition is True; a node without one (its
// kubelet never reported) is not Ready.
func ready(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// hasGFDLabel reports whether GPU Feature Discovery labelled the node, which makes it a GPU
// node even when it advertises no nvidia.com/gpu: under the MIG "mixed" strategy with every
// GPU partitioned, or after the device plugin stopped.
func hasGFDLabel(labels map[string]string) bool {
	for k := range labels {
		switch k {
		case LabelProduct, LabelMemory, LabelCount, LabelMIGStrategy,
			LabelDriverVersionFull, LabelDriverVersionMajor, LabelDriverMajor,
			LabelRuntimeVersionFull, LabelRuntimeVersionMajor, LabelRuntimeMajor:
			return true
		}
	}
	return false
}
