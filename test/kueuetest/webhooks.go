package kueuetest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

const (
	kueueModule = "sigs.k8s.io/kueue"
	// namePrefix is what Kueue's own installation (config/default, and its Helm chart as
	// "kueue-" for the release name kueue) puts before the names of its objects.
	namePrefix = "kueue-"
	// kueueGroup is the API group of Kueue's own kinds, whose webhooks are always installed.
	kueueGroup = "kueue.x-k8s.io"
)

// webhookComponent is where Kueue's module keeps its webhook configurations: the manifests
// controller-gen generates and a kustomization that patches in namespace selectors.
const webhookComponent = "config/components/webhook"

// webhooks are one manager's webhook configurations, installed with envtest's options.
type webhooks struct {
	opts envtest.WebhookInstallOptions
	// uids are those of the installed configurations by name, so that removal never deletes
	// a configuration somebody else has created since.
	uids map[string]types.UID
}

// loadWebhooks builds Kueue's webhook component from its module and keeps the webhooks of Kueue's
// own kinds and those of the given integrations.
func loadWebhooks(ctx context.Context, frameworks []string) (*webhooks, error) {
	moduleDir, err := controlplane.ModuleDir(ctx, kueueModule)
	if err != nil {
		return nil, fmt.Errorf("loading kueue's webhooks: %w", err)
	}
	dir := filepath.Join(moduleDir, filepath.FromSlash(webhookComponent))
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("loading kueue's webhooks: building %s: %w", dir, err)
	}
	keep, err := keeper(frameworks)
	if err != nil {
		return nil, fmt.Errorf("loading kueue's webhooks: %w", err)
	}
	w := &webhooks{}
	for _, r := range resources.Resources() {
		data, err := r.AsYAML()
		if err != nil {
			return nil, fmt.Errorf("loading kueue's webhooks: %s: %w", r.CurId(), err)
		}
		switch r.GetKind() {
		case "MutatingWebhookConfiguration":
			c := &admissionv1.MutatingWebhookConfiguration{}
			if err := yaml.UnmarshalStrict(data, c); err != nil {
				return nil, fmt.Errorf("loading kueue's webhooks: %s: %w", r.CurId(), err)
			}
			c.Name = namePrefix + c.Name
			c.Webhooks = slices.DeleteFunc(c.Webhooks, func(h admissionv1.MutatingWebhook) bool { return !keep.rules(h.Rules) })
			w.opts.MutatingWebhooks = append(w.opts.MutatingWebhooks, c)
		case "ValidatingWebhookConfiguration":
			c := &admissionv1.ValidatingWebhookConfiguration{}
			if err := yaml.UnmarshalStrict(data, c); err != nil {
				return nil, fmt.Errorf("loading kueue's webhooks: %s: %w", r.CurId(), err)
			}
			c.Name = namePrefix + c.Name
			c.Webhooks = slices.DeleteFunc(c.Webhooks, func(h admissionv1.ValidatingWebhook) bool { return !keep.rules(h.Rules) })
			w.opts.ValidatingWebhooks = append(w.opts.ValidatingWebhooks, c)
		}
	}
	if len(w.opts.MutatingWebhooks) != 1 || len(w.opts.ValidatingWebhooks) != 1 {
		return nil, fmt.Errorf("loading kueue's webhooks: %s holds %d mutating and %d validating configurations, want one of each",
			dir, len(w.opts.MutatingWebhooks), len(w.opts.ValidatingWebhooks))
	}
	if missing := keep.unused(); len(missing) > 0 {
		return nil, fmt.Errorf("loading kueue's webhooks: %s has no webhook for integrations %s", dir, strings.Join(missing, ", "))
	}
	return w, nil
}

// webhookFilter decides which webhooks a manager's plane gets: those whose every rule is on
// Kueue's own kinds or on the kind of an enabled integration. It records which integrations
// matched, so that a name Kueue's manifests do not know is an error rather than a silent gap.
type webhookFilter struct {
	resources map[string]string // "<group>/<resource>" of each enabled integration -> its name
	matched   map[string]bool
}

func keeper(frameworks []string) (*webhookFilter, error) {
	f := &webhookFilter{resources: map[string]string{}, matched: map[string]bool{}}
	for _, name := range frameworks {
		gr, err := frameworkResource(name)
		if err != nil {
			return nil, err
		}
		f.resources[gr] = name
	}
	return f, nil
}

func (f *webhookFilter) rules(rules []admissionv1.RuleWithOperations) bool {
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				if g == kueueGroup {
					continue
				}
				name, ok := f.resources[g+"/"+res]
				if !ok {
					return false
				}
				f.matched[name] = true
			}
		}
	}
	return true
}

func (f *webhookFilter) unused() []string {
	var out []string
	for _, name := range f.resources {
		if !f.matched[name] {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// frameworkResource maps an integration's name to the "<group>/<resource>" its webhooks cover.
// Kueue names an integration "<group>/<kind in lower case>", except the built-in workload kinds
// that it names by kind alone.
func frameworkResource(name string) (string, error) {
	switch name {
	case "pod":
		return "/pods", nil
	case "deployment":
		return "apps/deployments", nil
	case "statefulset":
		return "apps/statefulsets", nil
	}
	group, kind, ok := strings.Cut(name, "/")
	if !ok || group == "" || kind == "" || strings.Contains(kind, "/") {
		return "", fmt.Errorf("integration %q is not of the form <group>/<kind>", name)
	}
	return group + "/" + kind + "s", nil
}

// refuseOccupied fails when the plane already carries Kueue's webhook configurations: another
// manager runs there, and two cannot share them.
func (w *webhooks) refuseOccupied(ctx context.Context, plane *controlplane.ControlPlane) error {
	for _, obj := range w.objects() {
		existing := obj.DeepCopyObject().(client.Object)
		err := plane.Client.Get(ctx, client.ObjectKeyFromObject(obj), existing)
		if err == nil {
			return fmt.Errorf("%s already has %s %s: another kueue manager runs there", plane.Name, kindOf(obj), obj.GetName())
		}
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("looking for %s %s: %w", kindOf(obj), obj.GetName(), err)
		}
	}
	return nil
}

// point re-points every webhook at the manager's loopback address, trusted through ca.
func (w *webhooks) point(host string, port int, certDir string, ca []byte) {
	w.opts.LocalServingHost = host
	w.opts.LocalServingPort = port
	w.opts.LocalServingCertDir = certDir
	w.opts.LocalServingCAData = ca
}

// install creates the configurations on the plane and waits until the API server serves them.
func (w *webhooks) install(ctx context.Context, plane *controlplane.ControlPlane) error {
	// With the CA data set, Install neither generates certificates nor reads manifests; it is
	// handed the filtered configurations, re-pointed here.
	if err := w.opts.ModifyWebhookDefinitions(); err != nil {
		return fmt.Errorf("re-pointing kueue's webhooks: %w", err)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(defaultStartTimeout)
	}
	w.opts.MaxTime = time.Until(deadline)
	w.opts.PollInterval = 50 * time.Millisecond
	// Install takes no context; its own MaxTime bounds it.
	if err := w.opts.Install(plane.Config); err != nil {
		return fmt.Errorf("installing kueue's webhooks on %s: %w", plane.Name, err)
	}
	w.uids = map[string]types.UID{}
	for _, obj := range w.objects() {
		got := obj.DeepCopyObject().(client.Object)
		if err := plane.Client.Get(ctx, client.ObjectKeyFromObject(obj), got); err != nil {
			return fmt.Errorf("reading back %s %s: %w", kindOf(obj), obj.GetName(), err)
		}
		w.uids[kindOf(obj)+"/"+obj.GetName()] = got.GetUID()
	}
	return nil
}

func (w *webhooks) installed() bool { return len(w.uids) > 0 }

// uninstall deletes the configurations install created.
func (w *webhooks) uninstall(ctx context.Context, plane *controlplane.ControlPlane) error {
	var errs []error
	for _, obj := range w.objects() {
		uid, ok := w.uids[kindOf(obj)+"/"+obj.GetName()]
		if !ok {
			continue
		}
		del := obj.DeepCopyObject().(client.Object)
		err := plane.Client.Delete(ctx, del, client.Preconditions{UID: &uid})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			errs = append(errs, fmt.Errorf("deleting %s %s from %s: %w", kindOf(obj), obj.GetName(), plane.Name, err))
		}
	}
	return errors.Join(errs...)
}

func (w *webhooks) objects() []client.Object {
	var out []client.Object
	for _, c := range w.opts.MutatingWebhooks {
		out = append(out, c)
	}
	for _, c := range w.opts.ValidatingWebhooks {
		out = append(out, c)
	}
	return out
}

func kindOf(obj client.Object) string {
	switch obj.(type) {
	case *admissionv1.MutatingWebhookConfiguration:
		return "MutatingWebhookConfiguration"
	case *admissionv1.ValidatingWebhookConfiguration:
		return "ValidatingWebhookConfiguration"
	}
	return fmt.Sprintf("%T", obj)
}

// waitWebhooks waits until the API server calls Kueue's webhooks (want true) or no longer does
// (want false). The API server picks up webhook configurations through informers, a moment
// after they are stored; two dry-run requests show what it does now: a ClusterQueue comes back
// with the finalizer Kueue's mutating webhook adds, and a ResourceFlavor with an invalid node
// label is refused by Kueue's validating webhook.
func waitWebhooks(ctx context.Context, plane *controlplane.ControlPlane, want bool) error {
	var last string
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		mutating, validating, err := webhooksCalled(ctx, plane)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("mutating webhook called: %t, validating webhook called: %t", mutating, validating)
		return mutating == want && validating == want, nil
	})
	if err != nil {
		verb := "to call"
		if !want {
			verb = "to stop calling"
		}
		return fmt.Errorf("waiting for the API server of %s %s kueue's webhooks: %w (last: %s)", plane.Name, verb, err, last)
	}
	return nil
}

// probeLabel is a node label key that Kueue's ResourceFlavor validation refuses and the CRD's
// schema lets through.
const probeLabel = "kueuetest.invalid/not a label key"

func webhooksCalled(ctx context.Context, plane *controlplane.ControlPlane) (mutating, validating bool, err error) {
	dryRun := client.DryRunAll
	cq := &kueue.ClusterQueue{ObjectMeta: metav1.ObjectMeta{GenerateName: "kueuetest-probe-"}}
	if err := plane.Client.Create(ctx, cq, dryRun); err != nil {
		return false, false, fmt.Errorf("dry-run ClusterQueue: %w", err)
	}
	mutating = slices.Contains(cq.Finalizers, kueue.ResourceInUseFinalizerName)

	rf := &kueue.ResourceFlavor{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "kueuetest-probe-"},
		Spec:       kueue.ResourceFlavorSpec{NodeLabels: map[string]string{probeLabel: "x"}},
	}
	switch err := plane.Client.Create(ctx, rf, dryRun); {
	case err == nil:
		validating = false
	case apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
		if !strings.Contains(err.Error(), `admission webhook "vresourceflavor.kb.io" denied the request`) {
			return false, false, fmt.Errorf("dry-run ResourceFlavor refused, but not by kueue's webhook: %w", err)
		}
		validating = true
	default:
		return false, false, fmt.Errorf("dry-run ResourceFlavor: %w", err)
	}
	return mutating, validating, nil
}
