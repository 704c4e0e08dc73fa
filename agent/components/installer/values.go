package installer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/agent/components"
)

// pullPolicy of the release images: a release tag, let alone a digest, never moves, so
// the charts' default of Always (right for their staging images) would only make every
// node ask the registry again.
const pullPolicy = "IfNotPresent"

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// values are the chart values flotilla sets for c: the release image from spec's
// registry, and for Kueue the integrations the hub enables. Everything else is the
// chart's default.
func values(c components.Component, ch *chart.Chart, spec components.Spec) (map[string]any, error) {
	rel := spec.Release(c)
	tag := rel.Version
	if rel.Digest != "" {
		if !digestPattern.MatchString(rel.Digest) {
			return nil, fmt.Errorf("the digest of %s %s is %q, not sha256:<64 hex digits>", c, rel.Version, rel.Digest)
		}
		// Neither chart has a digest value: both write "repository:tag", and a tag of
		// v1.2.3@sha256:... makes that repository:v1.2.3@sha256:..., a reference pinned
		// by digest that still says which release it is.
		tag += "@" + rel.Digest
	}
	image := map[string]any{
		"repository": components.Repository(c, spec.Registry),
		"tag":        tag,
		"pullPolicy": pullPolicy,
	}
	switch c {
	case components.JobSet:
		return map[string]any{"image": image}, nil
	case components.Kueue:
		vals := map[string]any{"controllerManager": map[string]any{"manager": map[string]any{"image": image}}}
		if len(spec.Frameworks) > 0 {
			cfg, err := kueueManagerConfig(ch, spec.Frameworks)
			if err != nil {
				return nil, err
			}
			vals["managerConfig"] = map[string]any{"controllerManagerConfigYaml": cfg}
		}
		return vals, nil
	}
	return nil, fmt.Errorf("no values for component %q", c)
}

// kueueManagerConfig is the chart's default Kueue Configuration with
// integrations.frameworks replaced by frameworks. The chart takes the Configuration as
// one YAML string, so a value can only replace it whole: starting from the chart's own
// keeps every other setting the chart's, at whatever version the chart is.
func kueueManagerConfig(ch *chart.Chart, frameworks []string) (string, error) {
	mc, _ := ch.Values["managerConfig"].(map[string]any)
	def, ok := mc["controllerManagerConfigYaml"].(string)
	if !ok {
		return "", fmt.Errorf("chart %s %s has no managerConfig.controllerManagerConfigYaml to set the integrations in", ch.Name(), ch.Metadata.Version)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(def), &cfg); err != nil {
		return "", fmt.Errorf("reading chart %s %s's managerConfig.controllerManagerConfigYaml: %w", ch.Name(), ch.Metadata.Version, err)
	}
	if cfg == nil {
		cfg = map[string]any{}
	}
	integrations, _ := cfg["integrations"].(map[string]any)
	if integrations == nil {
		integrations = map[string]any{}
	}
	list := make([]any, len(frameworks))
	for i, f := range frameworks {
		list[i] = f
	}
	integrations["frameworks"] = list
	cfg["integrations"] = integrations
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return "", fmt.Errorf("writing Kueue's configuration: %w", err)
	}
	return string(out), nil
}

// sameValues reports whether two sets of values are equal as Helm stores them, in JSON,
// where numbers and lists lose their Go types.
func sameValues(a, b map[string]any) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}
