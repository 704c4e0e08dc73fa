package fleet

import (
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/flotilla-gitops/flotilla/agent/components"
	"github.com/flotilla-gitops/flotilla/agent/proxy"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

func validateComponents(s *v1alpha1.FleetComponents, at func(path ...string) *yaml.Node, e errs) {
	if s == nil {
		return
	}
	if s.Registry != "" {
		if msg := registryProblem(s.Registry); msg != "" {
			n := at("components", "registry")
			e.at(n.Line, n.Column, "spec.components.registry %q %s", s.Registry, msg)
		}
	}
	for _, d := range []struct{ field, value string }{{"kueueDigest", s.KueueDigest}, {"jobSetDigest", s.JobSetDigest}} {
		if d.value != "" && !digestPattern.MatchString(d.value) {
			n := at("components", d.field)
			e.at(n.Line, n.Column, "spec.components.%s %q must be an image digest, sha256: and 64 hex digits", d.field, d.value)
		}
	}
}

// registryProblem says what is wrong with a registry mirror's name, or "": a host, an
// optional port and an optional path, with neither a scheme nor a tag, since the
// release's repository and tag are appended to it. The rule is the one the agents apply
// to it and to their allowed registries (components.ParseRegistry); the hub adds that
// the host is written in lower case, as the images' names will be.
func registryProblem(r string) string {
	n, err := components.ParseRegistry(r)
	if err != nil {
		return err.Error()
	}
	if n != strings.TrimSuffix(r, "/") {
		return "must be written in lower case (" + strconv.Quote(n) + ")"
	}
	return ""
}

func validateClusterComponents(s *v1alpha1.ClusterComponents, at func(path ...string) *yaml.Node, e errs) {
	if s == nil || !s.Adopt || s.Managed == nil || *s.Managed {
		return
	}
	n := at("spec", "components", "adopt")
	e.at(n.Line, n.Column, "spec.components.adopt hands Kueue and JobSet over to flotilla, which spec.components.managed: false declines: set one of them")
}

// Components is what the cluster's agent must make of Kueue and JobSet: the fleet's
// versions, managed where the fleet or the cluster says so (the cluster last), with the
// integrations the hub's MultiKueue watches on every worker. A fleet that says nothing
// leaves the workers' Kueue as it is: upgrading flotilla never starts installing Kueue
// on workers that have their own. The fleet and the cluster must be valid.
func Components(f *Fleet, c *Cluster) components.Spec {
	fs := f.Spec.Spec
	s := components.Spec{
		Kueue:      components.Release{Version: fs.KueueVersion},
		JobSet:     components.Release{Version: fs.JobSetVersion},
		Frameworks: proxy.DefaultFrameworks(),
	}
	if s.JobSet.Version == "" {
		// JobSet's kind is one MultiKueue watches: a worker without it cannot take work.
		v := components.Installable(components.JobSet)
		s.JobSet.Version = v[len(v)-1]
	}
	if fc := fs.Components; fc != nil {
		if fc.Managed != nil {
			s.Managed = *fc.Managed
		}
		s.Registry, s.Kueue.Digest, s.JobSet.Digest = fc.Registry, fc.KueueDigest, fc.JobSetDigest
	}
	if c.Object != nil && c.Object.Spec.Components != nil {
		cc := c.Object.Spec.Components
		if cc.Managed != nil {
			s.Managed = *cc.Managed
		}
		s.Adopt = cc.Adopt && s.Managed
	}
	return s
}
