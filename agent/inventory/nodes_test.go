package inventory_test

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/agent/inventory"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
)

// gfdA100 are the labels GPU Feature Discovery writes on a node with eight A100s and driver
// 550.54.15, both the current and the deprecated version labels.
func gfdA100() map[string]string {
	return map[string]string{
		"nvidia.com/gpu.product":                  "NVIDIA-A100-SXM4-80GB",
		"nvidia.com/gpu.memory":                   "81920",
		"nvidia.com/gpu.count":                    "8",
		"nvidia.com/gpu.family":                   "ampere",
		"nvidia.com/gpu.replicas":                 "1",
		"nvidia.com/mig.capable":                  "true",
		"nvidia.com/mig.strategy":                 "single",
		"nvidia.com/cuda.driver.major":            "550",
		"nvidia.com/cuda.driver.minor":            "54",
		"nvidia.com/cuda.driver.rev":              "15",
		"nvidia.com/cuda.driver-version.major":    "550",
		"nvidia.com/cuda.driver-version.minor":    "54",
		"nvidia.com/cuda.driver-version.revision": "15",
		"nvidia.com/cuda.driver-version.full":     "550.54.15",
		"nvidia.com/cuda.runtime.major":           "12",
		"nvidia.com/cuda.runtime.minor":           "4",
		"nvidia.com/cuda.runtime-version.major":   "12",
		"nvidia.com/cuda.runtime-version.minor":   "4",
		"nvidia.com/cuda.runtime-version.full":    "12.4",
		"kubernetes.io/hostname":                  "placeholder",
	}
}

type nodeOpt func(*corev1.Node)

func newNode(name string, opts ...nodeOpt) corev1.Node {
	n := corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64")},
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("63")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
	for _, o := range opts {
		o(&n)
	}
	return n
}

func labels(l map[string]string) nodeOpt {
	return func(n *corev1.Node) {
		for k, v := range l {
			n.Labels[k] = v
		}
	}
}

func without(keys ...string) nodeOpt {
	return func(n *corev1.Node) {
		for _, k := range keys {
			delete(n.Labels, k)
		}
	}
}

func gpus(capacity, allocatable string) nodeOpt {
	return func(n *corev1.Node) {
		n.Status.Capacity[inventory.ResourceGPU] = resource.MustParse(capacity)
		n.Status.Allocatable[inventory.ResourceGPU] = resource.MustParse(allocatable)
	}
}

func extended(name, capacity string) nodeOpt {
	return func(n *corev1.Node) {
		n.Status.Capacity[corev1.ResourceName(name)] = resource.MustParse(capacity)
		n.Status.Allocatable[corev1.ResourceName(name)] = resource.MustParse(capacity)
	}
}

func readyStatus(s corev1.ConditionStatus) nodeOpt {
	return func(n *corev1.Node) {
		n.Status.Conditions = []corev1.NodeCondition{
			{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse},
			{Type: corev1.NodeReady, Status: s},
		}
	}
}

func noConditions(n *corev1.Node) { n.Status.Conditions = nil }

func cordoned(n *corev1.Node) { n.Spec.Unschedulable = true }

func a100(name string) protocol.NodeGPUs {
	return protocol.NodeGPUs{
		Name: name, Capacity: 8, Allocatable: 8,
		Product: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920, Count: 8, MIGStrategy: "single",
		DriverVersion: "550.54.15", CUDAVersion: "12.4", Ready: true,
	}
}

func TestFromNodes(t *testing.T) {
	tests := []struct {
		name  string
		nodes []corev1.Node
		want  protocol.Inventory
	}{
		{
			name:  "GFD labels and nvidia.com/gpu fill the node's entry",
			nodes: []corev1.Node{newNode("gpu-0", labels(gfdA100()), gpus("8", "8"))},
			want: protocol.Inventory{
				Nodes:  []protocol.NodeGPUs{a100("gpu-0")},
				Totals: []protocol.ProductTotal{{Product: "NVIDIA-A100-SXM4-80GB", GPUs: 8, Nodes: 1}},
			},
		},
		{
			name: "deprecated version labels alone give the versions",
			nodes: []corev1.Node{newNode("gpu-0", labels(gfdA100()), gpus("8", "8"), without(
				"nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver-version.minor",
				"nvidia.com/cuda.driver-version.revision", "nvidia.com/cuda.driver-version.full",
				"nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime-version.minor",
				"nvidia.com/cuda.runtime-version.full"))},
			want: protocol.Inventory{
				Nodes:  []protocol.NodeGPUs{a100("gpu-0")},
				Totals: []protocol.ProductTotal{{Product: "NVIDIA-A100-SXM4-80GB", GPUs: 8, Nodes: 1}},
			},
		},
		{
			name: "version parts without full labels are joined, an empty revision left out",
			nodes: []corev1.Node{newNode("gpu-0", gpus("1", "1"), labels(map[string]string{
				"nvidia.com/gpu.product":                  "Tesla-T4",
				"nvidia.com/cuda.driver-version.major":    "550",
				"nvidia.com/cuda.driver-version.minor":    "120",
				"nvidia.com/cuda.driver-version.revision": "",
				"nvidia.com/cuda.runtime-version.major":   "12",
				"nvidia.com/cuda.runtime-version.minor":   "4",
			}))},
			want: protocol.Inventory{
				Nodes: []protocol.NodeGPUs{{
					Name: "gpu-0", Capacity: 1, Allocatable: 1, Product: "Tesla-T4",
					DriverVersion: "550.120", CUDAVersion: "12.4", Ready: true,
				}},
				Totals: []protocol.ProductTotal{{Product: "Tesla-T4", GPUs: 1, Nodes: 1}},
			},
		},
		{
			name: "full version labels win over their parts",
			nodes: []corev1.Node{newNode("gpu-0", gpus("1", "1"), labels(map[string]string{
				"nvidia.com/cuda.driver-version.full":  "580.126.16",
				"nvidia.com/cuda.driver-version.major": "579",
				"nvidia.com/cuda.runtime-version.full": "13.0",
				"nvidia.com/cuda.runtime.major":        "12",
				"nvidia.com/cuda.runtime.minor":        "9",
			}))},
			want: protocol.Inventory{
				Nodes: []protocol.NodeGPUs{{
					Name: "gpu-0", Capacity: 1, Allocatable: 1,
					DriverVersion: "580.126.16", CUDAVersion: "13.0", Ready: true,
				}},
				Totals: []protocol.ProductTotal{{Product: "unknown", GPUs: 1, Nodes: 1}},
			},
		},
		{
			// Under "single" the device plugin advertises the MIG devices as nvidia.com/gpu
			// and GFD overrides product, count and memory with the MIG device's.
			name: "MIG single counts MIG devices under the MIG product",
			nodes: []corev1.Node{newNode("gpu-mig", gpus("56", "56"), labels(gfdA100()), labels(map[string]string{
				"nvidia.com/gpu.product":         "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
				"nvidia.com/gpu.count":           "56",
				"nvidia.com/gpu.memory":          "9728",
				"nvidia.com/gpu.multiprocessors": "14",
				"nvidia.com/gpu.slices.gi":       "1",
				"nvidia.com/mig.strategy":        "single",
			}))},
			want: protocol.Inventory{
				Nodes: []protocol.NodeGPUs{{
					Name: "gpu-mig", Capacity: 56, Allocatable: 56,
					Product: "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", MemoryMiB: 9728, Count: 56, MIGStrategy: "single",
					DriverVersion: "550.54.15", CUDAVersion: "12.4", Ready: true,
				}},
				Totals: []protocol.ProductTotal{{Product: "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", GPUs: 56, Nodes: 1}},
			},
		},
		{
			// Under "mixed" MIG devices are nvidia.com/mig-<profile>; nvidia.com/gpu counts
			// only the GPUs left whole, none here, yet the node is a GPU node.
			name: "MIG mixed node with every GPU partitioned is listed with no whole GPUs",
			nodes: []corev1.Node{
				newNode("gpu-mixed", labels(gfdA100()), labels(map[string]string{
					"nvidia.com/mig.strategy":          "mixed",
					"nvidia.com/mig-3g.40gb.count":     "16",
					"nvidia.com/mig-3g.40gb.memory":    "40192",
					"nvidia.com/mig-3g.40gb.product":   "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb",
					"nvidia.com/mig-3g.40gb.slices.gi": "3",
				}), extended("nvidia.com/mig-3g.40gb", "16")),
				newNode("gpu-mixed-partly", labels(gfdA100()), labels(map[string]string{
					"nvidia.com/mig.strategy":      "mixed",
					"nvidia.com/mig-1g.10gb.count": "14",
				}), gpus("6", "6"), extended("nvidia.com/mig-1g.10gb", "14")),
			},
			want: protocol.Inventory{
				Nodes: []protocol.NodeGPUs{
					{
						Name: "gpu-mixed", Product: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920, Count: 8, MIGStrategy: "mixed",
						DriverVersion: "550.54.15", CUDAVersion: "12.4", Ready: true,
					},
					{
						Name: "gpu-mixed-partly", Capacity: 6, Allocatable: 6,
						Product: "NVIDIA-A100-SXM4-80GB", MemoryMiB: 81920, Count: 8, MIGStrategy: "mixed",
						DriverVersion: "550.54.15", CUDAVersion: "12.4", Ready: true,
					},
				},
				Totals: []protocol.ProductTotal{{Product: "NVIDIA-A100-SXM4-80GB", GPUs: 6, Nodes: 2}},
			},
		},
		{
			name: "not Ready and unschedulable nodes are counted apart from the totals",
			nodes: []corev1.Node{
				newNode("gpu-3-cordoned", labels(gfdA100()), gpus("8", "8"), cordoned),
				newNode("gpu-1-not-ready", labels(gfdA100()), gpus("8", "8"), readyStatus(corev1.ConditionFalse)),
				newNode("gpu-0", labels(gfdA100()), gpus("8", "8")),
				newNode("gpu-2-unknown", labels(gfdA100()), gpus("8", "8"), readyStatus(corev1.ConditionUnknown)),
				newNode("gpu-4-never-reported", labels(gfdA100()), gpus("8", "8"), noConditions),
				newNode("gpu-5-both", labels(gfdA100()), gpus("8", "8"), cordoned, readyStatus(corev1.ConditionFalse)),
			},
			want: protocol.Inventory{
				Nodes: []protocol.NodeGPUs{
					a100("gpu-0"),
					func() protocol.NodeGPUs { n := a100("gpu-1-not-ready"); n.Ready = false; return n }(),
					func() protocol.NodeGPUs { n := a100("gpu-2-unknown"); n.Ready = false; return n }(),
					func() protocol.NodeGPUs { n := a100("gpu-3-cordoned"); n.Unschedulable = true; return n }(),
					func() protocol.NodeGPUs { n := a100("gpu-4-never-reported"); n.Ready = false; return n }(),
					func() protocol.NodeGPUs {
						n := a100("gpu-5-both")
						n.Ready, n.Unschedulable = false, true
						return n
					}(),
				},
				Totals:           []protocol.ProductTotal{{Product: "NVIDIA-A100-SXM4-80GB", GPUs: 8, Nodes: 1}},
				UnavailableNodes: 5,
			},
		},
		{
			name: "nodes without GPUs are left out",
			nodes: []corev1.Node{
				newNode("cpu-0"),
				newNode("cpu-1-zero-gpus", gpus("0", "0")),
				newNode("cpu-2-other-nvidia-labels", labels(map[string]string{
					"nvidia.com/gpu.deploy.driver": "false",
					"nvidia.com/gpu.present":       "false",
				})),
				newNode("gpu-0", labels(gfdA100()), gpus("8", "8")),
			},
			want: protocol.Inventory{
				Nodes:  []protocol.NodeGPUs{a100("gpu-0")},
				Totals: []protocol.ProductTotal{{Product: "NVIDIA-A100-SXM4-80GB", GPUs: 8, Nodes: 1}},
			},
		},
		{
			name: "totals are per product, sorted, a node without product under unknown",
			nodes: []corev1.Node{
				newNode("h100-1", gpus("8", "8"), labels(map[string]string{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})),
				newNode("a100-0", labels(gfdA100()), gpus("8", "8")),
				newNode("h100-0", gpus("8", "7"), labels(map[string]string{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})),
				newNode("bare-0", gpus("4", "4")),
				newNode("bare-1", gpus("2", "2"), cordoned),
			},
			want: protocol.Inventory{
				Nodes: []protocol.NodeGPUs{
					a100("a100-0"),
					{Name: "bare-0", Capacity: 4, Allocatable: 4, Ready: true},
					{Name: "bare-1", Capacity: 2, Allocatable: 2, Ready: true, Unschedulable: true},
					{Name: "h100-0", Capacity: 8, Allocatable: 7, Product: "NVIDIA-H100-80GB-HBM3", Ready: true},
					{Name: "h100-1", Capacity: 8, Allocatable: 8, Product: "NVIDIA-H100-80GB-HBM3", Ready: true},
				},
				Totals: []protocol.ProductTotal{
					{Product: "NVIDIA-A100-SXM4-80GB", GPUs: 8, Nodes: 1},
					{Product: "NVIDIA-H100-80GB-HBM3", GPUs: 15, Nodes: 2},
					{Product: "unknown", GPUs: 4, Nodes: 1},
				},
				UnavailableNodes: 1,
			},
		},
		{
			name: "allocatable falls back to capacity only when the node has no allocatable at all",
			nodes: []corev1.Node{
				newNode("gpu-0-no-allocatable", labels(gfdA100()), gpus("8", "8"),
					func(n *corev1.Node) { n.Status.Allocatable = nil }),
				newNode("gpu-1-allocatable-without-gpus", labels(gfdA100()), gpus("8", "8"),
					func(n *corev1.Node) { delete(n.Status.Allocatable, inventory.ResourceGPU) }),
				// The device plugin marked two GPUs unhealthy.
				newNode("gpu-2-unhealthy", labels(gfdA100()), gpus("8", "6")),
			},
			want: protocol.Inventory{
				Nodes: []protocol.NodeGPUs{
					a100("gpu-0-no-allocatable"),
					func() protocol.NodeGPUs { n := a100("gpu-1-allocatable-without-gpus"); n.Allocatable = 0; return n }(),
					func() protocol.NodeGPUs { n := a100("gpu-2-unhealthy"); n.Allocatable = 6; return n }(),
				},
				Totals: []protocol.ProductTotal{{Product: "NVIDIA-A100-SXM4-80GB", GPUs: 14, Nodes: 3}},
			},
		},
		{
			name: "malformed number labels are left out, the node kept",
			nodes: []corev1.Node{newNode("gpu-0", gpus("1", "1"), labels(map[string]string{
				"nvidia.com/gpu.product": "Tesla-T4",
				"nvidia.com/gpu.memory":  "15 GiB",
				"nvidia.com/gpu.count":   "-1",
			}))},
			want: protocol.Inventory{
				Nodes:  []protocol.NodeGPUs{{Name: "gpu-0", Capacity: 1, Allocatable: 1, Product: "Tesla-T4", Ready: true}},
				Totals: []protocol.ProductTotal{{Product: "Tesla-T4", GPUs: 1, Nodes: 1}},
			},
		},
		{
			name:  "no GPU nodes give empty lists, not nil",
			nodes: []corev1.Node{newNode("cpu-0")},
			want:  protocol.Inventory{Nodes: []protocol.NodeGPUs{}, Totals: []protocol.ProductTotal{}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := make([]corev1.Node, len(tt.nodes))
			for i := range tt.nodes {
				tt.nodes[i].DeepCopyInto(&before[i])
			}
			got := inventory.FromNodes(tt.nodes)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("FromNodes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, tt.nodes); diff != "" {
				t.Errorf("FromNodes changed its input (-before +after):\n%s", diff)
			}
		})
	}
}

func TestFromNodesIsDeterministic(t *testing.T) {
	var nodes []corev1.Node
	for _, p := range []string{"B", "A", "C", "A", "B", ""} {
		name := "n-" + p + "-" + string(rune('0'+len(nodes)))
		nodes = append(nodes, newNode(name, gpus("1", "1"), labels(map[string]string{"nvidia.com/gpu.product": p})))
	}
	want, err := json.Marshal(inventory.FromNodes(nodes))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		// Reversed and rotated inputs give the same report, byte for byte.
		perm := make([]corev1.Node, 0, len(nodes))
		for j := range nodes {
			perm = append(perm, nodes[(len(nodes)-1-j+i)%len(nodes)])
		}
		got, err := json.Marshal(inventory.FromNodes(perm))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("permutation %d gave\n%s\nwant\n%s", i, got, want)
		}
	}
}
