package installer

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/kube"
	release "helm.sh/helm/v4/pkg/release/v1"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/cli-runtime/pkg/resource"

	"github.com/flotilla-gitops/flotilla/agent/components"
)

// Uninstall removes the Helm releases of the components that flotilla made, Kueue
// first, the reverse of the install order. A release flotilla did not make is left
// alone and named in the report's Components. Report.Removed lists each release and
// each object its removal deletes, in Helm's deletion order; CRDs are never among them
// (Kueue's carry helm.sh/resource-policy: keep, JobSet's are not part of its release).
// A dry run computes the same list the same way and removes nothing.
func (in *Installer) Uninstall(ctx context.Context, dryRun bool) (components.Report, error) {
	s, err := in.connect(ctx)
	if err != nil {
		return components.Report{}, err
	}
	var rep components.Report
	order := components.All()
	slices.Reverse(order)
	for _, c := range order {
		removed, st := s.uninstall(ctx, c, dryRun)
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("uninstalling %s: %w", c, err)
		}
		rep.Removed = append(rep.Removed, removed...)
		if st != nil {
			rep.Components = append(rep.Components, *st)
		}
	}
	return rep, nil
}

// uninstall removes c's release if it is flotilla's. It returns the lines of
// Report.Removed, and a status when the release was left or could not be removed.
func (s *session) uninstall(ctx context.Context, c components.Component, dryRun bool) ([]string, *components.Status) {
	name, ns := components.ReleaseName(c), components.Namespace(c)
	ref := ns + "/" + name
	hc := s.helm[c]
	st := func(a components.Action, version, msg string) *components.Status {
		return &components.Status{Component: c, Version: version, Action: a, Message: msg}
	}
	last, err := lastRelease(hc, name)
	if err != nil {
		return nil, st(components.ActionFailed, "", fmt.Sprintf("reading Helm release %s: %v", ref, err))
	}
	if last == nil {
		return nil, nil
	}
	version := ""
	if last.Chart != nil && last.Chart.Metadata != nil {
		version = last.Chart.Metadata.AppVersion
	}
	if !isOurs(last) {
		return nil, st(components.ActionUnchanged, version, fmt.Sprintf("Helm release %s is not flotilla's (it has no label %s=%s): left alone", ref, ReleaseLabel, ReleaseLabelValue))
	}
	objects, err := removable(hc, last)
	if err != nil {
		return nil, st(components.ActionFailed, version, fmt.Sprintf("Helm release %s: %v", ref, err))
	}
	removed := append([]string{"Helm release " + ref}, objects...)
	if dryRun {
		return removed, nil
	}
	un := action.NewUninstall(hc)
	un.WaitStrategy = kube.HookOnlyStrategy
	un.WaitOptions = []kube.WaitOption{kube.WithWaitContext(ctx)}
	un.Timeout = hookTimeout
	un.Description = "Uninstalled by " + components.BinaryName
	if _, err := un.Run(name); err != nil {
		return removed, st(components.ActionFailed, version, fmt.Sprintf("uninstalling Helm release %s: %v", ref, err))
	}
	s.log.InfoContext(ctx, "release uninstalled", "component", string(c), "release", ref, "objects", len(objects))
	return removed, nil
}

// removable lists what uninstalling rel deletes, as Helm's uninstall decides it: the
// objects of the last revision's manifest, in Helm's uninstall order, without those that
// carry helm.sh/resource-policy: keep, that no longer exist, or that another release
// owns now. A CRD without keep is an error: its removal would delete every object of
// its kind, the customers' Workloads with Kueue's.
func removable(hc *action.Configuration, rel *release.Release) ([]string, error) {
	_, files, err := releaseutil.SortManifests(releaseutil.SplitManifests(rel.Manifest), nil, releaseutil.UninstallOrder)
	if err != nil {
		return nil, fmt.Errorf("reading revision %d's manifest: %w", rel.Version, err)
	}
	var doomed strings.Builder
	for _, f := range files {
		if f.Head.Metadata != nil && strings.ToLower(strings.TrimSpace(f.Head.Metadata.Annotations[kube.ResourcePolicyAnno])) == kube.KeepPolicy {
			continue
		}
		if f.Head.Kind == "CustomResourceDefinition" {
			name := ""
			if f.Head.Metadata != nil {
				name = f.Head.Metadata.Name
			}
			return nil, fmt.Errorf("revision %d would delete CustomResourceDefinition %s, which has no %s: %s annotation; refusing, since that deletes every object of its kind",
				rel.Version, name, kube.ResourcePolicyAnno, kube.KeepPolicy)
		}
		doomed.WriteString("\n---\n" + f.Content)
	}
	infos, err := hc.KubeClient.Build(strings.NewReader(doomed.String()), false)
	if err != nil {
		return nil, fmt.Errorf("reading revision %d's objects: %w", rel.Version, err)
	}
	var out []string
	for _, info := range infos {
		kind := info.Mapping.GroupVersionKind.Kind
		obj, err := resource.NewHelper(info.Client, info.Mapping).Get(info.Namespace, info.Name)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", objectRef(kind, info.Namespace, info.Name), err)
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			return nil, err
		}
		if m.GetLabels()[helmManagedByLabel] != helmManagedByValue || m.GetAnnotations()[helmReleaseNameAnnotation] != rel.Name ||
			m.GetAnnotations()[helmReleaseNSAnnotation] != rel.Namespace {
			continue // Helm's uninstall skips what its release does not own
		}
		out = append(out, objectRef(kind, info.Namespace, info.Name))
	}
	return out, nil
}
