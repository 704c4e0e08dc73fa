package installer_test

import (
	"bytes"
	"log/slog"
	"maps"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/components/charts"
	"github.com/flotilla-gitops/flotilla/agent/components/installer"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// A worker whose Kueue was installed without Helm (the control plane's CRDs, applied as
// `kubectl apply` would) and whose JobSet is someone else's Helm release: flotilla
// refuses both and changes nothing until the cluster declares adoption, then takes both
// over in place, keeping every object's UID, and from then on treats them as its own.
func TestComponentsInstalledByOthersAreRefusedUntilAdoptionThenTakenOverInPlace(t *testing.T) {
	t.Parallel()
	plane := planes[brownfieldPlane]
	// The users' objects come first: once JobSet's release is there, its webhook,
	// which nothing serves here, would refuse a JobSet.
	users := createWorkloads(t, plane, "brownfield")
	helmInstall(t, plane, components.JobSet)
	jobsetController := controller(t, plane, components.JobSet)
	before := crds(t, plane)
	inst := newInstaller(t, plane)
	spec := managedSpec()

	step := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}

	step("both are refused with what was found and how to hand it over, and nothing changes", func(t *testing.T) {
		rep, err := inst.Apply(t.Context(), spec)
		if err != nil {
			t.Fatal(err)
		}
		wantActions(t, rep, map[components.Component]components.Action{components.JobSet: components.ActionRefused, components.Kueue: components.ActionRefused})
		for c, wants := range map[components.Component][]string{
			components.Kueue: {"installed without Helm", "CustomResourceDefinition clusterqueues.kueue.x-k8s.io (created 20",
				"flotilla changed nothing", "spec.components.adopt: true", "spec.components.managed: false"},
			components.JobSet: {"installed by Helm release jobset-system/jobset (chart jobset-0.11.1, revision 1, deployed",
				"CustomResourceDefinition jobsets.jobset.x-k8s.io (created 20", "Deployment jobset-system/jobset-controller (created 20",
				"spec.components.adopt: true", "spec.components.managed: false"},
		} {
			msg := statusOf(t, rep, c).Message
			for _, want := range wants {
				if !strings.Contains(msg, want) {
					t.Errorf("%s's refusal does not say %q: %s", c, want, msg)
				}
			}
		}
		wantUnchanged(t, plane, before)
	})

	step("an uninstall leaves a release flotilla did not make", func(t *testing.T) {
		rep, err := inst.Uninstall(t.Context(), false)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Removed) != 0 {
			t.Errorf("the uninstall removed %v", rep.Removed)
		}
		if st := statusOf(t, rep, components.JobSet); st.Action != components.ActionUnchanged || !strings.Contains(st.Message, "not flotilla's") {
			t.Errorf("JobSet: %s (%s), want it left alone as not flotilla's", st.Action, st.Message)
		}
		wantUnchanged(t, plane, before)
	})

	step("with adoption declared both are taken over in place", func(t *testing.T) {
		spec.Adopt = true
		rep, err := inst.Apply(t.Context(), spec)
		if err != nil {
			t.Fatal(err)
		}
		wantActions(t, rep, map[components.Component]components.Action{components.JobSet: components.ActionAdopted, components.Kueue: components.ActionAdopted})
		after := crds(t, plane)
		for name, crd := range before {
			if after[name].UID != crd.UID {
				t.Errorf("CRD %s has UID %s, had %s: it was replaced", name, after[name].UID, crd.UID)
			}
			if after[name].Annotations[installer.InstalledByAnnotation] != components.BinaryName {
				t.Errorf("CRD %s does not carry %s after the adoption", name, installer.InstalledByAnnotation)
			}
		}
		if got := controller(t, plane, components.JobSet); got.UID != jobsetController.UID {
			t.Errorf("JobSet's controller has UID %s, had %s", got.UID, jobsetController.UID)
		}
		users.wantKept(t, plane)
		for _, c := range components.All() {
			if got := releaseLabel(t, plane, c); got != installer.ReleaseLabelValue {
				t.Errorf("%s's release is labeled %s=%q after the adoption", c, installer.ReleaseLabel, got)
			}
			if img := controller(t, plane, c).Spec.Template.Spec.Containers[0].Image; img != spec.Image(c) {
				t.Errorf("%s runs %s after the adoption, want %s", c, img, spec.Image(c))
			}
		}
		if got := revisions(t, plane, components.JobSet); !maps.Equal(got, map[string]string{"1": "superseded", "2": "deployed"}) {
			t.Errorf("JobSet's revisions are %v", got)
		}
	})

	step("once adopted, a component is flotilla's like any other", func(t *testing.T) {
		rep, err := inst.Apply(t.Context(), spec)
		if err != nil {
			t.Fatal(err)
		}
		wantActions(t, rep, map[components.Component]components.Action{components.JobSet: components.ActionUnchanged, components.Kueue: components.ActionUnchanged})
	})
}

// wantUnchanged fails unless the worker is as it was before a refused run: the CRDs at
// the same resourceVersions, no Kueue namespace, JobSet's release at its one revision
// and not flotilla's.
func wantUnchanged(t *testing.T, plane *controlplane.ControlPlane, before map[string]apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	rvs := func(m map[string]apiextensionsv1.CustomResourceDefinition) map[string]string {
		out := map[string]string{}
		for name, c := range m {
			out[name] = c.ResourceVersion
		}
		return out
	}
	if got, want := rvs(crds(t, plane)), rvs(before); !maps.Equal(got, want) {
		t.Errorf("the CRDs changed: resourceVersions %v, were %v", got, want)
	}
	err := plane.Client.Get(t.Context(), client.ObjectKey{Name: components.Namespace(components.Kueue)}, &corev1.Namespace{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("namespace %s: %v, want it never created", components.Namespace(components.Kueue), err)
	}
	if got := revisions(t, plane, components.JobSet); !maps.Equal(got, map[string]string{"1": "deployed"}) {
		t.Errorf("JobSet's release has revisions %v", got)
	}
	if got := releaseLabel(t, plane, components.JobSet); got != "" {
		t.Errorf("JobSet's release is labeled %s=%q", installer.ReleaseLabel, got)
	}
}

// helmInstall installs c's chart with its defaults as `helm install` does, as a platform
// team would have before flotilla: release components.ReleaseName(c) in
// components.Namespace(c). The control plane's CRDs stand for the ones it installed
// (--skip-crds).
func helmInstall(t *testing.T, plane *controlplane.ControlPlane, c components.Component) {
	t.Helper()
	path, ns := kubeconfigFile(t, plane), components.Namespace(c)
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace = &path, &ns
	cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.DiscardHandler))
	if err := cfg.Init(flags, ns, "secret"); err != nil {
		t.Fatal(err)
	}
	archive, err := charts.Archive(c, latest(c))
	if err != nil {
		t.Fatal(err)
	}
	ch, err := loader.LoadArchive(bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace = components.ReleaseName(c), ns
	in.CreateNamespace, in.SkipCRDs = true, true
	in.WaitStrategy = kube.HookOnlyStrategy
	if _, err := in.RunWithContext(t.Context(), ch, nil); err != nil {
		t.Fatalf("helm install %s: %v", c, err)
	}
}
