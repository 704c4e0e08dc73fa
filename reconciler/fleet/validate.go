package fleet

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

var versionPattern = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)

func loadFleetFile(fsys fs.FS, list *ErrorList) *v1alpha1.Fleet {
	e := errs{file: FleetFile, list: list}
	if _, err := fs.Stat(fsys, FleetFile); err != nil {
		e.whole("the repository has no fleet.yaml; every fleet repository starts with one")
		return nil
	}
	data, ok := readFile(fsys, FleetFile, e)
	if !ok {
		return nil
	}
	root, ok := singleDocument(data, e)
	if !ok {
		return nil
	}
	if err := checkValues(root); err != nil {
		e.at(root.Line, root.Column, "%v", err)
		return nil
	}
	var edits jsonEdits
	lifetimeOK := checkCredentialLifetime(root, &edits, e, "spec", "credentialLifetime")
	var fl v1alpha1.Fleet
	if !decodeValue(root, &edits, &fl, e) {
		return nil
	}
	before := len(*list)
	checkTypeMeta(root, fl.APIVersion, fl.Kind, "Fleet", e)
	s := fl.Spec
	at := func(p ...string) *yaml.Node { return locate(root, append([]string{"spec"}, p...)...) }
	if s.Tenant == "" {
		n := at("tenant")
		e.at(n.Line, n.Column, "spec.tenant is required")
	} else if msgs := validation.IsDNS1123Label(s.Tenant); len(msgs) > 0 {
		n := at("tenant")
		e.at(n.Line, n.Column, "spec.tenant %q is not a DNS label: %s", s.Tenant, strings.Join(msgs, "; "))
	}
	if len(s.WorkloadNamespaces) == 0 {
		n := at("workloadNamespaces")
		e.at(n.Line, n.Column, "spec.workloadNamespaces needs at least one namespace where jobs run")
	}
	seen := map[string]bool{}
	for i, ns := range s.WorkloadNamespaces {
		n := at("workloadNamespaces", fmt.Sprintf("[%d]", i))
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			e.at(n.Line, n.Column, "workload namespace %q is not a valid namespace name: %s", ns, strings.Join(msgs, "; "))
		}
		if why := reservedNamespace(ns); why != "" {
			e.at(n.Line, n.Column, "workload namespace %q is %s: jobs dispatched there would run beside what keeps the worker running; choose a namespace of the fleet's own", ns, why)
		}
		if seen[ns] {
			e.at(n.Line, n.Column, "workload namespace %q is listed twice", ns)
		}
		seen[ns] = true
	}
	if s.HubURL == "" {
		n := at("hubURL")
		e.at(n.Line, n.Column, "spec.hubURL is required: the wss:// address agents dial")
	} else if _, err := protocol.CheckHubURL(s.HubURL, true); err != nil {
		// The agent's rule: a fleet may name a hub on the agents' loopback, which an
		// agent then dials only when its own switch allows it.
		n := at("hubURL")
		msg := err.Error()
		var hue *protocol.HubURLError
		if errors.As(err, &hue) {
			msg = hue.Message("spec.hubURL")
		}
		e.at(n.Line, n.Column, "%s", msg)
	}
	if !versionPattern.MatchString(s.KueueVersion) {
		n := at("kueueVersion")
		e.at(n.Line, n.Column, "spec.kueueVersion %q must be a release such as v0.17.0", s.KueueVersion)
	} else if !components.CanInstall(components.Kueue, s.KueueVersion) {
		n := at("kueueVersion")
		e.at(n.Line, n.Column, "spec.kueueVersion %s cannot be installed by this release of flotilla: it installs Kueue %s",
			s.KueueVersion, strings.Join(components.Installable(components.Kueue), ", "))
	}
	if s.JobSetVersion != "" && !versionPattern.MatchString(s.JobSetVersion) {
		n := at("jobSetVersion")
		e.at(n.Line, n.Column, "spec.jobSetVersion %q must be a release such as v0.11.1", s.JobSetVersion)
	} else if s.JobSetVersion != "" && !components.CanInstall(components.JobSet, s.JobSetVersion) {
		n := at("jobSetVersion")
		e.at(n.Line, n.Column, "spec.jobSetVersion %s cannot be installed by this release of flotilla: it installs JobSet %s",
			s.JobSetVersion, strings.Join(components.Installable(components.JobSet), ", "))
	}
	if !validStatusContextPrefix(s.StatusContextPrefix) {
		n := at("statusContextPrefix")
		e.at(n.Line, n.Column, "spec.statusContextPrefix must be at most 100 characters without spaces")
	}
	switch s.Decommission {
	case "", v1alpha1.DecommissionPrune, v1alpha1.DecommissionKeep:
	default:
		n := at("decommission")
		e.at(n.Line, n.Column, "spec.decommission %q must be Prune or Keep", s.Decommission)
	}
	validateDispatch(s.Dispatch, at, e)
	validateComponents(s.Components, at, e)
	seen = map[string]bool{}
	for i, r := range s.AllowedResidencies {
		n := at("allowedResidencies", fmt.Sprintf("[%d]", i))
		if r == "" {
			e.at(n.Line, n.Column, "an allowed residency may not be empty")
		}
		if seen[r] {
			e.at(n.Line, n.Column, "residency %q is listed twice", r)
		}
		seen[r] = true
	}
	if len(*list) > before || !lifetimeOK {
		return nil
	}
	return &fl
}

func checkTypeMeta(root *yaml.Node, apiVersion, kind, wantKind string, e errs) {
	if apiVersion != v1alpha1.GroupVersion.String() {
		n := locate(root, "apiVersion")
		e.at(n.Line, n.Column, "apiVersion must be %s, not %q", v1alpha1.GroupVersion, apiVersion)
	}
	if kind != wantKind {
		n := locate(root, "kind")
		e.at(n.Line, n.Column, "kind must be %s, not %q", wantKind, kind)
	}
}

func validatePreset(f *Fleet, p *Preset) {
	dir := path.Join(PresetsDir, p.Name)
	if msgs := validation.IsDNS1123Label(p.Name); len(msgs) > 0 {
		errs{file: dir, list: &p.Errors}.whole("preset name %q is not a DNS label: %s", p.Name, strings.Join(msgs, "; "))
	}
	// Every preset's YAML files were parsed once for the index, which kustomizations of
	// any preset or overlay may name.
	idx := f.kustomizeIndex()
	p.Errors = append(p.Errors, idx.yamlErrors[p.Name]...)
	k := path.Join(dir, KustomizationFile)
	if _, ok := p.Files[k]; !ok {
		errs{file: dir, list: &p.Errors}.whole("preset has no kustomization.yaml")
		return
	}
	cost := checkKustomizations(f, idx.files, nil, dir, "", renderCost{}, "", &p.Errors)
	if len(p.Errors) == 0 {
		idx.cost[p.Name] = cost
	}
}

// checkYAMLFiles parses every YAML file other than the ones validated on their own, so
// that what kustomize later reads is free of NUL bytes, invalid UTF-8 and aliases, and
// returns the objects kustomize would read from each file that parsed.
func checkYAMLFiles(files map[string][]byte, cluster string, list *ErrorList) map[string]int {
	objects := map[string]int{}
	for p, data := range files {
		if !yamlChecked(p) {
			continue
		}
		if docs, ok := parseYAML(data, errs{file: p, cluster: cluster, list: list}); ok {
			objects[p] = countObjects(docs)
		}
	}
	return objects
}

func validateCluster(f *Fleet, c *Cluster) {
	dirErr := errs{file: c.Dir, cluster: c.Name, list: &c.Errors}
	if msgs := validation.IsDNS1123Label(c.Name); len(msgs) > 0 {
		dirErr.whole("cluster directory name %q is not a DNS label: %s", c.Name, strings.Join(msgs, "; "))
	}
	switch c.Name {
	case SummaryContextName:
		dirErr.whole("cluster directory name %q is reserved: the commit status %s/%s is the fleet's summary", c.Name, f.StatusContextPrefix(), c.Name)
	case PlanContextName:
		dirErr.whole("cluster directory name %q is reserved: the commit status %s/%s is a pull request's plan", c.Name, f.StatusContextPrefix(), c.Name)
	}
	objects := checkYAMLFiles(c.Files, c.Name, &c.Errors)

	cf := path.Join(c.Dir, ClusterFile)
	e := errs{file: cf, cluster: c.Name, list: &c.Errors}
	if data, ok := c.Files[cf]; !ok {
		if !hasError(c.Errors, cf) {
			dirErr.whole("cluster directory has no cluster.yaml")
		}
	} else if root, ok := singleDocument(data, e); ok {
		var wc v1alpha1.WorkerCluster
		if decodeCluster(root, &wc, e) {
			validateWorkerCluster(f, c, root, &wc, e)
			c.Object = &wc
		}
	}

	ef := path.Join(c.Dir, EnrollmentFile)
	if data, ok := c.Files[ef]; !ok {
		if !hasError(c.Errors, ef) {
			dirErr.whole("cluster directory has no enrollment.sops.yaml; create it with `flotilla cluster add`")
		}
	} else {
		checkSOPS(data, errs{file: ef, cluster: c.Name, list: &c.Errors})
	}

	if _, ok := c.Files[path.Join(c.Dir, KustomizationFile)]; ok {
		// The overlay renders on top of its preset, whose cost counts towards the
		// cluster's limits; a preset with errors is reported as such instead.
		idx := f.kustomizeIndex()
		var base renderCost
		var from string
		if c.Object != nil {
			if cost, ok := idx.cost[c.Object.Spec.Preset]; ok && f.Presets[c.Object.Spec.Preset] != nil {
				base, from = cost, path.Join(PresetsDir, c.Object.Spec.Preset)
			}
		}
		checkKustomizations(f, idx.filesFor(c), objects, c.Dir, c.Name, base, from, &c.Errors)
	}
}

func hasError(list ErrorList, file string) bool {
	return slices.ContainsFunc(list, func(e Error) bool { return e.File == file })
}

// decodeCluster decodes cluster.yaml. Quota values are checked first, from the YAML
// itself, so that a bad quantity is placed at its line instead of failing the decode:
// it is left out of the decode, and every good one is decoded as the string it is.
func decodeCluster(root *yaml.Node, wc *v1alpha1.WorkerCluster, e errs) bool {
	if err := checkValues(root); err != nil {
		e.at(root.Line, root.Column, "%v", err)
		return false
	}
	ok := true
	var edits jsonEdits
	if quota := valueAt(root, "spec", "quota"); quota != nil && quota.Kind == yaml.MappingNode {
		edits.asStrings = quota
		for i := 0; i+1 < len(quota.Content); i += 2 {
			k, val := quota.Content[i], quota.Content[i+1]
			if msgs := validation.IsQualifiedName(k.Value); len(msgs) > 0 {
				e.at(k.Line, k.Column, "quota resource %q is not a valid resource name: %s", k.Value, strings.Join(msgs, "; "))
				edits.leaveOut(val)
				ok = false
				continue
			}
			if val.Kind != yaml.ScalarNode || val.ShortTag() == "!!null" || val.ShortTag() == "!!bool" {
				e.at(val.Line, val.Column, "quota for %s must be a quantity such as 8, 500m or 64Gi", k.Value)
				edits.leaveOut(val)
				ok = false
				continue
			}
			if msg := costlyQuantity(val.Value); msg != "" {
				e.at(val.Line, val.Column, "quota for %s %s", k.Value, msg)
				edits.leaveOut(val)
				ok = false
				continue
			}
			qty, err := resource.ParseQuantity(val.Value)
			if err != nil {
				e.at(val.Line, val.Column, "quota for %s: %q is not a quantity (such as 8, 500m or 64Gi)", k.Value, val.Value)
				edits.leaveOut(val)
				ok = false
				continue
			}
			if qty.Sign() < 0 {
				e.at(val.Line, val.Column, "quota for %s may not be negative", k.Value)
				ok = false
			}
		}
	}
	ok = checkCredentialLifetime(root, &edits, e, "spec", "credentialLifetime") && ok
	return decodeValue(root, &edits, wc, e) && ok
}

// Limits of a quota value, far beyond any real quota. resource.ParseQuantity computes
// 10^n for an exponent n, so that a value such as 1e-999999999 would hold up the loader
// for as long as it takes.
const (
	maxQuantityLength   = 64
	maxQuantityExponent = 100
)

var quantityExponent = regexp.MustCompile(`[eE]([+-]?[0-9]+)$`)

// costlyQuantity says what is wrong with a quota value too long or too far out to be
// parsed, or "" when it may be parsed.
func costlyQuantity(s string) string {
	if len(s) > maxQuantityLength {
		return fmt.Sprintf("is %d characters long; a quantity such as 8, 500m or 64Gi has at most %d", len(s), maxQuantityLength)
	}
	if m := quantityExponent.FindStringSubmatch(s); m != nil {
		if n, err := strconv.Atoi(m[1]); err != nil || n > maxQuantityExponent || n < -maxQuantityExponent {
			return fmt.Sprintf("has the exponent %s; a quantity's exponent is between -%d and %d", m[1], maxQuantityExponent, maxQuantityExponent)
		}
	}
	return ""
}

func validateWorkerCluster(f *Fleet, c *Cluster, root *yaml.Node, wc *v1alpha1.WorkerCluster, e errs) {
	at := func(p ...string) *yaml.Node { return locate(root, p...) }
	checkTypeMeta(root, wc.APIVersion, wc.Kind, "WorkerCluster", e)
	if n := at("metadata", "name"); n != nil {
		c.nameLine, c.nameColumn = n.Line, n.Column
	}
	switch {
	case wc.Name == "":
		n := at("metadata", "name")
		e.at(n.Line, n.Column, "metadata.name is required and must be %q, the directory's name", c.Name)
	case len(validation.IsDNS1123Label(wc.Name)) > 0:
		n := at("metadata", "name")
		e.at(n.Line, n.Column, "worker name %q is not a DNS label: %s", wc.Name, strings.Join(validation.IsDNS1123Label(wc.Name), "; "))
	case wc.Name != c.Name:
		n := at("metadata", "name")
		e.at(n.Line, n.Column, "worker name %q must equal its directory's name %q", wc.Name, c.Name)
	}
	if wc.Namespace != "" {
		n := at("metadata", "namespace")
		e.at(n.Line, n.Column, "metadata.namespace may not be set: the hub places each tenant's clusters")
	}
	s := wc.Spec
	if s.Region == "" {
		n := at("spec", "region")
		e.at(n.Line, n.Column, "spec.region is required")
	}
	if s.Residency == "" {
		n := at("spec", "residency")
		e.at(n.Line, n.Column, "spec.residency is required")
	} else if f.Spec != nil && len(f.Spec.Spec.AllowedResidencies) > 0 && !slices.Contains(f.Spec.Spec.AllowedResidencies, s.Residency) {
		n := at("spec", "residency")
		e.at(n.Line, n.Column, "residency %q is not allowed in this fleet; fleet.yaml allows %s", s.Residency, strings.Join(f.Spec.Spec.AllowedResidencies, ", "))
	} else if f.Spec != nil && f.Spec.Spec.DispatchEnabled() {
		if _, err := PoolOf(&f.Spec.Spec, c.Name, s.Residency); err != nil {
			n := at("spec", "residency")
			e.at(n.Line, n.Column, "%s", err.Error())
		}
	}
	switch p, ok := f.Presets[s.Preset]; {
	case s.Preset == "":
		n := at("spec", "preset")
		e.at(n.Line, n.Column, "spec.preset is required; presets are the directories under presets/")
	case !ok:
		n := at("spec", "preset")
		e.at(n.Line, n.Column, "preset %q does not exist under presets/ (have: %s)", s.Preset, presetNames(f))
	case len(p.Errors) > 0:
		n := at("spec", "preset")
		e.at(n.Line, n.Column, "preset %q has errors; fix presets/%s first", s.Preset, s.Preset)
	}
	validateClusterComponents(s.Components, at, e)
	products := map[string]bool{}
	for i, g := range s.ExpectedGPUs {
		idx := fmt.Sprintf("[%d]", i)
		if g.Product == "" {
			n := at("spec", "expectedGPUs", idx)
			e.at(n.Line, n.Column, "expected GPU needs a product, e.g. NVIDIA-H100-80GB-HBM3")
		} else if products[g.Product] {
			n := at("spec", "expectedGPUs", idx, "product")
			e.at(n.Line, n.Column, "GPU product %q is listed twice", g.Product)
		}
		products[g.Product] = true
		if g.Count < 1 {
			n := at("spec", "expectedGPUs", idx, "count")
			e.at(n.Line, n.Column, "expected GPU count must be at least 1")
		}
	}
}

func presetNames(f *Fleet) string {
	names := f.PresetNames()
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// checkUniqueNames reports every cluster that claims a worker name another cluster owns:
// the directory of that name owns it, or else the first directory in order. A cluster
// that claims the name of another directory has an error of its own already, and must
// not take a valid cluster down with it. With names, only the clusters that claim one
// of them are checked again: the directories of those names and the clusters named
// otherwise than their directory, a handful where the fleet has thousands.
func (f *Fleet) checkUniqueNames(names ...string) {
	claims := map[string][]*Cluster{}
	claim := func(c *Cluster) {
		if c == nil || c.Object == nil || c.Object.Name == "" {
			return
		}
		if len(names) > 0 && !slices.Contains(names, c.Object.Name) {
			return
		}
		if slices.Contains(claims[c.Object.Name], c) {
			return // a misnamed cluster in the directory of one of names
		}
		c.Errors = slices.DeleteFunc(c.Errors, isDuplicateName)
		claims[c.Object.Name] = append(claims[c.Object.Name], c)
	}
	if len(names) == 0 {
		for _, c := range f.Clusters {
			claim(c)
		}
	} else {
		for _, n := range names {
			claim(f.Clusters[n])
		}
		for d := range f.misnamed {
			claim(f.Clusters[d])
		}
	}
	for name, cs := range claims {
		if len(cs) < 2 {
			continue
		}
		slices.SortFunc(cs, func(a, b *Cluster) int {
			switch {
			case a.Name == name:
				return -1
			case b.Name == name:
				return 1
			}
			return strings.Compare(a.Name, b.Name)
		})
		for _, c := range cs[1:] {
			c.Errors = append(c.Errors, Error{
				File: path.Join(c.Dir, ClusterFile), Line: c.nameLine, Column: c.nameColumn, Cluster: c.Name,
				Message: fmt.Sprintf("worker name %q is already used by %s", name, cs[0].Dir),
			})
		}
	}
}

func isDuplicateName(e Error) bool {
	return path.Base(e.File) == ClusterFile && strings.HasPrefix(e.Message, "worker name ") &&
		strings.Contains(e.Message, " is already used by ")
}

// reservedNamespace says why ns can never be a workload namespace, or "". The hub's Kueue
// creates and deletes jobs in the workload namespaces of every worker: in kube-* or the
// components' namespaces they could run as those namespaces' ServiceAccounts and mount
// their Secrets, and default is where a cluster's stray objects land. The agent refuses
// the system namespaces and its own again, whatever the hub sends (agent/proxy).
func reservedNamespace(ns string) string {
	switch {
	case strings.HasPrefix(ns, "kube-"):
		return "a Kubernetes system namespace"
	case ns == "default":
		return "the default namespace"
	case ns == "kueue-system" || ns == "jobset-system":
		return "where the worker's Kueue and JobSet run"
	}
	return ""
}
