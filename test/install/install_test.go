package install

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	configapi "sigs.k8s.io/kueue/apis/config/v1beta2"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/dispatch"
	"github.com/flotilla-gitops/flotilla/reconciler/leader"
	"github.com/flotilla-gitops/flotilla/test/poll"
)

// step is what the test does after one ```sh block of the section has run: what a user
// would see next, and the forge's part where the README has the user click.
type step struct {
	name  string
	after func(t *testing.T, w *world, outputs []string)
}

// readmeSteps are the section's blocks, in order. A README that gains or loses a block
// fails the test until this list says what follows it.
func readmeSteps() []step {
	return []step{
		{name: "Kueue on the hub", after: func(t *testing.T, w *world, _ []string) {
			checkHubKueueConfiguration(t, filepath.Join(w.checkout, "kueue-hub-values.yaml"))
		}},
		{name: "the hub's credentials"},
		{name: "the hub", after: func(t *testing.T, w *world, _ []string) {
			// Both replicas ready (readiness is health, not the Lease), one labelled leader.
			w.leader(t, "")
		}},
		{name: "the fleet repository"},
		{name: "a worker enrolled on a branch", after: func(t *testing.T, w *world, _ []string) {
			// The forge opens the pull request and tells the hub.
			head := w.openPullRequest(1, "add-"+cluster)
			w.waitStatus(head, "flotilla/plan", commitstatus.Success, "+1 cluster")
		}},
		{name: "the plan on the pull request", after: func(t *testing.T, w *world, outputs []string) {
			if !regexp.MustCompile(`(?m)^flotilla/plan\s+success\s`).MatchString(outputs[0]) {
				t.Fatalf("`flotilla commit status` shows no successful plan:\n%s", outputs[0])
			}
			// The user merges; the forge makes the merge commit and tells the hub, which
			// registers the cluster and waits for its agent.
			merged := w.mergePullRequest(1, "add-"+cluster)
			w.waitStatus(merged, "flotilla/"+cluster, commitstatus.Pending, "")
			w.merged = merged
		}},
		{name: "the agent on the worker"},
		{name: "the commit turns green", after: func(t *testing.T, w *world, outputs []string) {
			if !regexp.MustCompile(`(?m)^\s+DispatchReady\s+True\s`).MatchString(outputs[1]) {
				t.Errorf("`flotilla cluster status` does not show DispatchReady True:\n%s", outputs[1])
			}
			if !regexp.MustCompile(`(?m)^flotilla/` + cluster + `\s+success\s`).MatchString(outputs[2]) {
				t.Errorf("`flotilla commit status` does not show %s green:\n%s", cluster, outputs[2])
			}
		}},
	}
}

// TestTheReadmePathTakesAFirstWorkerToGreen runs every command of the README's "Run it on
// your clusters", in order, and checks that it ends where the README says: the merge
// commit green for the cluster, and the cluster dispatchable from the hub's Kueue.
func TestTheReadmePathTakesAFirstWorkerToGreen(t *testing.T) {
	began := time.Now()
	w := newWorld(t)
	t.Logf("world ready in %s", time.Since(began).Round(time.Second))
	blocks := readSection(t, w.readme, substitutions(w))
	steps := readmeSteps()
	if len(blocks) != len(steps) {
		t.Fatalf("the README's section %q has %d sh blocks; the test knows what follows %d of them: update steps", sectionTitle, len(blocks), len(steps))
	}
	for i, b := range blocks {
		s := steps[i]
		start := time.Now()
		var outputs []string
		for _, c := range b.commands {
			outputs = append(outputs, w.shell.run(c))
		}
		if s.after != nil {
			s.after(t, w, outputs)
		}
		t.Logf("README line %d, %s: %d commands, %s", b.line, s.name, len(b.commands), time.Since(start).Round(100*time.Millisecond))
	}
	t.Logf("from nothing to green in %s", time.Since(began).Round(time.Second))

	ctx := t.Context()
	wcKey := types.NamespacedName{Namespace: tenant, Name: cluster}
	t.Run("the merge commit is green and the hub's Kueue dispatches to the cluster", func(t *testing.T) {
		w.waitStatus(w.merged, "flotilla/"+cluster, commitstatus.Success, "")
		// The commit status follows the agent's report as it arrives; the WorkerCluster's
		// record of it follows the hub's write.
		var wc v1alpha1.WorkerCluster
		poll.Until(t, "the WorkerCluster's record of the agent's report", func() (bool, string) {
			if err := planes[0].Client.Get(ctx, wcKey, &wc); err != nil {
				return false, err.Error()
			}
			c := apimeta.FindStatusCondition(wc.Status.Conditions, v1alpha1.ConditionReady)
			return c != nil && c.Status == metav1.ConditionTrue, fmt.Sprintf("Ready %+v", c)
		})
		for _, typ := range []string{v1alpha1.ConditionRegistered, v1alpha1.ConditionConnected, v1alpha1.ConditionWorkerConfigured, v1alpha1.ConditionDispatchReady, v1alpha1.ConditionReady} {
			if c := apimeta.FindStatusCondition(wc.Status.Conditions, typ); c == nil || c.Status != metav1.ConditionTrue {
				t.Errorf("%s = %+v, want True", typ, c)
			}
		}
		if got := wc.SourceCommit(); got != w.merged {
			t.Errorf("the cluster's state comes from commit %s, not the merge %s", got, w.merged)
		}
		// The README sends jobs to the pool's LocalQueue in the workload namespaces.
		for _, ns := range workloadNamespaces(t, w) {
			var lq kueue.LocalQueue
			if err := planes[0].Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "us"}, &lq); err != nil {
				t.Errorf("the hub has no LocalQueue us in %s: %v", ns, err)
			}
		}
	})

	t.Run("the leading hub replica goes and the agent reaches the other through the same Service", func(t *testing.T) {
		old := w.leader(t, "")
		connects := strings.Count(w.hubOut.String(), `"msg":"agent connected"`)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: hubNamespace, Name: old}}
		// As kubectl delete pod or a node drain does: graceful, the replica hands the Lease over.
		if err := planes[0].Client.Delete(ctx, pod); err != nil {
			t.Fatal(err)
		}
		next := w.leader(t, old)
		poll.Until(t, "the agent connected to the new leader "+next, func() (bool, string) {
			out := w.hubOut.String()
			for _, line := range strings.Split(out, "\n") {
				if strings.HasPrefix(line, next+": ") && strings.Contains(line, `"msg":"agent connected"`) {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%d agent connections logged, %d before", strings.Count(out, `"msg":"agent connected"`), connects)
		})
		poll.Until(t, "the cluster connected and dispatchable again", func() (bool, string) {
			var wc v1alpha1.WorkerCluster
			if err := planes[0].Client.Get(ctx, wcKey, &wc); err != nil {
				return false, err.Error()
			}
			for _, typ := range []string{v1alpha1.ConditionConnected, v1alpha1.ConditionDispatchReady} {
				if c := apimeta.FindStatusCondition(wc.Status.Conditions, typ); c == nil || c.Status != metav1.ConditionTrue {
					return false, fmt.Sprintf("%s %+v", typ, c)
				}
			}
			return true, ""
		})
		w.waitStatus(w.merged, "flotilla/"+cluster, commitstatus.Success, "")
	})

	t.Run("no process or command prints a token or a secret", func(t *testing.T) {
		secrets := w.secrets(t)
		outputs := map[string]string{
			"the session":     readFile(w.transcript),
			"the hub's pods":  w.hubOut.String(),
			"the agent's pod": w.workerOut.String(),
			"the pod runners and the Kueue and JobSet managers": w.harnessOut.String(),
			"the fleet repository":                              w.repositoryHistory(t),
			"the hub's configuration":                           w.renderedHubConfig(t),
		}
		for where, text := range outputs {
			for what, secret := range secrets {
				if strings.Contains(text, secret) {
					t.Errorf("%s holds %s", where, what)
				}
			}
			if strings.Contains(text, "WARNING: DATA RACE") {
				t.Errorf("%s reports a data race", where)
			}
		}
	})
}

// checkHubKueueConfiguration fails the test unless the README's Kueue values give the hub's
// Kueue what reconciler/dispatch.HubKueueConfiguration says dispatch needs.
func checkHubKueueConfiguration(t *testing.T, file string) {
	t.Helper()
	var values struct {
		ManagerConfig struct {
			ControllerManagerConfigYaml string `json:"controllerManagerConfigYaml"`
		} `json:"managerConfig"`
	}
	if err := yaml.UnmarshalStrict([]byte(readFile(file)), &values); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var got configapi.Configuration
	if err := yaml.UnmarshalStrict([]byte(values.ManagerConfig.ControllerManagerConfigYaml), &got); err != nil {
		t.Fatalf("%s: managerConfig.controllerManagerConfigYaml: %v", file, err)
	}
	want := dispatch.HubKueueConfiguration(dispatch.DefaultWorkerLostTimeout)
	switch {
	case got.MultiKueue == nil || got.MultiKueue.Origin == nil || *got.MultiKueue.Origin != *want.MultiKueue.Origin:
		t.Errorf("the README's hub Kueue has multiKueue %+v, want origin %s", got.MultiKueue, *want.MultiKueue.Origin)
	case got.MultiKueue.WorkerLostTimeout == nil || got.MultiKueue.WorkerLostTimeout.Duration != want.MultiKueue.WorkerLostTimeout.Duration:
		t.Errorf("the README's hub Kueue has workerLostTimeout %v, want %s", got.MultiKueue.WorkerLostTimeout, want.MultiKueue.WorkerLostTimeout.Duration)
	}
	if got.Integrations == nil || !slices.Equal(got.Integrations.Frameworks, want.Integrations.Frameworks) {
		t.Errorf("the README's hub Kueue has integrations %+v, want frameworks %v", got.Integrations, want.Integrations.Frameworks)
	}
}

// leader waits until both hub replicas are ready and exactly one Pod, not notPod, carries
// the leader label, and returns its name.
func (w *world) leader(t *testing.T, notPod string) string {
	t.Helper()
	var name string
	poll.Until(t, "two ready hub replicas, one of them leading", func() (bool, string) {
		pods := w.hubRunner.Pods(types.NamespacedName{Namespace: hubNamespace, Name: hubDeployment})
		ready := 0
		for _, p := range pods {
			if p.Ready && p.Name != notPod {
				ready++
			}
		}
		var list corev1.PodList
		if err := planes[0].Client.List(t.Context(), &list, client.InNamespace(hubNamespace), client.MatchingLabels{leader.Label: "true"}); err != nil {
			return false, err.Error()
		}
		var leaders []string
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && p.Name != notPod {
				leaders = append(leaders, p.Name)
			}
		}
		if ready != 2 || len(leaders) != 1 {
			return false, fmt.Sprintf("%d ready replicas, leaders %v", ready, leaders)
		}
		name = leaders[0]
		return true, ""
	})
	return name
}

// workloadNamespaces are the fleet's, from the fleet.yaml the README's `fleet init` wrote.
func workloadNamespaces(t *testing.T, w *world) []string {
	t.Helper()
	var f struct {
		Spec struct {
			WorkloadNamespaces []string `json:"workloadNamespaces"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal([]byte(readFile(filepath.Join(w.fleet, "fleet.yaml"))), &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Spec.WorkloadNamespaces) == 0 {
		t.Fatal("fleet.yaml names no workload namespace")
	}
	return f.Spec.WorkloadNamespaces
}

// secrets are every secret of the path, by what they are: the forge token, the webhook's
// secret, the hub's age identity, the worker's enrollment token and the credential its
// agent redeemed it for.
func (w *world) secrets(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{
		"the forge token":      w.forgeToken,
		"the webhook's secret": strings.TrimSpace(readFile(filepath.Join(w.checkout, "webhook-secret"))),
		"the hub's age identity": func() string {
			for _, line := range strings.Split(readFile(filepath.Join(w.checkout, "hub.agekey")), "\n") {
				if strings.HasPrefix(line, "AGE-SECRET-KEY-") {
					return line
				}
			}
			t.Fatal("hub.agekey holds no AGE-SECRET-KEY")
			return ""
		}(),
	}
	var values struct {
		Enrollment struct {
			Token string `json:"token"`
		} `json:"enrollment"`
	}
	if err := yaml.Unmarshal([]byte(readFile(filepath.Join(w.fleet, "values."+cluster+".local.yaml"))), &values); err != nil || values.Enrollment.Token == "" {
		t.Fatalf("the values file holds no enrollment token (%v)", err)
	}
	out["the enrollment token"] = values.Enrollment.Token
	var cred corev1.Secret
	if err := planes[1].Client.Get(t.Context(), types.NamespacedName{Namespace: agentNamespace, Name: "flotilla-agent-credential"}, &cred); err != nil {
		t.Fatal(err)
	}
	if c := string(cred.Data["credential"]); c != "" {
		out["the agent's credential"] = c
	} else {
		t.Error("the agent's credential Secret holds no credential")
	}
	for what, s := range out {
		if len(s) < 16 {
			t.Fatalf("%s is %d characters: too short to look for", what, len(s))
		}
	}
	return out
}

// repositoryHistory is everything the forge's repository holds, the hub's notes included.
func (w *world) repositoryHistory(t *testing.T) string {
	t.Helper()
	return git(t, w.home, w.bare, "log", "--all", "-p")
}

// renderedHubConfig is the hub's configuration as the chart rendered it into its ConfigMap.
func (w *world) renderedHubConfig(t *testing.T) string {
	t.Helper()
	var cm corev1.ConfigMap
	if err := planes[0].Client.Get(t.Context(), types.NamespacedName{Namespace: hubNamespace, Name: hubDeployment}, &cm); err != nil {
		t.Fatal(err)
	}
	return cm.Data["config.yaml"]
}
