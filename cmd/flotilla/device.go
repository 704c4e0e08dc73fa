package main

// `device ls` reads the GPU inventory a cluster's agent last reported to the hub.

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

func newDeviceCommand(hub *hubFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "device",
		Short: "Show the GPUs worker clusters report",
	}
	cmd.AddCommand(newDeviceListCommand(hub))
	return cmd
}

// deviceInventory is the machine-readable form of `device ls`.
type deviceInventory struct {
	Cluster             string       `json:"cluster"`
	Namespace           string       `json:"namespace"`
	LastSeen            *metav1.Time `json:"lastSeen,omitempty"`
	GPUs                []deviceRow  `json:"gpus"`
	UnavailableGPUNodes int32        `json:"unavailableGPUNodes"`
}

type deviceRow struct {
	Product string `json:"product"`
	// Count and Nodes are what the agent reported on Ready, schedulable nodes.
	Count int64 `json:"count"`
	Nodes int32 `json:"nodes"`
	// Expected is what cluster.yaml says the cluster should have; 0 when it says nothing.
	Expected int32 `json:"expected,omitempty"`
}

func inventoryOf(wc *v1alpha1.WorkerCluster) deviceInventory {
	inv := deviceInventory{Cluster: wc.Name, Namespace: wc.Namespace, LastSeen: wc.Status.LastSeen,
		GPUs: []deviceRow{}, UnavailableGPUNodes: wc.Status.UnavailableGPUNodes}
	expected := map[string]int32{}
	for _, g := range wc.Spec.ExpectedGPUs {
		expected[g.Product] = g.Count
	}
	seen := map[string]bool{}
	for _, g := range wc.Status.GPUs {
		inv.GPUs = append(inv.GPUs, deviceRow{Product: g.Product, Count: g.Count, Nodes: g.Nodes, Expected: expected[g.Product]})
		seen[g.Product] = true
	}
	// A product the cluster should have and does not report is the line that matters most.
	for _, g := range wc.Spec.ExpectedGPUs {
		if !seen[g.Product] {
			inv.GPUs = append(inv.GPUs, deviceRow{Product: g.Product, Expected: g.Count})
		}
	}
	slices.SortStableFunc(inv.GPUs, func(a, b deviceRow) int { return cmp.Compare(a.Product, b.Product) })
	return inv
}

func newDeviceListCommand(hub *hubFlags) *cobra.Command {
	var cluster, output string
	cmd := &cobra.Command{
		Use:     "ls --cluster NAME",
		Aliases: []string{"list"},
		Short:   "List the GPUs of one worker cluster",
		Long: "ls prints the GPU inventory the cluster's agent last reported: per product the\n" +
			"number of GPUs and of nodes (Ready, schedulable nodes only) beside what cluster.yaml\n" +
			"expects, and how many GPU nodes are not Ready or cordoned.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, "json"); err != nil {
				return err
			}
			if err := checkClusterName(cluster); err != nil {
				return err
			}
			conn, err := hub.connect(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			wc, err := conn.get(cmd, cluster)
			if err != nil {
				return err
			}
			inv := inventoryOf(wc)
			out := cmd.OutOrStdout()
			if output == "json" {
				return printObject(out, output, inv)
			}
			now := time.Now()
			if wc.Status.LastSeen == nil {
				fmt.Fprintf(out, "Cluster %s has never been seen by the hub; no GPUs reported.\n", wc.Name)
			} else {
				fmt.Fprintf(out, "Cluster %s, reported %s ago.\n", wc.Name, since(wc.Status.LastSeen.Time, now))
			}
			if len(inv.GPUs) > 0 {
				tw := newTable(out)
				fmt.Fprintln(tw, "PRODUCT\tGPUS\tNODES\tEXPECTED")
				for _, g := range inv.GPUs {
					exp := "-"
					if g.Expected > 0 {
						exp = fmt.Sprint(g.Expected)
					}
					fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", g.Product, g.Count, g.Nodes, exp)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			fmt.Fprintf(out, "Unavailable GPU nodes: %d", inv.UnavailableGPUNodes)
			if inv.UnavailableGPUNodes > 0 {
				fmt.Fprint(out, " (not Ready or cordoned; their GPUs are not counted above)")
			}
			fmt.Fprintln(out)
			return nil
		},
	}
	cmd.Flags().StringVar(&cluster, "cluster", "", "name of the worker cluster (required)")
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: json (default: a table)")
	_ = cmd.MarkFlagRequired("cluster")
	return cmd
}
