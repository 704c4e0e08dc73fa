package installer_test

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	rcommon "helm.sh/helm/v4/pkg/release/common"
	release "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	jobset "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/components/installer"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// planes: one per scenario, since releases, namespaces and CRDs are cluster-wide.
var planes []*controlplane.ControlPlane

const (
	lifecyclePlane = iota
	brownfieldPlane
)

func TestMain(m *testing.M) {
	controlplane.Main(m, 2, &planes, controlplane.Options{})
}

func newInstaller(t *testing.T, plane *controlplane.ControlPlane) *installer.Installer {
	t.Helper()
	return &installer.Installer{Config: plane.Config, Log: slog.New(slog.NewTextHandler(t.Output(), nil))}
}

// latest is the newest version of c this build installs.
func latest(c components.Component) string {
	vs := components.Installable(c)
	return vs[len(vs)-1]
}

// managedSpec is a fleet's components at this build's versions, with the
// integrations the hub enables.
func managedSpec() components.Spec {
	return components.Spec{
		Managed:    true,
		Kueue:      components.Release{Version: latest(components.Kueue)},
		JobSet:     components.Release{Version: latest(components.JobSet)},
		Frameworks: []string{"batch/job", "jobset.x-k8s.io/jobset"},
	}
}

func statusOf(t *testing.T, rep components.Report, c components.Component) components.Status {
	t.Helper()
	for _, st := range rep.Components {
		if st.Component == c {
			return st
		}
	}
	t.Fatalf("the report has no %s: %+v", c, rep)
	return components.Status{}
}

// wantActions fails unless each component's action is the one given.
func wantActions(t *testing.T, rep components.Report, want map[components.Component]components.Action) {
	t.Helper()
	if len(rep.Components) != len(want) {
		t.Errorf("the report has %d components, want %d: %+v", len(rep.Components), len(want), rep.Components)
	}
	for c, a := range want {
		if st := statusOf(t, rep, c); st.Action != a {
			t.Errorf("%s: %s (%s), want %s", c, st.Action, st.Message, a)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// withoutComponents makes plane a worker without Kueue and JobSet: the control plane
// comes with their CRDs installed, as every other test package wants.
func withoutComponents(t *testing.T, plane *controlplane.ControlPlane) {
	t.Helper()
	ctx := t.Context()
	var list apiextensionsv1.CustomResourceDefinitionList
	if err := plane.Client.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	for _, crd := range list.Items {
		if crd.Spec.Group != "kueue.x-k8s.io" && crd.Spec.Group != "jobset.x-k8s.io" {
			continue
		}
		if err := plane.Client.Delete(ctx, &crd); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		poll.Until(t, "CRD "+crd.Name+" deleted", func() (bool, string) {
			err := plane.Client.Get(ctx, client.ObjectKey{Name: crd.Name}, &apiextensionsv1.CustomResourceDefinition{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
	}
}

// controller is c's controller Deployment, the only Deployment its release makes.
func controller(t *testing.T, plane *controlplane.ControlPlane, c components.Component) *appsv1.Deployment {
	t.Helper()
	var list appsv1.DeploymentList
	if err := plane.Client.List(t.Context(), &list, client.InNamespace(components.Namespace(c))); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 {
		t.Fatalf("%d Deployments in %s, want %s's controller alone", len(list.Items), components.Namespace(c), c)
	}
	return &list.Items[0]
}

// revisions are the revisions of c's release, as `helm history` shows them, with their
// status: Helm keeps each in a Secret labeled owner=helm.
func revisions(t *testing.T, plane *controlplane.ControlPlane, c components.Component) map[string]string {
	t.Helper()
	var list corev1.SecretList
	err := plane.Client.List(t.Context(), &list, client.InNamespace(components.Namespace(c)),
		client.MatchingLabels{"owner": "helm", "name": components.ReleaseName(c)})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range list.Items {
		out[s.Labels["version"]] = s.Labels["status"]
	}
	return out
}

// releaseLabel is the label flotilla's releases carry, read off the newest revision.
func releaseLabel(t *testing.T, plane *controlplane.ControlPlane, c components.Component) string {
	t.Helper()
	rel := helmStore(t, plane, c).lastOrNil(t)
	if rel == nil {
		t.Fatalf("no release of %s", c)
	}
	return rel.Labels[installer.ReleaseLabel]
}

// store reads and writes Helm's records of c's release, as Helm itself does.
type store struct {
	*storage.Storage
	name string
}

func helmStore(t *testing.T, plane *controlplane.ControlPlane, c components.Component) store {
	t.Helper()
	cs, err := kubernetes.NewForConfig(plane.Config)
	if err != nil {
		t.Fatal(err)
	}
	return store{storage.Init(driver.NewSecrets(cs.CoreV1().Secrets(components.Namespace(c)))), components.ReleaseName(c)}
}

func (s store) lastOrNil(t *testing.T) *release.Release {
	t.Helper()
	r, err := s.Last(s.name)
	if errors.Is(err, driver.ErrReleaseNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return r.(*release.Release)
}

// interruptRun leaves a new revision of c's release pending-upgrade since at, the way
// a run killed in the middle of an upgrade leaves it.
func interruptRun(t *testing.T, plane *controlplane.ControlPlane, c components.Component, at time.Time) int {
	t.Helper()
	s := helmStore(t, plane, c)
	last := s.lastOrNil(t)
	next := *last
	info := *last.Info
	next.Info = &info
	next.Version = last.Version + 1
	next.Info.Status = rcommon.StatusPendingUpgrade
	next.Info.Description = "Preparing upgrade"
	next.Info.LastDeployed = at
	if err := s.Create(&next); err != nil {
		t.Fatal(err)
	}
	return next.Version
}

// setPendingSince moves the start of c's pending revision to at.
func setPendingSince(t *testing.T, plane *controlplane.ControlPlane, c components.Component, at time.Time) {
	t.Helper()
	s := helmStore(t, plane, c)
	last := s.lastOrNil(t)
	last.Info.LastDeployed = at
	if err := s.Update(last); err != nil {
		t.Fatal(err)
	}
}

// kueueFrameworks reads the integrations Kueue's manager is configured with, from the
// ConfigMap its Deployment mounts.
func kueueFrameworks(t *testing.T, plane *controlplane.ControlPlane) []string {
	t.Helper()
	var cm corev1.ConfigMap
	key := client.ObjectKey{Namespace: components.Namespace(components.Kueue), Name: "kueue-manager-config"}
	if err := plane.Client.Get(t.Context(), key, &cm); err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Integrations struct {
			Frameworks []string `json:"frameworks"`
		} `json:"integrations"`
		LeaderElection map[string]any `json:"leaderElection"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["controller_manager_config.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.LeaderElection["resourceName"] == nil {
		t.Errorf("Kueue's configuration lost the chart's other settings (leaderElection): %s", cm.Data["controller_manager_config.yaml"])
	}
	return cfg.Integrations.Frameworks
}

// crds are the Kueue and JobSet CRDs on plane by name.
func crds(t *testing.T, plane *controlplane.ControlPlane) map[string]apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	var list apiextensionsv1.CustomResourceDefinitionList
	if err := plane.Client.List(t.Context(), &list); err != nil {
		t.Fatal(err)
	}
	out := map[string]apiextensionsv1.CustomResourceDefinition{}
	for _, crd := range list.Items {
		if crd.Spec.Group == "kueue.x-k8s.io" || crd.Spec.Group == "jobset.x-k8s.io" {
			out[crd.Name] = crd
		}
	}
	return out
}

func crdUIDs(t *testing.T, plane *controlplane.ControlPlane) map[string]types.UID {
	t.Helper()
	out := map[string]types.UID{}
	for name, crd := range crds(t, plane) {
		out[name] = crd.UID
	}
	return out
}

// withoutWebhooks deletes the webhook configurations the charts install. They name the
// components' webhook Services, which nothing serves here (no kubelet runs the
// controllers' pods), and fail closed: while they exist the API server refuses to create
// a ClusterQueue, a Workload, a Job or a JobSet. The tests create those as the users of
// a worker do, so the webhooks go first.
func withoutWebhooks(t *testing.T, plane *controlplane.ControlPlane) {
	t.Helper()
	ctx := t.Context()
	var mutating admissionregistrationv1.MutatingWebhookConfigurationList
	var validating admissionregistrationv1.ValidatingWebhookConfigurationList
	if err := errors.Join(plane.Client.List(ctx, &mutating), plane.Client.List(ctx, &validating)); err != nil {
		t.Fatal(err)
	}
	var objs []client.Object
	for i := range mutating.Items {
		objs = append(objs, &mutating.Items[i])
	}
	for i := range validating.Items {
		objs = append(objs, &validating.Items[i])
	}
	for _, obj := range objs {
		if err := plane.Client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
}

// workloads are what a worker's users run, created before an upgrade to see that it
// keeps them: a ClusterQueue, a Workload, a Job and a JobSet.
type workloads struct {
	objs []client.Object
}

func createWorkloads(t *testing.T, plane *controlplane.ControlPlane, suffix string) workloads {
	t.Helper()
	ns := "team-" + suffix
	if err := plane.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	pod := corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever,
		Containers:    []corev1.Container{{Name: "train", Image: "example.com/train:1"}},
	}}
	w := workloads{objs: []client.Object{
		&kueue.ClusterQueue{ObjectMeta: metav1.ObjectMeta{Name: "gpus-" + suffix}},
		&kueue.Workload{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "train"},
			Spec: kueue.WorkloadSpec{PodSets: []kueue.PodSet{{Name: "main", Count: 1, Template: pod}}}},
		&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "train"}, Spec: batchv1.JobSpec{Template: pod}},
		&jobset.JobSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "train"}, Spec: jobset.JobSetSpec{
			ReplicatedJobs: []jobset.ReplicatedJob{{Name: "workers", Replicas: 1, Template: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: pod}}}},
		}},
	}}
	for _, obj := range w.objs {
		if err := plane.Client.Create(t.Context(), obj); err != nil {
			t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
		}
	}
	return w
}

// wantKept fails unless every object still exists with the UID it was created with.
func (w workloads) wantKept(t *testing.T, plane *controlplane.ControlPlane) {
	t.Helper()
	for _, obj := range w.objs {
		live := obj.DeepCopyObject().(client.Object)
		if err := plane.Client.Get(t.Context(), client.ObjectKeyFromObject(obj), live); err != nil {
			t.Errorf("%T %s: %v", obj, obj.GetName(), err)
			continue
		}
		if live.GetUID() != obj.GetUID() {
			t.Errorf("%T %s has UID %s, was %s: it was replaced", obj, obj.GetName(), live.GetUID(), obj.GetUID())
		}
	}
}

// kubeconfigFile writes plane's admin kubeconfig for a Helm command line of the test's.
func kubeconfigFile(t *testing.T, plane *controlplane.ControlPlane) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, plane.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func has(list []string, s string) bool { return slices.Contains(list, s) }
