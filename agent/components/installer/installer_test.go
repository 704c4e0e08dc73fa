package installer_test

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/components/charts"
	"github.com/flotilla-gitops/flotilla/agent/components/installer"
	"github.com/flotilla-gitops/flotilla/test/componenttest"
)

// A worker's whole life with managed components: a fresh install of both, applies that
// change nothing, an in-place upgrade that keeps every user's object, a run interrupted
// half-way, then an uninstall that removes the releases but never a CRD, after which a
// new install takes its own CRDs back without asking for adoption. The steps build on
// each other, as they do on a worker.
func TestComponentsInstallUpgradeInPlaceAndUninstallKeepingTheirCRDs(t *testing.T) {
	t.Parallel()
	plane := planes[lifecyclePlane]
	withoutComponents(t, plane)
	inst := newInstaller(t, plane)
	spec := managedSpec()
	var users workloads
	var crdsBefore map[string]string

	step := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}

	step("a fresh worker gets both components from the release images", func(t *testing.T) {
		began := time.Now()
		rep, err := inst.Apply(t.Context(), spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("fresh install took %v", time.Since(began).Round(time.Millisecond))
		wantActions(t, rep, map[components.Component]components.Action{components.JobSet: components.ActionInstalled, components.Kueue: components.ActionInstalled})
		for _, c := range components.All() {
			dep := controller(t, plane, c)
			img := dep.Spec.Template.Spec.Containers[0]
			if want := "registry.k8s.io/" + string(c) + "/" + string(c) + ":" + latest(c); img.Image != want || img.ImagePullPolicy != corev1.PullIfNotPresent {
				t.Errorf("%s runs %s (%s), want %s (IfNotPresent)", dep.Name, img.Image, img.ImagePullPolicy, want)
			}
			if got := releaseLabel(t, plane, c); got != installer.ReleaseLabelValue {
				t.Errorf("%s's release is labeled %s=%q, want %q", c, installer.ReleaseLabel, got, installer.ReleaseLabelValue)
			}
			if got := statusOf(t, rep, c); got.Version != latest(c) || !strings.Contains(got.Message, "revision 1") {
				t.Errorf("%s: version %q, message %q", c, got.Version, got.Message)
			}
		}
		if got := kueueFrameworks(t, plane); !slices.Equal(got, spec.Frameworks) {
			t.Errorf("Kueue's integrations are %v, want %v", got, spec.Frameworks)
		}
		all := crds(t, plane)
		js, ok := all["jobsets.jobset.x-k8s.io"]
		if !ok {
			t.Fatal("no JobSet CRD after the install")
		}
		if !slices.ContainsFunc(js.ManagedFields, func(f metav1.ManagedFieldsEntry) bool { return f.Manager == installer.FieldManager }) {
			t.Errorf("the JobSet CRD was not applied by %s: %+v", installer.FieldManager, js.ManagedFields)
		}
		for name, crd := range all {
			if strings.HasSuffix(name, ".kueue.x-k8s.io") && crd.Annotations["helm.sh/resource-policy"] != "keep" {
				t.Errorf("CRD %s has no helm.sh/resource-policy: keep, so an uninstall would delete it", name)
			}
		}
	})

	step("applying the same components again changes nothing", func(t *testing.T) {
		before := map[components.Component]map[string]string{}
		for _, c := range components.All() {
			before[c] = revisions(t, plane, c)
		}
		began := time.Now()
		rep, err := inst.Apply(t.Context(), spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("unchanged apply took %v", time.Since(began).Round(time.Millisecond))
		wantActions(t, rep, map[components.Component]components.Action{components.JobSet: components.ActionUnchanged, components.Kueue: components.ActionUnchanged})
		for _, c := range components.All() {
			if got := revisions(t, plane, c); !maps.Equal(got, before[c]) {
				t.Errorf("%s's release has revisions %v, had %v", c, got, before[c])
			}
		}
	})

	step("an upgrade keeps every object and CRD in place", func(t *testing.T) {
		withoutWebhooks(t, plane)
		users = createWorkloads(t, plane, "upgrade")
		uids := crdUIDs(t, plane)
		inst := newInstaller(t, plane)
		inst.Chart = func(c components.Component, version string) ([]byte, error) {
			if c == components.Kueue {
				return componenttest.BumpedChart(t, c, version, "0.17.1-flotilla.1"), nil
			}
			return charts.Archive(c, version)
		}
		spec.Frameworks = []string{"batch/job", "jobset.x-k8s.io/jobset", "kubeflow.org/pytorchjob"}
		rep, err := inst.Apply(t.Context(), spec)
		if err != nil {
			t.Fatal(err)
		}
		wantActions(t, rep, map[components.Component]components.Action{components.JobSet: components.ActionUnchanged, components.Kueue: components.ActionUpgraded})
		if msg := statusOf(t, rep, components.Kueue).Message; !strings.Contains(msg, "from chart kueue-0.17.0 to kueue-0.17.1-flotilla.1, revision 2") {
			t.Errorf("Kueue's upgrade says %q", msg)
		}
		if got := kueueFrameworks(t, plane); !slices.Equal(got, spec.Frameworks) {
			t.Errorf("Kueue's integrations are %v after the upgrade, want %v", got, spec.Frameworks)
		}
		users.wantKept(t, plane)
		if got := crdUIDs(t, plane); !maps.Equal(got, uids) {
			t.Errorf("CRDs after the upgrade %v, before %v", got, uids)
		}
		if got := revisions(t, plane, components.Kueue); !maps.Equal(got, map[string]string{"1": "superseded", "2": "deployed"}) {
			t.Errorf("Kueue's revisions are %v", got)
		}
		inst.Chart = nil
		spec.Frameworks = managedSpec().Frameworks
	})

	step("a run interrupted half-way is taken over once it is stale", func(t *testing.T) {
		// The embedded chart again, with the first integrations: the pending revision
		// stands for an upgrade back to them that was killed.
		pending := interruptRun(t, plane, components.Kueue, time.Now())
		rep, err := inst.Apply(t.Context(), spec)
		if err != nil {
			t.Fatal(err)
		}
		wantActions(t, rep, map[components.Component]components.Action{components.JobSet: components.ActionUnchanged, components.Kueue: components.ActionFailed})
		if msg := statusOf(t, rep, components.Kueue).Message; !strings.Contains(msg, "pending-upgrade") || !strings.Contains(msg, "another run") {
			t.Errorf("a fresh pending revision: %q", msg)
		}
		if got := revisions(t, plane, components.Kueue)["3"]; got != "pending-upgrade" {
			t.Errorf("a run that may still be at work was disturbed: revision %d is %s", pending, got)
		}

		setPendingSince(t, plane, components.Kueue, time.Now().Add(-time.Hour))
		rep, err = inst.Apply(t.Context(), spec)
		if err != nil {
			t.Fatal(err)
		}
		wantActions(t, rep, map[components.Component]components.Action{components.JobSet: components.ActionUnchanged, components.Kueue: components.ActionUpgraded})
		if msg := statusOf(t, rep, components.Kueue).Message; !strings.Contains(msg, "revision 3 was left pending-upgrade") {
			t.Errorf("the recovery says %q", msg)
		}
		if got := revisions(t, plane, components.Kueue); !maps.Equal(got, map[string]string{"1": "superseded", "2": "superseded", "3": "failed", "4": "deployed"}) {
			t.Errorf("Kueue's revisions are %v", got)
		}
		if got := kueueFrameworks(t, plane); !slices.Equal(got, spec.Frameworks) {
			t.Errorf("Kueue's integrations are %v, want %v", got, spec.Frameworks)
		}
		users.wantKept(t, plane)
	})

	var dryRun []string
	step("an uninstall dry run lists the releases and their objects, and removes nothing", func(t *testing.T) {
		crdsBefore = map[string]string{}
		for name, crd := range crds(t, plane) {
			crdsBefore[name] = string(crd.UID)
		}
		rep, err := inst.Uninstall(t.Context(), true)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Components) != 0 {
			t.Errorf("the dry run reports %+v", rep.Components)
		}
		dryRun = rep.Removed
		for _, want := range []string{"Helm release kueue-system/kueue", "Deployment kueue-system/kueue-controller-manager",
			"Helm release jobset-system/jobset", "Deployment jobset-system/jobset-controller",
			"MutatingWebhookConfiguration kueue-mutating-webhook-configuration", "ClusterRole kueue-manager-role"} {
			if !has(dryRun, want) {
				t.Errorf("the dry run does not list %q:\n%s", want, strings.Join(dryRun, "\n"))
			}
		}
		for _, line := range dryRun {
			if strings.HasPrefix(line, "CustomResourceDefinition ") {
				t.Errorf("the dry run would remove %s", line)
			}
		}
		for _, c := range components.All() {
			controller(t, plane, c)
			if len(revisions(t, plane, c)) == 0 {
				t.Errorf("the dry run removed %s's release", c)
			}
		}
	})

	step("an uninstall removes what its dry run listed and keeps every CRD and user object", func(t *testing.T) {
		rep, err := inst.Uninstall(t.Context(), false)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Components) != 0 {
			t.Errorf("the uninstall reports %+v", rep.Components)
		}
		if !slices.Equal(rep.Removed, dryRun) {
			t.Errorf("the uninstall removed\n%s\nthe dry run listed\n%s", strings.Join(rep.Removed, "\n"), strings.Join(dryRun, "\n"))
		}
		for _, c := range components.All() {
			if got := revisions(t, plane, c); len(got) != 0 {
				t.Errorf("%s's release is still there: %v", c, got)
			}
			var deps appsv1.DeploymentList
			if err := plane.Client.List(t.Context(), &deps, client.InNamespace(components.Namespace(c))); err != nil {
				t.Fatal(err)
			}
			if len(deps.Items) != 0 {
				t.Errorf("%s's controller is still there", c)
			}
		}
		var sa corev1.ServiceAccount
		if err := plane.Client.Get(t.Context(), client.ObjectKey{Namespace: "kueue-system", Name: "kueue-controller-manager"}, &sa); !apierrors.IsNotFound(err) {
			t.Errorf("Kueue's ServiceAccount after the uninstall: %v", err)
		}
		after := map[string]string{}
		for name, crd := range crds(t, plane) {
			after[name] = string(crd.UID)
		}
		if !maps.Equal(after, crdsBefore) {
			t.Errorf("CRDs after the uninstall %v, before %v", after, crdsBefore)
		}
		users.wantKept(t, plane)
	})

	step("a new install after an uninstall takes back its own CRDs", func(t *testing.T) {
		rep, err := inst.Apply(t.Context(), spec)
		if err != nil {
			t.Fatal(err)
		}
		wantActions(t, rep, map[components.Component]components.Action{components.JobSet: components.ActionInstalled, components.Kueue: components.ActionInstalled})
		users.wantKept(t, plane)
	})
}

// A spec the installer cannot act on fails the component it concerns, before anything on
// the worker changes, and Kueue is not attempted after a JobSet that failed; a cluster
// that runs its own components is left alone.
func TestASpecThatCannotBeAppliedChangesNothing(t *testing.T) {
	t.Parallel()
	notAttempted := "not attempted: jobset " + latest(components.JobSet) + " failed first"
	for _, tc := range []struct {
		name string
		edit func(*components.Spec)
		want map[components.Component]string // action: part of the message
	}{
		{"a version this build has no chart of", func(s *components.Spec) { s.JobSet.Version = "v0.0.1" },
			map[components.Component]string{components.JobSet: "failed: no chart of jobset v0.0.1 in this build (it has [" + latest(components.JobSet) + "])",
				components.Kueue: "failed: " + strings.Replace(notAttempted, latest(components.JobSet), "v0.0.1", 1)}},
		{"a digest that is not one", func(s *components.Spec) { s.JobSet.Digest = "sha256:abc" },
			map[components.Component]string{components.JobSet: `failed: the digest of jobset ` + latest(components.JobSet) + ` is "sha256:abc"`,
				components.Kueue: "failed: " + notAttempted}},
		{"components the cluster runs itself", func(s *components.Spec) { s.Managed = false },
			map[components.Component]string{components.JobSet: "unchanged: not managed by flotilla", components.Kueue: "unchanged: not managed by flotilla"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// The brownfield plane: whatever it holds, nothing here may touch it.
			plane := planes[brownfieldPlane]
			spec := managedSpec()
			tc.edit(&spec)
			rep, err := newInstaller(t, plane).Apply(t.Context(), spec)
			if err != nil {
				t.Fatal(err)
			}
			for c, want := range tc.want {
				st := statusOf(t, rep, c)
				if got := string(st.Action) + ": " + st.Message; !strings.HasPrefix(got, want) {
					t.Errorf("%s: %q, want it to start with %q", c, got, want)
				}
			}
		})
	}
}

func TestAnAPIServerThatDoesNotAnswerIsTheRunsError(t *testing.T) {
	t.Parallel()
	cfg := rest.CopyConfig(planes[lifecyclePlane].Config)
	cfg.Host = "https://127.0.0.1:1"
	inst := &installer.Installer{Config: cfg}
	if _, err := inst.Apply(t.Context(), managedSpec()); err == nil || !strings.Contains(err.Error(), "does not answer") {
		t.Errorf("Apply: %v, want an error saying the API server does not answer", err)
	}
	if _, err := inst.Uninstall(t.Context(), true); err == nil {
		t.Error("Uninstall: no error")
	}
}
