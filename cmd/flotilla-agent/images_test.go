package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
	"github.com/flotilla-gitops/flotilla/test/gobuild"
	"github.com/flotilla-gitops/flotilla/test/helmtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
	"github.com/flotilla-gitops/flotilla/test/tunneltest"
)

var (
	kueueDigest  = "sha256:" + strings.Repeat("a1", 32)
	jobsetDigest = "sha256:" + strings.Repeat("b2", 32)
)

// The registries and digests the components' images must have are read from the values
// file, normalized, and refused with the line they are on when malformed.
func TestTheImagePolicyIsReadFromTheValuesFile(t *testing.T) {
	tests := []struct {
		name    string
		values  string // appended to the handover
		want    components.ImagePolicy
		wantErr []string
	}{
		{name: "none: registry.k8s.io alone, no digests"},
		{
			name: "registries normalized and digests as written",
			values: `components:
  allowedRegistries:
    - Mirror.Example.COM:5000/k8s/
    - registry.k8s.io
  requiredDigests:
    "kueue/kueue:v0.17.0": ` + kueueDigest + `
    jobset/jobset:v0.11.1: ` + jobsetDigest + `
`,
			want: components.ImagePolicy{AllowedRegistries: []string{"mirror.example.com:5000/k8s", "registry.k8s.io"},
				RequiredDigests: map[string]string{"kueue/kueue:v0.17.0": kueueDigest, "jobset/jobset:v0.11.1": jobsetDigest}},
		},
		{
			name:   "an empty list is the default, as every empty setting is",
			values: "components:\n  allowedRegistries: []\n  requiredDigests: {}\n",
		},
		{
			name: "every malformed entry is refused with its line",
			values: `components:
  allowedRegistries:
    - https://mirror.example.com
    - "*.example.com"
    - mirror.example.com
    - MIRROR.example.com/
  requiredDigests:
    kueue:v0.17.0: ` + kueueDigest + `
    jobset/jobset:v0.11.1: sha256:abc
`,
			wantErr: []string{
				`values.yaml:12 (components.allowedRegistries): allowed registry "https://mirror.example.com" must be a registry host and optional path, without a scheme`,
				`values.yaml:12 (components.allowedRegistries): allowed registry "*.example.com" has a wildcard; list each registry instead`,
				`values.yaml:12 (components.allowedRegistries): allowed registry "mirror.example.com" is listed twice`,
				`values.yaml:17 (components.requiredDigests): key "kueue:v0.17.0" names no image the installer runs; it runs jobset/jobset:<tag> and kueue/kueue:<tag>`,
				`values.yaml:17 (components.requiredDigests): the digest of jobset/jobset:v0.11.1 is "sha256:abc", not sha256:<64 hex digits>`,
			},
		},
		{
			name:    "a single registry is not a list",
			values:  "components:\n  allowedRegistries: mirror.example.com\n",
			wantErr: []string{"values.yaml:11: components.allowedRegistries must be a list"},
		},
		{
			name:    "digests are a mapping",
			values:  "components:\n  requiredDigests:\n    - " + kueueDigest + "\n",
			wantErr: []string{"values.yaml:12: components.requiredDigests must be a mapping"},
		},
		{
			name:    "a digest is a single value",
			values:  "components:\n  requiredDigests:\n    kueue/kueue:v0.17.0: [" + kueueDigest + "]\n",
			wantErr: []string{"values.yaml:12: components.requiredDigests must be a mapping of single values"},
		},
		{
			name:    "a key given twice",
			values:  "components:\n  requiredDigests:\n    kueue/kueue:v0.17.0: " + kueueDigest + "\n    kueue/kueue:v0.17.0: " + kueueDigest + "\n",
			wantErr: []string{`values.yaml:13: components.requiredDigests lists "kueue/kueue:v0.17.0" twice`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, _, stderr, code := invoke(t, nil, "--values", writeFile(t, t.TempDir(), "values.yaml", handover+tt.values))
			if len(tt.wantErr) > 0 {
				if code == 0 {
					t.Fatalf("accepted: %+v", cfg.Images)
				}
				for _, want := range tt.wantErr {
					if !strings.Contains(stderr, want) {
						t.Errorf("the error does not say\n%s\nit says\n%s", want, stderr)
					}
				}
				return
			}
			if code != 0 {
				t.Fatal(stderr)
			}
			if diff := cmp.Diff(tt.want, cfg.Images); diff != "" {
				t.Errorf("the policy (-want +got):\n%s", diff)
			}
		})
	}
}

// The chart hands components.allowedRegistries and components.requiredDigests to the
// agent in its ConfigMap, and its schema refuses what the agent would.
func TestChartHandsTheImagePolicyToTheAgent(t *testing.T) {
	agentSettings := func(t *testing.T, components map[string]any) *config {
		t.Helper()
		vals := handoverValues()
		if components != nil {
			vals["components"] = components
		}
		objs := helmtest.MustRender(t, chartDir, helmtest.Options{Release: "flotilla-agent", Namespace: agentNamespace, Values: vals})
		cms := objs.FromTemplate("configmap.yaml")
		if len(cms) != 1 {
			t.Fatalf("templates/configmap.yaml renders %d objects", len(cms))
		}
		settings := helmtest.Typed[corev1.ConfigMap](t, cms[0]).Data["values.yaml"]
		cfg, _, stderr, code := invoke(t, nil, "--values", writeFile(t, t.TempDir(), "values.yaml", settings))
		if code != 0 {
			t.Fatalf("the agent refuses the chart's settings:\n%s\n%s", settings, stderr)
		}
		return cfg
	}

	t.Run("by default registry.k8s.io alone", func(t *testing.T) {
		if got := agentSettings(t, nil).Images; !cmp.Equal(got.Registries(), []string{components.DefaultRegistry}) || len(got.RequiredDigests) != 0 {
			t.Errorf("the agent's policy is %+v, want registry.k8s.io alone and no digests", got)
		}
	})
	t.Run("as the administrator sets them", func(t *testing.T) {
		got := agentSettings(t, map[string]any{
			"allowedRegistries": []any{"mirror.example.com/k8s", "registry.k8s.io"},
			"requiredDigests":   map[string]any{"kueue/kueue:v0.17.0": kueueDigest},
		}).Images
		want := components.ImagePolicy{AllowedRegistries: []string{"mirror.example.com/k8s", "registry.k8s.io"}, RequiredDigests: map[string]string{"kueue/kueue:v0.17.0": kueueDigest}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("the agent's policy (-want +got):\n%s", diff)
		}
	})

	for _, tt := range []struct {
		name       string
		components map[string]any
		want       string // in the schema's error
	}{
		{"a registry with a scheme", map[string]any{"allowedRegistries": []any{"https://mirror.example.com"}}, "allowedRegistries/0"},
		{"a wildcard", map[string]any{"allowedRegistries": []any{"*.example.com"}}, "allowedRegistries/0"},
		{"a registry with a tag", map[string]any{"allowedRegistries": []any{"registry.k8s.io", "mirror.example.com/k8s:latest"}}, "allowedRegistries/1"},
		{"no registry at all", map[string]any{"allowedRegistries": []any{}}, "allowedRegistries"},
		{"a registry that is not a string", map[string]any{"allowedRegistries": "registry.k8s.io"}, "allowedRegistries"},
		{"a digest keyed by something the installer does not run", map[string]any{"requiredDigests": map[string]any{"kueue:v0.17.0": kueueDigest}}, "'kueue:v0.17.0' does not match pattern"},
		{"a digest that is not one", map[string]any{"requiredDigests": map[string]any{"kueue/kueue:v0.17.0": "latest"}}, "requiredDigests"},
	} {
		t.Run("the schema refuses "+tt.name, func(t *testing.T) {
			vals := handoverValues()
			vals["components"] = tt.components
			_, err := helmtest.Render(chartDir, helmtest.Options{Release: "flotilla-agent", Namespace: agentNamespace, Values: vals})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("rendering with components %v: %v, want the schema to refuse %s", tt.components, err, tt.want)
			}
		})
	}
}

// A worker whose administrator left components.allowedRegistries at registry.k8s.io gets a
// desired state whose components come from a mirror: the agent, as main builds it from
// the chart's ConfigMap, with the real installer beside it, installs nothing and applies
// nothing, and the hub's WorkerCluster says which registry was refused and who allows
// it, as does the commit. The worker and the hub share one control plane of their own,
// without Kueue's and JobSet's CRDs, so that anything installed would show. The agent,
// and its installer with it, act as the plane's administrator: what they may do is
// another test's; what they choose not to do is this one's.
func TestAWorkerInstallsNothingFromARegistryItsAdministratorDidNotAllow(t *testing.T) {
	plane := startWorkerWithoutComponents(t)
	ctx := t.Context()
	admin := plane.Client
	installer := (&gobuild.Cache{Dir: plane.Dir()}).Binary(t, components.BinaryName)

	// The hub's side: the WorkerCluster, its tunnel, and the state Git asks for.
	tok, err := secrets.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKey{Namespace: "tenant-acme", Name: "gpu-a"}
	for _, ns := range []string{key.Namespace, agentNamespace} {
		if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	wc := &v1alpha1.WorkerCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, Labels: map[string]string{v1alpha1.WorkerClusterLabel: agentIdentity}},
		Spec:       v1alpha1.WorkerClusterSpec{Region: "europe-west4", Residency: "eu", Preset: "gpu", EnrollmentTokenHash: tok.Hash().String()},
	}
	if err := admin.Create(ctx, wc); err != nil {
		t.Fatal(err)
	}
	srv, err := tunnel.New(tunnel.Options{Client: admin, AllowInsecureLoopback: true, Log: slog.New(slog.NewTextHandler(t.Output(), nil)).With("side", "hub")})
	if err != nil {
		t.Fatal(err)
	}
	hubURL := tunneltest.Serve(t, srv)

	const workloads = "ml-training"
	ns, err := json.Marshal(&corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: workloads, Labels: map[string]string{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue, v1alpha1.WorkerClusterLabel: agentIdentity}}})
	if err != nil {
		t.Fatal(err)
	}
	state := &protocol.DesiredState{Generation: wc.Generation, Hash: "sha256:" + strings.Repeat("c3", 32), Objects: []json.RawMessage{ns},
		Components: &components.Spec{Managed: true, Registry: "mirror.example",
			Kueue: components.Release{Version: "v0.17.0"}, JobSet: components.Release{Version: "v0.11.1"}, Frameworks: []string{"batch/job", "jobset.x-k8s.io/jobset"}}}
	srv.Push(key, agentIdentity, state)

	// The worker's side: the agent with the settings the chart hands it, defaults and all.
	objs := helmtest.MustRender(t, chartDir, helmtest.Options{Release: "flotilla-agent", Namespace: agentNamespace, Values: handoverValues()})
	settings := helmtest.Typed[corev1.ConfigMap](t, objs.FromTemplate("configmap.yaml")[0]).Data["values.yaml"]
	kc, err := components.KubeConfigFor(plane.Config)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg, _, stderr, code := invoke(t, nil, "--values", writeFile(t, dir, "values.yaml", settings), "--kubeconfig", writeFile(t, dir, "kubeconfig", string(kc)),
		"--hub-url", hubURL, "--allow-insecure-loopback", "--namespace", agentNamespace, "--heartbeat", "1s",
		"--components-binary", installer, "--components-service-account=", "--dispatch=false")
	if code != 0 {
		t.Fatal(stderr)
	}
	cfg.EnrollmentToken = protocol.Secret(tok.Reveal())
	a, err := newAgent(ctx, cfg, slog.New(slog.NewTextHandler(t.Output(), nil)).With("side", "agent"), func(string) string { return "" })
	if err != nil {
		t.Fatalf("newAgent: %v", err)
	}
	actx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- a.Run(actx) }()
	t.Cleanup(func() { stop(); <-ran })

	const refusal = `registry "mirror.example" is not among the registries this worker allows (components.allowedRegistries in the agent's Helm values: registry.k8s.io); its administrator adds it there`
	var configured *metav1.Condition
	poll.Until(t, "WorkerConfigured to say the registry was refused", func() (bool, string) {
		got := &v1alpha1.WorkerCluster{}
		if err := admin.Get(ctx, key, got); err != nil {
			return false, err.Error()
		}
		wc, configured = got, meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionWorkerConfigured)
		if configured == nil {
			return false, "no WorkerConfigured yet"
		}
		return configured.Reason == v1alpha1.ReasonRegistryNotAllowed, fmt.Sprintf("%s %s: %s", configured.Status, configured.Reason, configured.Message)
	})
	if want := "jobset v0.11.1: " + refusal; configured.Status != metav1.ConditionFalse || configured.Message != want {
		t.Errorf("WorkerConfigured is %s: %q, want False: %q", configured.Status, configured.Message, want)
	}
	for _, s := range wc.Status.Components {
		if s.Ready || s.Message != refusal {
			t.Errorf("status.components: %+v, want not ready, saying %q", s, refusal)
		}
	}
	if st := conditions.CommitStatus("flotilla/gpu-a", wc); st.State != commitstatus.Failure || st.Description != configured.Message {
		t.Errorf("the commit's status is %s %q, want a failure saying what WorkerConfigured says", st.State, st.Description)
	}

	// Nothing of the components, nor of the state that needs them.
	for _, name := range []string{components.Namespace(components.Kueue), components.Namespace(components.JobSet), workloads} {
		if err := admin.Get(ctx, client.ObjectKey{Name: name}, &corev1.Namespace{}); !apierrors.IsNotFound(err) {
			t.Errorf("namespace %s: %v, want none", name, err)
		}
	}
	var crds apiextensionsv1.CustomResourceDefinitionList
	if err := admin.List(ctx, &crds); err != nil {
		t.Fatal(err)
	}
	for _, crd := range crds.Items {
		if g := crd.Spec.Group; g == "kueue.x-k8s.io" || g == "jobset.x-k8s.io" {
			t.Errorf("CRD %s was installed", crd.Name)
		}
	}
	var releases corev1.SecretList
	if err := admin.List(ctx, &releases, client.MatchingLabels{"owner": "helm"}); err != nil {
		t.Fatal(err)
	}
	for _, r := range releases.Items {
		t.Errorf("Helm release record %s/%s was written", r.Namespace, r.Name)
	}
}
