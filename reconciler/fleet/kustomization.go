package fleet

import (
	"fmt"
	"path"
	"strings"

	"sigs.k8s.io/kustomize/api/types"
)

// allowedKustomizeFields are the kustomization fields a preset or cluster overlay may use:
// those that only reshape the objects in the repository. Everything else could run a
// program, load remote content or place objects where flotilla does not expect them.
var allowedKustomizeFields = map[string]bool{
	"apiVersion": true, "kind": true, "metadata": true,
	"resources": true, "components": true,
	"patches": true,
	"labels":  true, "commonLabels": true, "commonAnnotations": true,
	"namePrefix": true, "nameSuffix": true, "replacements": true,
}

var refusedKustomizeFields = map[string]string{
	"generators":                  "it runs plugins",
	"transformers":                "it runs plugins",
	"validators":                  "it runs plugins",
	"helmCharts":                  "it runs Helm and fetches charts",
	"helmGlobals":                 "it runs Helm and fetches charts",
	"helmChartInflationGenerator": "it runs Helm and fetches charts",
	"openapi":                     "it loads schemas from outside the repository",
	"configurations":              "it changes kustomize's own configuration",
	"crds":                        "it changes kustomize's own configuration",
	"namespace":                   "flotilla places namespaced objects in the fleet's workload namespaces",
	"secretGenerator":             "secrets do not belong in a fleet repository unencrypted",
	"configMapGenerator":          "Kueue's objects need no ConfigMaps",
	"bases":                       "it is deprecated; list the directory under resources",
	"vars":                        "it is deprecated; use replacements",
	"patchesStrategicMerge":       "it is deprecated; list the patch under patches",
	"patchesJson6902":             "it is deprecated; list the patch under patches",
}

// checkKustomization validates a kustomization.yaml of a preset (dir "") or of a cluster
// (dir clusters/<name>). Every path it names must stay inside one of roots and exist in
// the repository, so that kustomize never reads anything else and never fetches a URL.
func checkKustomization(f *Fleet, file string, data []byte, cluster string, roots []string, overlay bool, list *ErrorList) {
	clusterName := ""
	if cluster != "" {
		clusterName = path.Base(cluster)
	}
	e := errs{file: file, cluster: clusterName, list: list}
	root, ok := singleDocument(data, e)
	if !ok {
		return
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k := root.Content[i]
		if allowedKustomizeFields[k.Value] {
			continue
		}
		if why, refused := refusedKustomizeFields[k.Value]; refused {
			e.at(k.Line, k.Column, "%s is not allowed in a fleet kustomization: %s", k.Value, why)
		} else {
			e.at(k.Line, k.Column, "unknown field %q", k.Value)
		}
		ok = false
	}
	if !ok {
		return
	}
	var k types.Kustomization
	if !decodeStrict(root, &k, e) {
		return
	}
	if k.Kind != "" && k.Kind != types.KustomizationKind && k.Kind != types.ComponentKind {
		n := locate(root, "kind")
		e.at(n.Line, n.Column, "kind must be Kustomization or Component, not %q", k.Kind)
	}
	dir := path.Dir(file)
	files := f.presetAndClusterFiles(cluster)
	check := func(ref string, wantDir bool, p ...string) {
		n := locate(root, p...)
		if msg := checkRef(dir, ref, roots, files, wantDir); msg != "" {
			// A file that could not be read has its own error; it does exist.
			if target := path.Join(dir, ref); !hasError(*list, target) && !hasError(f.Errors, target) {
				e.at(n.Line, n.Column, "%s", msg)
			}
			return
		}
		if overlay && strings.HasPrefix(path.Join(dir, ref), PresetsDir+"/") {
			target := path.Join(dir, ref)
			if _, isPreset := f.Presets[strings.TrimPrefix(target, PresetsDir+"/")]; isPreset {
				e.at(n.Line, n.Column, "%q is a whole preset: the cluster's preset is its base already; list only patches and extra objects", ref)
			}
		}
	}
	for i, r := range k.Resources {
		check(r, false, "resources", fmt.Sprintf("[%d]", i))
	}
	for i, r := range k.Components {
		check(r, true, "components", fmt.Sprintf("[%d]", i))
	}
	for i, p := range k.Patches {
		if p.Path != "" {
			check(p.Path, false, "patches", fmt.Sprintf("[%d]", i), "path")
		}
	}
	for i, r := range k.Replacements {
		if r.Path != "" {
			check(r.Path, false, "replacements", fmt.Sprintf("[%d]", i), "path")
		}
	}
}

// checkRef says what is wrong with a path a kustomization names, or "" when it is fine.
func checkRef(dir, ref string, roots []string, files map[string][]byte, wantDir bool) string {
	if strings.Contains(ref, "://") || strings.HasPrefix(ref, "git@") || strings.HasPrefix(ref, "ssh:") {
		return fmt.Sprintf("%q is remote; kustomizations in a fleet may only name files in the repository", ref)
	}
	if path.IsAbs(ref) {
		return fmt.Sprintf("%q is an absolute path; name files relative to %s", ref, dir)
	}
	target := path.Join(dir, ref)
	inside := false
	for _, r := range roots {
		if target == r || strings.HasPrefix(target, r+"/") {
			inside = true
		}
	}
	if !inside {
		return fmt.Sprintf("%q resolves to %s, outside %s; overlays may only name files in their own directory and presets/", ref, target, strings.Join(roots, " and "))
	}
	if _, isFile := files[target]; isFile {
		if wantDir {
			return fmt.Sprintf("%q is a file; a component is a directory with a kustomization.yaml", ref)
		}
		return ""
	}
	if _, isDir := files[path.Join(target, KustomizationFile)]; isDir {
		return ""
	}
	for p := range files {
		if strings.HasPrefix(p, target+"/") {
			return fmt.Sprintf("directory %q has no kustomization.yaml", ref)
		}
	}
	return fmt.Sprintf("%q does not exist in the repository (remote bases are not allowed)", ref)
}

// presetAndClusterFiles is what a kustomization may name: every preset's files and, for
// an overlay, its own cluster's.
func (f *Fleet) presetAndClusterFiles(cluster string) map[string][]byte {
	files := map[string][]byte{}
	for _, p := range f.Presets {
		for k, v := range p.Files {
			files[k] = v
		}
	}
	if c, ok := f.Clusters[path.Base(cluster)]; ok && cluster != "" {
		for k, v := range c.Files {
			files[k] = v
		}
	}
	return files
}
