package main

// The commands that read the hub share kubectl's flags, its way of loading a kubeconfig
// and its output formats.

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
)

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

// newTable is a tabwriter laid out as kubectl's tables are.
func newTable(out io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(out, 6, 4, 3, ' ', 0) }

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
