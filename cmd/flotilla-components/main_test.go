package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/kueuetest"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	// A fresh worker: Kueue's and JobSet's CRDs come with their charts.
	controlplane.Main(m, 1, &planes, controlplane.Options{WithoutComponentCRDs: true})
}

// The binary as the agent runs it: a request with a token kubeconfig on standard input,
// a registry mirror and digests; a report alone on standard output, JSON log lines on
// standard error, and the token in neither.
func TestTheBinaryInstallsWhatTheRequestAsksAndReportsOnStdout(t *testing.T) {
	plane := planes[0]
	bin := buildBinary(t)
	kubeconfig, token := tokenKubeConfig(t)
	spec := components.Spec{
		Managed:    true,
		Registry:   "mirror.example.com:5000/k8s",
		Kueue:      components.Release{Version: "v0.17.0", Digest: "sha256:" + strings.Repeat("a1", 32)},
		JobSet:     components.Release{Version: "v0.11.1", Digest: "sha256:" + strings.Repeat("b2", 32)},
		Frameworks: []string{"batch/job", "jobset.x-k8s.io/jobset"},
	}
	// The worker's administrator allows the mirror, and requires Kueue's digest.
	images := components.ImagePolicy{AllowedRegistries: []string{"mirror.example.com:5000/k8s"}, RequiredDigests: map[string]string{"kueue/kueue:v0.17.0": spec.Kueue.Digest}}
	req := components.Request{Spec: spec, Images: images, KubeConfig: kubeconfig}

	for _, tc := range []struct {
		name string
		args []string
		want components.Action
	}{
		{"fresh install", []string{"apply"}, components.ActionInstalled},
		{"unchanged apply", []string{"apply"}, components.ActionUnchanged},
	} {
		rep := runBinary(t, bin, tc.name, req, token, tc.args...)
		for _, c := range components.All() {
			st := statusOf(t, rep, c)
			if st.Action != tc.want || st.Version != spec.Release(c).Version {
				t.Fatalf("%s: %s %s: %s (%s), want %s", tc.name, c, st.Version, st.Action, st.Message, tc.want)
			}
		}
	}
	for _, c := range components.All() {
		var deps appsv1.DeploymentList
		if err := plane.Client.List(t.Context(), &deps, client.InNamespace(components.Namespace(c))); err != nil {
			t.Fatal(err)
		}
		want := "mirror.example.com:5000/k8s/" + string(c) + "/" + string(c) + ":" + spec.Release(c).Version + "@" + spec.Release(c).Digest
		if len(deps.Items) != 1 || deps.Items[0].Spec.Template.Spec.Containers[0].Image != want || want != spec.Image(c) {
			t.Errorf("%s's Deployments %+v, want one running %s", c, deps.Items, want)
		}
	}

	rep := runBinary(t, bin, "uninstall dry run", req, token, "uninstall", "--dry-run")
	for _, want := range []string{"Helm release kueue-system/kueue", "Deployment kueue-system/kueue-controller-manager", "Helm release jobset-system/jobset"} {
		if !slices.Contains(rep.Removed, want) {
			t.Errorf("the dry run does not list %q: %v", want, rep.Removed)
		}
	}
	var dep appsv1.Deployment
	if err := plane.Client.Get(t.Context(), client.ObjectKey{Namespace: "kueue-system", Name: "kueue-controller-manager"}, &dep); err != nil {
		t.Errorf("after the dry run: %v", err)
	}
}

// The binary checks the images of its request against the worker's policy in the same
// request again, and installs nothing outside it: not a release, not a CRD, not a
// namespace. It reports each component refused, which is a report, not a failure.
func TestTheBinaryInstallsNothingItsRequestsPolicyRefuses(t *testing.T) {
	plane := planes[0]
	bin := buildBinary(t)
	kubeconfig, token := tokenKubeConfig(t)
	spec := components.Spec{
		Managed:  true,
		Registry: "mirror.example.com:5000/k8s",
		Kueue:    components.Release{Version: "v0.17.0"},
		JobSet:   components.Release{Version: "v0.11.1"},
	}
	for _, tc := range []struct {
		name   string
		images components.ImagePolicy
		reason string
	}{
		{"no policy: registry.k8s.io alone", components.ImagePolicy{}, components.ReasonRegistryNotAllowed},
		{"the host without the port", components.ImagePolicy{AllowedRegistries: []string{"mirror.example.com"}}, components.ReasonRegistryNotAllowed},
		{"the mirror without the digest required", components.ImagePolicy{AllowedRegistries: []string{"mirror.example.com:5000"},
			RequiredDigests: map[string]string{"jobset/jobset:v0.11.1": "sha256:" + strings.Repeat("b2", 32)}}, components.ReasonDigestNotAllowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := installed(t, plane)
			rep := runBinary(t, bin, tc.name, components.Request{Spec: spec, Images: tc.images, KubeConfig: kubeconfig}, token, "apply")
			for _, c := range components.All() {
				if st := statusOf(t, rep, c); st.Action != components.ActionRefused || st.Reason != tc.reason || st.Ready || !strings.Contains(st.Message, "agent's Helm values") {
					t.Errorf("%s: %+v, want refused for %s, saying which value allows it", c, st, tc.reason)
				}
			}
			if after := installed(t, plane); !slices.Equal(after, before) {
				t.Errorf("the worker changed: %v, was %v", after, before)
			}
		})
	}
}

// installed lists what an install writes on plane: Helm's release records, the
// components' namespaces and their CRDs, each with its resourceVersion.
func installed(t *testing.T, plane *controlplane.ControlPlane) []string {
	t.Helper()
	var out []string
	var releases corev1.SecretList
	if err := plane.Client.List(t.Context(), &releases, client.MatchingLabels{"owner": "helm"}); err != nil {
		t.Fatal(err)
	}
	for _, r := range releases.Items {
		out = append(out, "Secret "+r.Namespace+"/"+r.Name+"@"+r.ResourceVersion)
	}
	var namespaces corev1.NamespaceList
	if err := plane.Client.List(t.Context(), &namespaces); err != nil {
		t.Fatal(err)
	}
	for _, ns := range namespaces.Items {
		if ns.Name == components.Namespace(components.Kueue) || ns.Name == components.Namespace(components.JobSet) {
			out = append(out, "Namespace "+ns.Name+"@"+ns.ResourceVersion)
		}
	}
	var crds apiextensionsv1.CustomResourceDefinitionList
	if err := plane.Client.List(t.Context(), &crds); err != nil {
		t.Fatal(err)
	}
	for _, crd := range crds.Items {
		if g := crd.Spec.Group; g == "kueue.x-k8s.io" || g == "jobset.x-k8s.io" {
			out = append(out, "CRD "+crd.Name+"@"+crd.ResourceVersion)
		}
	}
	slices.Sort(out)
	return out
}

// A request the binary cannot act on is an exit status of 1, nothing on standard output,
// and a log line that says why without quoting what was sent.
func TestABadRequestIsAFailureThatQuotesNoCredential(t *testing.T) {
	const secret = "tok3n-that-must-not-leak"
	for _, tc := range []struct {
		name  string
		args  []string
		stdin string
		env   map[string]string
		why   string
	}{
		{"not JSON", []string{"apply"}, "kubeconfig: " + secret, nil, "the request is not a components.Request in JSON"},
		{"a kubeconfig that is not one", []string{"apply"},
			string(mustJSON(t, components.Request{KubeConfig: []byte("users:\n- name: x\n  user: [token: " + secret + "]\n")})), nil,
			"the request's kubeconfig is not a kubeconfig"},
		{"no kubeconfig anywhere", []string{"uninstall"}, "{}", nil, "$KUBECONFIG is not set"},
		{"an unknown log level", []string{"apply", "--log-level", "loud"}, "{}", nil, "--log-level"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			getenv := func(k string) string { return tc.env[k] }
			code := run(t.Context(), tc.args, strings.NewReader(tc.stdin), &stdout, &stderr, getenv)
			if code != 1 {
				t.Errorf("exit status %d, want 1", code)
			}
			if stdout.Len() != 0 {
				t.Errorf("standard output: %q, want nothing", stdout.String())
			}
			if !strings.Contains(stderr.String(), tc.why) {
				t.Errorf("standard error %q does not say %q", stderr.String(), tc.why)
			}
			if strings.Contains(stderr.String(), secret) {
				t.Errorf("standard error quotes the request's credential: %s", stderr.String())
			}
		})
	}
}

func TestVersionNamesTheBinary(t *testing.T) {
	var stdout bytes.Buffer
	if code := run(t.Context(), []string{"--version"}, strings.NewReader(""), &stdout, &bytes.Buffer{}, func(string) string { return "" }); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	if !strings.HasPrefix(stdout.String(), components.BinaryName+" ") {
		t.Errorf("--version printed %q", stdout.String())
	}
}

// buildBinary builds this command without the race detector the test itself runs
// under, as the release does.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), components.BinaryName)
	out, err := exec.CommandContext(t.Context(), "go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// runBinary runs bin with req on standard input, checks what it wrote where, and
// returns its report. It logs how long the run took.
func runBinary(t *testing.T, bin, what string, req components.Request, token string, args ...string) components.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), poll.Deadline*4)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdin = bytes.NewReader(mustJSON(t, req))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	began := time.Now()
	err := cmd.Run()
	took := time.Since(began)
	if err != nil {
		t.Fatalf("%s: %v\n%s", what, err, stderr.String())
	}
	t.Logf("%s took %v", what, took.Round(time.Millisecond))
	for name, out := range map[string]string{"standard output": stdout.String(), "standard error": stderr.String()} {
		if strings.Contains(out, token) {
			t.Errorf("%s: %s holds the kubeconfig's token", what, name)
		}
	}
	sc := bufio.NewScanner(&stderr)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if !json.Valid(sc.Bytes()) {
			t.Errorf("%s: a log line that is not JSON: %s", what, sc.Text())
		}
	}
	var rep components.Report
	dec := json.NewDecoder(&stdout)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("%s: standard output is not a report: %v", what, err)
	}
	if dec.More() {
		t.Errorf("%s: standard output holds more than the report", what)
	}
	return rep
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

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// tokenKubeConfig is a kubeconfig of the plane with an inline token, as the agent hands
// the installer, and that token, which must never show in the installer's output.
func tokenKubeConfig(t *testing.T) (kubeconfig []byte, token string) {
	t.Helper()
	kubeconfig, err := kueuetest.TokenKubeConfig(t.Context(), planes[0], "components-installer")
	if err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.Load(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return kubeconfig, kc.AuthInfos[kc.Contexts[kc.CurrentContext].AuthInfo].Token
}
