package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/agent"
	"github.com/flotilla-gitops/flotilla/agent/apply"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// The reset tests' worker: its own identity, agent namespace and object names, so that
// they share the package's plane with the other tests without touching their objects.
const (
	resetIdentity   = "5-reset-gpu-r"
	resetNamespace  = "flotilla-reset"
	resetSecret     = "reset-agent-credential"
	resetCredential = "flt-credential-that-must-never-show"
	resetRelease    = "agent-r"
	resetCustomer   = "customer-r" // every customer object's name starts with it
	resetReader     = "reset-reader"
)

// resetValues is the values file `flotilla cluster add` hands over, with the agent's
// namespace and Secret of these tests.
const resetValues = `hub:
  url: wss://hub.example.com/
cluster:
  tenant: reset
  name: gpu-r
  identity: ` + resetIdentity + `
enrollment:
  token: ` + token + `
agent:
  namespace: ` + resetNamespace + `
  credentialSecret: ` + resetSecret + `
`

// resetWorld seeds the plane with what an agent of resetIdentity applied and stored,
// and with what is not the agent's to remove; it returns the lines a plan must list.
func resetWorld(t *testing.T) (wantRemoved []string) {
	t.Helper()
	ctx := t.Context()
	admin := planes[0].Client
	ensureNamespace(t, resetNamespace)
	ensureNamespace(t, resetCustomer)

	labels := map[string]string{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue, v1alpha1.WorkerClusterLabel: resetIdentity}
	obj := func(kind, namespace, name string, annotations map[string]string, fields map[string]any) json.RawMessage {
		meta := map[string]any{"name": name, "labels": labels}
		if namespace != "" {
			meta["namespace"] = namespace
		}
		if annotations != nil {
			meta["annotations"] = annotations
		}
		o := map[string]any{"apiVersion": kueue.GroupVersion.String(), "kind": kind, "metadata": meta}
		if kind == "Namespace" {
			o["apiVersion"] = "v1"
		}
		maps.Copy(o, fields)
		raw, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	keep := map[string]string{v1alpha1.PruneAnnotation: v1alpha1.PruneDisabled}
	state := protocol.DesiredState{Generation: 1, Hash: "reset-1", Objects: []json.RawMessage{
		obj("Namespace", "", "reset-team", map[string]string{v1alpha1.ApplyAnnotation: v1alpha1.ApplyIfNotPresent, v1alpha1.PruneAnnotation: v1alpha1.PruneDisabled}, nil),
		obj("ResourceFlavor", "", "reset-flavor", nil, map[string]any{"spec": map[string]any{}}),
		obj("WorkloadPriorityClass", "", "reset-kept", keep, map[string]any{"value": 10}),
		obj("ClusterQueue", "", "reset-queue", nil, map[string]any{"spec": map[string]any{"namespaceSelector": map[string]any{}, "resourceGroups": []any{map[string]any{
			"coveredResources": []string{"nvidia.com/gpu"},
			"flavors":          []any{map[string]any{"name": "reset-flavor", "resources": []any{map[string]any{"name": "nvidia.com/gpu", "nominalQuota": "8"}}}},
		}}}}),
		obj("LocalQueue", "reset-team", "reset-user-queue", nil, map[string]any{"spec": map[string]any{"clusterQueue": "reset-queue"}}),
	}}
	applier, err := apply.New(apply.Options{Client: admin, Identity: resetIdentity, FieldManager: agent.FieldManager})
	if err != nil {
		t.Fatal(err)
	}
	if a := applier.Apply(ctx, state); !a.Complete() {
		t.Fatalf("seeding the agent's objects: %+v", a)
	}
	// The credential as the agent stores it.
	sec := corev1ac.Secret(resetSecret, resetNamespace).
		WithLabels(map[string]string{agentNameLabel: agentNameValue}).
		WithType(corev1.SecretTypeOpaque).
		WithData(map[string][]byte{agent.CredentialKey: []byte(resetCredential)})
	if err := admin.Apply(ctx, sec, client.FieldOwner(agent.FieldManager), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
	// The chart's Deployment, scaled to zero as reset wants it.
	sel := map[string]string{agentNameLabel: agentNameValue, instanceLabel: resetRelease}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: resetNamespace, Name: resetRelease, Labels: sel,
			Annotations: map[string]string{helmReleaseName: resetRelease, helmReleaseNS: resetNamespace}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](0),
			Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: sel},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "registry.example/flotilla-agent:1"}}},
			},
		},
	}

	// The customer's: a ClusterQueue nobody labelled, a Job and its Workload, another
	// Secret beside the credential, and another worker's flavor.
	customerQueue := &kueue.ClusterQueue{ObjectMeta: metav1.ObjectMeta{Name: resetCustomer + "-queue"}}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: resetCustomer, Name: resetCustomer + "-train"},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "main", Image: "registry.example/train:1"}},
		}}},
	}
	workload := &kueue.Workload{
		ObjectMeta: metav1.ObjectMeta{Namespace: resetCustomer, Name: resetCustomer + "-train-wl"},
		Spec: kueue.WorkloadSpec{PodSets: []kueue.PodSet{{Name: kueue.DefaultPodSetName, Count: 1, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "main", Image: "registry.example/train:1"}},
		}}}}},
	}
	otherSecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: resetNamespace, Name: resetCustomer + "-pull-secret"}}
	otherWorker := &kueue.ResourceFlavor{ObjectMeta: metav1.ObjectMeta{Name: resetCustomer + "-other-worker",
		Labels: map[string]string{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue, v1alpha1.WorkerClusterLabel: "5-other-gpu-r"}}}
	for _, o := range []client.Object{dep, customerQueue, job, workload, otherSecret, otherWorker} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
	return []string{
		"LocalQueue reset-team/reset-user-queue",
		"ClusterQueue reset-queue",
		"ResourceFlavor reset-flavor",
		"Secret " + resetNamespace + "/" + resetSecret,
	}
}

// snapshot is every object of the kinds a reset could reach, by kind and name, with
// what changes when it is written or deleted.
func snapshot(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, gvk := range append(v1alpha1.WorkerKinds(),
		schema.GroupVersionKind{Group: "batch", Version: "v1", Kind: "Job"},
		kueue.GroupVersion.WithKind("Workload"),
		corev1.SchemeGroupVersion.WithKind("Secret"),
		schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"},
	) {
		var list metav1.PartialObjectMetadataList
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := planes[0].Client.List(t.Context(), &list); err != nil {
			t.Fatalf("listing %s: %v", gvk.Kind, err)
		}
		for _, o := range list.Items {
			out[gvk.Kind+" "+o.Namespace+"/"+o.Name] = fmt.Sprintf("uid=%s rv=%s deleting=%t", o.UID, o.ResourceVersion, o.DeletionTimestamp != nil)
		}
	}
	return out
}

// items returns the "  - " lines under the headings that start with prefix, each
// without a parenthesized note.
func items(out, prefix string) []string {
	var got []string
	in := false
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, " ") {
			in = strings.HasPrefix(line, prefix)
			continue
		}
		if item, ok := strings.CutPrefix(line, "  - "); ok && in {
			item, _, _ = strings.Cut(item, " (")
			got = append(got, item)
		}
	}
	return got
}

func writeKubeconfig(t *testing.T, impersonate string) string {
	t.Helper()
	kc, err := clientcmd.Load(planes[0].KubeConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		ai.Impersonate = impersonate
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// grantReadOnly lets resetReader read everything and delete nothing, once the
// authorizer knows it.
func grantReadOnly(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	admin := planes[0].Client
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: resetReader},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}}}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: resetReader},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: resetReader},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: resetReader}}}
	for _, o := range []client.Object{role, binding} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, "the reader may list ClusterQueues", func() (bool, string) {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: resetReader,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Group: kueue.GroupVersion.Group, Resource: "clusterqueues", Verb: "list"}}}
		if err := admin.Create(ctx, review); err != nil {
			return false, err.Error()
		}
		return review.Status.Allowed, review.Status.Reason
	})
}

func setAgentReplicas(t *testing.T, n int32) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, n)
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: resetNamespace, Name: resetRelease}}
	if err := planes[0].Client.Patch(t.Context(), dep, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		t.Fatal(err)
	}
}

func resetCmd(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(t.Context(), append([]string{"reset"}, args...), &out, &errOut, func(string) string { return "" },
		func(context.Context, *config) error { t.Error("reset started the agent"); return nil })
	for _, secret := range []string{token, resetCredential} {
		if strings.Contains(out.String()+errOut.String(), secret) {
			t.Errorf("reset %v printed a secret:\n%s\n%s", args, out.String(), errOut.String())
		}
	}
	return out.String(), errOut.String(), code
}

// TestResetRemovesExactlyWhatItsDryRunListed seeds what an agent applied and stored
// beside a customer's objects, then: the dry run lists the agent's objects and
// credential and changes nothing; a reset that must not run (the agent runs, the user
// may not delete, the installer is missing) removes nothing; the reset removes exactly
// what the dry run listed, leaves the customer's objects and the namespaces, and says
// that enrolling again needs a new token.
func TestResetRemovesExactlyWhatItsDryRunListed(t *testing.T) {
	wantRemoved := resetWorld(t)
	dir := t.TempDir()
	values := writeFile(t, dir, "values.gpu-r.local.yaml", resetValues)
	kubeconfig := writeKubeconfig(t, "")
	base := []string{"--values", values, "--kubeconfig", kubeconfig}
	before := snapshot(t)

	out, stderr, code := resetCmd(t, append(base, "--dry-run")...)
	if code != 0 {
		t.Fatalf("reset --dry-run: exit %d\n%s\n%s", code, out, stderr)
	}
	planned := items(out, "Will remove")
	if !slices.Equal(planned, wantRemoved) {
		t.Errorf("the dry run plans to remove\n  %s\nwant, in this order,\n  %s\n%s", strings.Join(planned, "\n  "), strings.Join(wantRemoved, "\n  "), out)
	}
	left := strings.Join(items(out, "Will leave alone"), "\n")
	for _, want := range []string{
		"Namespace reset-team",
		"WorkloadPriorityClass reset-kept",
		"helm uninstall " + resetRelease + " --namespace " + resetNamespace,
		"removed only with --components",
	} {
		if !strings.Contains(left, want) {
			t.Errorf("the plan does not say it leaves %q alone:\n%s", want, out)
		}
	}
	if strings.Contains(out, resetCustomer) {
		t.Errorf("the plan names a customer's object:\n%s", out)
	}
	if !strings.Contains(out, "Dry run: nothing was changed.") {
		t.Errorf("the dry run does not say it changed nothing:\n%s", out)
	}
	if after := snapshot(t); !maps.Equal(after, before) {
		t.Fatalf("the dry run changed the cluster:\n%s", diff(before, after))
	}

	grantReadOnly(t)
	refusals := []struct {
		name      string
		args      []string
		setup     func()
		teardown  func()
		wantError string
	}{
		{
			name:      "the agent still runs",
			args:      base,
			setup:     func() { setAgentReplicas(t, 1) },
			teardown:  func() { setAgentReplicas(t, 0) },
			wantError: "the agent still runs (Deployment " + resetNamespace + "/" + resetRelease + "); nothing was removed",
		},
		{
			name:      "the user may not delete",
			args:      []string{"--values", values, "--kubeconfig", writeKubeconfig(t, resetReader)},
			wantError: "may not delete LocalQueue reset-team/reset-user-queue, ClusterQueue reset-queue, ResourceFlavor reset-flavor, Secret " + resetNamespace + "/" + resetSecret + "; nothing was removed",
		},
		{
			name:      "the installer is missing",
			args:      append(slices.Clone(base), "--components", "--components-binary", filepath.Join(dir, "no-such-installer")),
			wantError: "the installer of Kueue and JobSet is missing",
		},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
			}
			if tc.teardown != nil {
				defer tc.teardown()
			}
			settled := snapshot(t)
			out, stderr, code := resetCmd(t, tc.args...)
			if code == 0 || !strings.Contains(stderr, tc.wantError) {
				t.Errorf("exit %d, stderr %q; want an error containing %q\n%s", code, stderr, tc.wantError, out)
			}
			if after := snapshot(t); !maps.Equal(after, settled) {
				t.Errorf("a refused reset changed the cluster:\n%s", diff(settled, after))
			}
		})
	}

	settled := snapshot(t)
	out, stderr, code = resetCmd(t, base...)
	if code != 0 {
		t.Fatalf("reset: exit %d\n%s\n%s", code, out, stderr)
	}
	if removed := items(out, "Removed"); !slices.Equal(removed, planned) {
		t.Errorf("reset removed\n  %s\nthe dry run listed\n  %s\n%s", strings.Join(removed, "\n  "), strings.Join(planned, "\n  "), out)
	}
	after := snapshot(t)
	for key, was := range settled {
		kind, name, _ := strings.Cut(key, " ")
		name = strings.TrimPrefix(name, "/")
		gone := slices.Contains(wantRemoved, kind+" "+name)
		if _, ok := after[key]; ok == gone {
			t.Errorf("%s: present after the reset %t, want %t", key, ok, !gone)
		} else if ok && after[key] != was {
			t.Errorf("%s changed: %s, was %s", key, after[key], was)
		}
	}
	for _, want := range []string{
		"needs a NEW enrollment token",
		"flotilla cluster rotate-token gpu-r",
		"helm uninstall " + resetRelease + " --namespace " + resetNamespace,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the reset's output does not say %q:\n%s", want, out)
		}
	}

	// Nothing is left to remove, and a second reset says so.
	out, stderr, code = resetCmd(t, base...)
	if code != 0 || len(items(out, "Will remove")) != 0 || !strings.Contains(out, "Removed: none") {
		t.Errorf("a second reset: exit %d, want nothing to remove\n%s\n%s", code, out, stderr)
	}
}

// TestResetReadsTheAgentsSettings: reset takes the agent's values file and flags, and
// needs neither the hub's address nor the token, which it never reads.
func TestResetReadsTheAgentsSettings(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := writeKubeconfig(t, "")
	tests := []struct {
		name      string
		values    string
		args      []string
		wantCode  int
		wantOut   string
		wantError string
	}{
		{
			name:     "a values file with only the identity",
			values:   "cluster:\n  identity: 9-nobody-gpu-z\n",
			wantOut:  "Reset of worker cluster 9-nobody-gpu-z (agent namespace " + defaultNamespace + "); dry run",
			wantCode: 0,
		},
		{
			name:     "flags override the values file",
			values:   resetValues,
			args:     []string{"--identity", "9-nobody-gpu-z", "--namespace", "elsewhere"},
			wantOut:  "Reset of worker cluster 9-nobody-gpu-z (agent namespace elsewhere); dry run",
			wantCode: 0,
		},
		{
			name:      "no identity",
			values:    "hub:\n  url: wss://hub.example.com/\n",
			wantCode:  1,
			wantError: "cluster.identity is required",
		},
		{
			name:      "a namespace that cannot be one",
			values:    resetValues,
			args:      []string{"--namespace", "Not_A_Namespace"},
			wantCode:  1,
			wantError: `--namespace: namespace "Not_A_Namespace" is not a namespace name`,
		},
		{
			name:      "a misspelt setting, in a file holding the token",
			values:    resetValues + "  credentialSecrets: x\n",
			wantCode:  1,
			wantError: `unknown setting "credentialSecrets"`,
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			values := writeFile(t, dir, fmt.Sprintf("values-%d.yaml", i), tc.values)
			out, stderr, code := resetCmd(t, append([]string{"--dry-run", "--values", values, "--kubeconfig", kubeconfig}, tc.args...)...)
			if code != tc.wantCode || !strings.Contains(out, tc.wantOut) || !strings.Contains(stderr, tc.wantError) {
				t.Errorf("exit %d, want %d; stdout want %q:\n%s\nstderr want %q:\n%s", code, tc.wantCode, tc.wantOut, out, tc.wantError, stderr)
			}
		})
	}
}

func diff(before, after map[string]string) string {
	var b strings.Builder
	for k, v := range before {
		if after[k] != v {
			fmt.Fprintf(&b, "  %s: %s -> %q\n", k, v, after[k])
		}
	}
	for k, v := range after {
		if _, ok := before[k]; !ok {
			fmt.Fprintf(&b, "  %s: new, %s\n", k, v)
		}
	}
	return b.String()
}
