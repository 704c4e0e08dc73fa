package main

// `cluster list` and `cluster status` read the WorkerClusters on the hub: what the hub
// made of the fleet repository and what the agents reported. The `cluster` commands that
// edit a checkout are in cluster.go.

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/secrets"
)

func newClusterListCommand(hub *hubFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the worker clusters the hub knows, with their conditions",
		Long: "list reads the WorkerClusters in the tenant's namespace on the hub and prints one\n" +
			"line per cluster: its spec from Git and the conditions and GPUs its agent reported.\n" +
			"A condition the hub has not set yet shows as Unknown.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, "json", "yaml"); err != nil {
				return err
			}
			conn, err := hub.connect(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			var list v1alpha1.WorkerClusterList
			if err := conn.client.List(cmd.Context(), &list, client.InNamespace(conn.namespace)); err != nil {
				return fmt.Errorf("listing WorkerClusters in %s: %w", conn.where(), err)
			}
			slices.SortFunc(list.Items, func(a, b v1alpha1.WorkerCluster) int { return cmp.Compare(a.Name, b.Name) })
			if output != "" {
				for i := range list.Items {
					list.Items[i] = *forPrinting(&list.Items[i])
				}
				list.APIVersion, list.Kind = v1alpha1.GroupVersion.String(), "WorkerClusterList"
				return printObject(cmd.OutOrStdout(), output, &list)
			}
			if len(list.Items) == 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "No worker clusters in %s.\n", conn.where())
				return nil
			}
			return printClusterTable(cmd.OutOrStdout(), list.Items, time.Now())
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: json or yaml (default: a table)")
	return cmd
}

func printClusterTable(out io.Writer, items []v1alpha1.WorkerCluster, now time.Time) error {
	tw := newTable(out)
	fmt.Fprintln(tw, "NAME\tREGION\tPRESET\tCORDONED\tREGISTERED\tCONNECTED\tCONFIGURED\tREADY\tGPUS\tLAST SEEN\tCREDENTIAL EXPIRES")
	for i := range items {
		wc := &items[i]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", wc.Name, wc.Spec.Region, wc.Spec.Preset, wc.Spec.Cordoned,
			conditionStatus(wc, v1alpha1.ConditionRegistered), conditionStatus(wc, v1alpha1.ConditionConnected),
			conditionStatus(wc, v1alpha1.ConditionWorkerConfigured), conditionStatus(wc, v1alpha1.ConditionReady),
			gpuCounts(wc.Status.GPUs), lastSeen(wc, now), credentialExpires(wc, now))
	}
	return tw.Flush()
}

// credentialExpires is how long the agent's credential has left, for the table: "in
// 87d", "expired 2d ago", <none> before an enrollment, <unknown> for a credential of a
// hub that recorded no lifetimes.
func credentialExpires(wc *v1alpha1.WorkerCluster, now time.Time) string {
	switch c := wc.Status.Credential; {
	case c != nil:
		return untilOrSince(c.ExpiresAt.Time, now)
	case wc.Status.Enrollment != nil:
		return "<unknown>"
	}
	return "<none>"
}

// untilOrSince is "in 87d" for a time ahead, "expired 2d ago" for one past.
func untilOrSince(t, now time.Time) string {
	if d := t.Sub(now); d > 0 {
		return "in " + duration.HumanDuration(d)
	}
	return "expired " + since(t, now) + " ago"
}

// conditionStatus is True, False or Unknown; an absent condition is Unknown, as the API
// conventions have it.
func conditionStatus(wc *v1alpha1.WorkerCluster, typ string) string {
	if c := meta.FindStatusCondition(wc.Status.Conditions, typ); c != nil && c.Status != "" {
		return string(c.Status)
	}
	return string(metav1.ConditionUnknown)
}

func lastSeen(wc *v1alpha1.WorkerCluster, now time.Time) string {
	if wc.Status.LastSeen == nil {
		return "<never>"
	}
	return since(wc.Status.LastSeen.Time, now)
}

func newClusterStatusCommand(hub *hubFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "status NAME",
		Short: "Show what the hub knows of one worker cluster",
		Long: "status prints one WorkerCluster of the tenant's namespace on the hub: its spec from\n" +
			"Git, its enrollment (fingerprints only: the hub never holds a token), its agent, the\n" +
			"desired and applied state, its GPUs and every condition with its reason and message.\n" +
			"It exits 1 when the hub has no such cluster.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, "json", "yaml"); err != nil {
				return err
			}
			if err := checkClusterName(args[0]); err != nil {
				return err
			}
			conn, err := hub.connect(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			wc, err := conn.get(cmd, args[0])
			if err != nil {
				return err
			}
			if output != "" {
				return printObject(cmd.OutOrStdout(), output, forPrinting(wc))
			}
			return printClusterStatus(cmd.OutOrStdout(), wc, time.Now())
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: json or yaml (default: a description)")
	return cmd
}

// conditionOrder is the order a new cluster reaches its conditions in; others follow.
var conditionOrder = []string{
	v1alpha1.ConditionRegistered, v1alpha1.ConditionConnected, v1alpha1.ConditionWorkerConfigured,
	v1alpha1.ConditionReady, v1alpha1.ConditionDispatchReady, v1alpha1.ConditionCredentialCurrent,
}

// credentialRows describes the lifetime of the agent's credential: when it expires,
// when the hub last rotated it, and a rotation the agent has not confirmed.
func credentialRows(row func(key, format string, args ...any), c *v1alpha1.CredentialStatus, now time.Time) {
	if c == nil {
		row("  Expires", "<not recorded>: the credential was issued before the hub recorded lifetimes; its lifetime starts when its agent next connects")
		return
	}
	expires := fmt.Sprintf("%s (%s)", c.ExpiresAt.UTC().Format(time.RFC3339), untilOrSince(c.ExpiresAt.Time, now))
	if c.LifetimeAssumed {
		expires += fmt.Sprintf("; issued before the hub recorded lifetimes, its lifetime counts from %s", c.IssuedAt.UTC().Format(time.RFC3339))
	}
	row("  Expires", "%s", expires)
	if c.RotatedAt != nil {
		row("  Last rotated", "%s", timeAndAge(*c.RotatedAt, now))
	} else {
		row("  Last rotated", "not yet")
	}
	if p := c.RotationPendingSince; p != nil {
		row("  Rotation", "unconfirmed since %s: the agent has not confirmed storing the new credential (see its log)", timeAndAge(*p, now))
	}
}

func printClusterStatus(out io.Writer, wc *v1alpha1.WorkerCluster, now time.Time) error {
	var rows [][2]string
	row := func(key, format string, args ...any) {
		rows = append(rows, [2]string{key + ":", fmt.Sprintf(format, args...)})
	}
	s, st := &wc.Spec, &wc.Status
	row("Name", "%s", wc.Name)
	row("Namespace", "%s", wc.Namespace)
	if id := wc.Labels[v1alpha1.WorkerClusterLabel]; id != "" {
		row("Identity", "%s", id)
	}
	if s.DisplayName != "" {
		row("Display name", "%s", s.DisplayName)
	}
	region := s.Region
	if s.Zone != "" {
		region += " (zone " + s.Zone + ")"
	}
	row("Region", "%s", region)
	row("Residency", "%s", s.Residency)
	row("Preset", "%s", s.Preset)
	if s.Cordoned {
		row("Cordoned", "true: no new jobs are dispatched; running ones carry on")
	} else {
		row("Cordoned", "false")
	}
	if len(s.Quota) > 0 {
		names := make([]string, 0, len(s.Quota))
		for n := range s.Quota {
			names = append(names, string(n))
		}
		slices.Sort(names)
		parts := make([]string, len(names))
		for i, n := range names {
			q := s.Quota[corev1.ResourceName(n)]
			parts[i] = n + "=" + q.String()
		}
		row("Quota", "%s", strings.Join(parts, ", "))
	}
	if len(s.ExpectedGPUs) > 0 {
		parts := make([]string, len(s.ExpectedGPUs))
		for i, g := range s.ExpectedGPUs {
			parts[i] = fmt.Sprintf("%d× %s", g.Count, g.Product)
		}
		row("Expected GPUs", "%s", strings.Join(parts, ", "))
	}
	if c := wc.SourceCommit(); c != "" {
		row("Source commit", "%s", c)
	}
	if why := wc.Annotations[v1alpha1.InvalidAnnotation]; why != "" {
		row("Invalid in Git", "%s (the worker keeps its last good state)", why)
	}

	row("Enrollment", "%s", "")
	if fp := fingerprint(s.EnrollmentTokenHash); fp != "" {
		row("  Token in Git", "fingerprint %s", fp)
	}
	if e := st.Enrollment; e != nil {
		redeemed := timeAndAge(e.RedeemedAt, now)
		if fp := fingerprint(e.TokenHash); fp != "" {
			redeemed += ", token fingerprint " + fp
		}
		row("  Redeemed", "%s", redeemed)
		if e.CredentialFingerprint != "" {
			row("  Credential", "fingerprint %s", e.CredentialFingerprint)
		}
		if e.CredentialIssuedAt != nil {
			row("  Credential issued", "%s", timeAndAge(*e.CredentialIssuedAt, now))
		}
		credentialRows(row, st.Credential, now)
	} else {
		row("  Redeemed", "not yet: no agent has presented the enrollment token")
	}

	if a := st.Agent; a != nil {
		row("Agent", "%s", cmp.Or(a.Version, "<unknown>"))
		row("Kubernetes", "%s", cmp.Or(a.KubernetesVersion, "<unknown>"))
	} else {
		row("Agent", "<never connected>")
	}
	if st.LastSeen != nil {
		row("Last seen", "%s", timeAndAge(*st.LastSeen, now))
	} else {
		row("Last seen", "<never>")
	}
	row("Desired hash", "%s", cmp.Or(st.DesiredHash, "<none>"))
	applied := cmp.Or(st.AppliedHash, "<none>")
	switch {
	case st.AppliedHash == "":
	case st.AppliedHash == st.DesiredHash:
		applied += " (current)"
	default:
		applied += " (not the desired state)"
	}
	row("Applied hash", "%s", applied)
	gpus := gpuCounts(st.GPUs)
	if n := gpuNodes(st.GPUs); n > 0 {
		gpus += fmt.Sprintf(" on %d %s", n, plural(int(n), "node", "nodes"))
	}
	row("GPUs", "%s", gpus)
	if st.UnavailableGPUNodes > 0 {
		row("Unavailable", "%d GPU %s not Ready or cordoned", st.UnavailableGPUNodes, plural(int(st.UnavailableGPUNodes), "node", "nodes"))
	}
	width := 0
	for _, r := range rows {
		width = max(width, len(r[0]))
	}
	for _, r := range rows {
		fmt.Fprintln(out, strings.TrimRight(fmt.Sprintf("%-*s %s", width, r[0], r[1]), " "))
	}

	fmt.Fprintln(out, "Conditions:")
	if len(st.Conditions) == 0 {
		fmt.Fprintln(out, "  <none>: the hub has not judged this cluster yet")
		return nil
	}
	conds := slices.Clone(st.Conditions)
	rank := func(t string) int {
		if i := slices.Index(conditionOrder, t); i >= 0 {
			return i
		}
		return len(conditionOrder)
	}
	slices.SortStableFunc(conds, func(a, b metav1.Condition) int { return cmp.Compare(rank(a.Type), rank(b.Type)) })
	ct := newTable(out)
	fmt.Fprintln(ct, "  TYPE\tSTATUS\tREASON\tAGE\tMESSAGE")
	for _, c := range conds {
		reason := c.Reason
		if c.ObservedGeneration != 0 && c.ObservedGeneration != wc.Generation {
			reason += fmt.Sprintf(" (generation %d of %d)", c.ObservedGeneration, wc.Generation)
		}
		fmt.Fprintf(ct, "  %s\t%s\t%s\t%s\t%s\n", c.Type, c.Status, reason, since(c.LastTransitionTime.Time, now), c.Message)
	}
	return ct.Flush()
}

// fingerprint is the short form that logs, statuses and `cluster add` print of a token
// hash; empty when there is none.
func fingerprint(hash string) string {
	if hash == "" {
		return ""
	}
	h, err := secrets.ParseHash(hash)
	if err != nil {
		return ""
	}
	return h.Fingerprint()
}

func gpuNodes(gpus []v1alpha1.GPUTotal) int32 {
	var n int32
	for _, g := range gpus {
		n += g.Nodes
	}
	return n
}
