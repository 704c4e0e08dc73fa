package installer

import (
	"bytes"
	"fmt"

	"helm.sh/helm/v4/pkg/kube"
	"sigs.k8s.io/kustomize/kyaml/kio"
	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/flotilla-gitops/flotilla/agent/components"
)

// InstalledByAnnotation marks the CRDs the installer installed, with the value
// components.BinaryName. CRDs outlive their release on purpose; the mark is how a later
// run tells the ones it left behind from a Kueue or JobSet installed by someone else,
// and installs over its own without asking for adoption.
const InstalledByAnnotation = "flotilla.dev/installed-by"

// keepCRDs is the post-renderer of both charts. Kueue keeps its CRDs in templates/, so
// Helm upgrades them, but an uninstall would also delete them and with them every
// ClusterQueue, Workload and LocalQueue on the worker: each CRD gets
// helm.sh/resource-policy: keep, which Helm's uninstall honours, and the installer's mark.
type keepCRDs struct{}

func (keepCRDs) Run(rendered *bytes.Buffer) (*bytes.Buffer, error) {
	nodes, err := kio.ParseAll(rendered.String())
	if err != nil {
		return nil, fmt.Errorf("reading the rendered chart: %w", err)
	}
	for _, n := range nodes {
		if n.GetKind() != "CustomResourceDefinition" {
			continue
		}
		for k, v := range map[string]string{kube.ResourcePolicyAnno: kube.KeepPolicy, InstalledByAnnotation: components.BinaryName} {
			if err := n.PipeE(kyaml.SetAnnotation(k, v)); err != nil {
				return nil, fmt.Errorf("annotating CustomResourceDefinition %s: %w", n.GetName(), err)
			}
		}
	}
	out, err := kio.StringAll(nodes)
	if err != nil {
		return nil, fmt.Errorf("writing the rendered chart: %w", err)
	}
	return bytes.NewBufferString(out), nil
}
