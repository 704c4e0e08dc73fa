package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// invalidAnnotation is where the hub says why the cluster's directory does not validate
// at the source commit (reconciler/hub keeps the constant unexported).
const invalidAnnotation = "flotilla.dev/invalid"

// hubFlags are kubectl's own flags for reaching the hub's Kubernetes API, with kubectl's
// meanings, so that an engineer's kubeconfig and habits carry over.
type hubFlags struct {
	kubeconfig string
	context    string
	namespace  string
}

func (h *hubFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&h.kubeconfig, "kubeconfig", "", "kubeconfig file of the hub's Kubernetes cluster (default: $KUBECONFIG, else ~/.kube/config)")
	fs.StringVar(&h.context, "context", "", "kubeconfig context to use (default: the current context)")
	fs.StringVarP(&h.namespace, "namespace", "n", "", "the tenant's namespace on the hub (default: the context's namespace, else default)")
}

// hubConn is a client of the hub's API with the namespace and context it was made for,
// which every message about a missing object names.
type hubConn struct {
	client    client.Client
	namespace string
	context   string
}

func (c *hubConn) where() string {
	if c.context == "" {
		return fmt.Sprintf("namespace %q", c.namespace)
	}
	return fmt.Sprintf("namespace %q (context %q)", c.namespace, c.context)
}

// connect loads the kubeconfig the way kubectl does and makes a client that knows the
// WorkerCluster type. Warnings of the API server go to stderr, as kubectl prints them.
func (h *hubFlags) connect(stderr io.Writer) (*hubConn, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = h.kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: h.context}
	overrides.Context.Namespace = h.namespace
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("reading the hub's kubeconfig: %w", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, fmt.Errorf("reading the hub's kubeconfig: %w", err)
	}
	if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
		return nil, fmt.Errorf("namespace %q: %s", ns, strings.Join(msgs, "; "))
	}
	contextName := h.context
	if contextName == "" {
		if raw, err := cc.RawConfig(); err == nil {
			contextName = raw.CurrentContext
		}
	}
	cfg = rest.CopyConfig(cfg)
	cfg.WarningHandler = rest.NewWarningWriter(stderr, rest.WarningWriterOptions{Deduplicate: true})
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("connecting to the hub at %s: %w", cfg.Host, err)
	}
	return &hubConn{client: c, namespace: ns, context: contextName}, nil
}

// get reads one WorkerCluster, with a message naming the namespace when it is not there.
func (c *hubConn) get(cmd *cobra.Command, name string) (*v1alpha1.WorkerCluster, error) {
	var wc v1alpha1.WorkerCluster
	err := c.client.Get(cmd.Context(), client.ObjectKey{Namespace: c.namespace, Name: name}, &wc)
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("no WorkerCluster %q in %s on the hub; `flotilla cluster list -n %s` shows the clusters there", name, c.where(), c.namespace)
	case err != nil:
		return nil, fmt.Errorf("reading WorkerCluster %s/%s: %w", c.namespace, name, err)
	}
	return &wc, nil
}

// checkOutput accepts the empty format, meaning output for people, and the given ones.
func checkOutput(output string, formats ...string) error {
	if output != "" && !slices.Contains(formats, output) {
		return fmt.Errorf("--output must be %s, not %q", strings.Join(formats, " or "), output)
	}
	return nil
}

// printObject writes obj as kubectl -o json or -o yaml would: with its kind, without
// managed fields.
func printObject(out io.Writer, output string, obj any) error {
	var data []byte
	var err error
	if output == "json" {
		data, err = json.MarshalIndent(obj, "", "    ")
		data = append(data, '\n')
	} else {
		data, err = yaml.Marshal(obj)
	}
	if err != nil {
		return err
	}
	_, err = out.Write(data)
	return err
}

// forPrinting is wc as it is printed whole: typed clients leave the kind out, and
// managed fields are noise to a person.
func forPrinting(wc *v1alpha1.WorkerCluster) *v1alpha1.WorkerCluster {
	wc = wc.DeepCopy()
	wc.APIVersion, wc.Kind = v1alpha1.GroupVersion.String(), "WorkerCluster"
	wc.ManagedFields = nil
	return wc
}

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

// newTable is a tabwriter laid out as kubectl's tables are.
func newTable(out io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(out, 6, 4, 3, ' ', 0) }

func printClusterTable(out io.Writer, items []v1alpha1.WorkerCluster, now time.Time) error {
	tw := newTable(out)
	fmt.Fprintln(tw, "NAME\tREGION\tPRESET\tCORDONED\tREGISTERED\tCONNECTED\tCONFIGURED\tREADY\tGPUS\tLAST SEEN")
	for i := range items {
		wc := &items[i]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%s\t%s\t%s\t%s\t%s\t%s\n", wc.Name, wc.Spec.Region, wc.Spec.Preset, wc.Spec.Cordoned,
			conditionStatus(wc, v1alpha1.ConditionRegistered), conditionStatus(wc, v1alpha1.ConditionConnected),
			conditionStatus(wc, v1alpha1.ConditionWorkerConfigured), conditionStatus(wc, v1alpha1.ConditionReady),
			gpuCounts(wc.Status.GPUs), lastSeen(wc, now))
	}
	return tw.Flush()
}

// conditionStatus is True, False or Unknown; an absent condition is Unknown, as the API
// conventions have it.
func conditionStatus(wc *v1alpha1.WorkerCluster, typ string) string {
	if c := meta.FindStatusCondition(wc.Status.Conditions, typ); c != nil && c.Status != "" {
		return string(c.Status)
	}
	return string(metav1.ConditionUnknown)
}

// gpuCounts is "16× NVIDIA-H100-80GB-HBM3", one entry per product in the order the agent
// reported them.
func gpuCounts(gpus []v1alpha1.GPUTotal) string {
	if len(gpus) == 0 {
		return "<none>"
	}
	parts := make([]string, len(gpus))
	for i, g := range gpus {
		parts[i] = fmt.Sprintf("%d× %s", g.Count, g.Product)
	}
	return strings.Join(parts, ", ")
}

func lastSeen(wc *v1alpha1.WorkerCluster, now time.Time) string {
	if wc.Status.LastSeen == nil {
		return "<never>"
	}
	return since(wc.Status.LastSeen.Time, now)
}

// since is an age the way kubectl prints one: 5m, 3h12m, 4d.
func since(t, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t))
}

// timeAndAge is an absolute time for the record and its age for the reader.
func timeAndAge(t metav1.Time, now time.Time) string {
	return fmt.Sprintf("%s (%s ago)", t.UTC().Format(time.RFC3339), since(t.Time, now))
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
	v1alpha1.ConditionReady, v1alpha1.ConditionDispatchReady,
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
	if c := wc.Annotations[v1alpha1.SourceCommitAnnotation]; c != "" {
		row("Source commit", "%s", c)
	}
	if why := wc.Annotations[invalidAnnotation]; why != "" {
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
