package fleet

import (
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
)

// checkCredentialLifetime checks the credential lifetime at path (a mapping entry under
// spec) from the YAML itself, before the document is decoded, so that a value Go cannot
// read as a duration, such as 90d, is placed at its own line with how to write it rather
// than failing the whole decode at the top of the file. A bad value is left out of the
// decode by edits; ok is false then.
func checkCredentialLifetime(root *yaml.Node, edits *jsonEdits, e errs, path ...string) bool {
	n := valueAt(root, path...)
	if n == nil || n.ShortTag() == "!!null" {
		return true
	}
	field := "spec.credentialLifetime"
	msg := ""
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		msg = fmt.Sprintf("%s must be a duration such as 2160h (90 days)", field)
	} else if d, err := time.ParseDuration(n.Value); err != nil {
		msg = fmt.Sprintf("%s %q is not a duration: write it in hours, e.g. 2160h for 90 days", field, n.Value)
	} else if msg = lifetimeProblem(d); msg != "" {
		msg = fmt.Sprintf("%s %s %s", field, n.Value, msg)
	}
	if msg == "" {
		return true
	}
	// At the key, as every other field's error.
	k := locate(root, path...)
	e.at(k.Line, k.Column, "%s", msg)
	edits.leaveOut(n)
	return false
}

// lifetimeProblem says what is wrong with a credential lifetime, or "".
func lifetimeProblem(d time.Duration) string {
	switch {
	case d < v1alpha1.MinCredentialLifetime:
		return fmt.Sprintf("is shorter than %s: the hub needs room to rotate a credential before it runs out", hours(v1alpha1.MinCredentialLifetime))
	case d > v1alpha1.MaxCredentialLifetime:
		return fmt.Sprintf("is longer than %s (%d days): a credential that leaks should not stay good for longer", hours(v1alpha1.MaxCredentialLifetime), v1alpha1.MaxCredentialLifetime/(24*time.Hour))
	}
	return ""
}

func hours(d time.Duration) string { return fmt.Sprintf("%dh", d/time.Hour) }

// CredentialLifetime is the lifetime of the cluster's agent credentials as Git declares
// it: its cluster.yaml's, else fleet.yaml's; nil when neither says, which the hub's
// tunnel reads as v1alpha1.DefaultCredentialLifetime. The fleet and the cluster must be
// valid.
func CredentialLifetime(f *Fleet, c *Cluster) *metav1.Duration {
	if c.Object != nil && c.Object.Spec.CredentialLifetime != nil {
		return c.Object.Spec.CredentialLifetime.DeepCopy()
	}
	if f.Spec != nil && f.Spec.Spec.CredentialLifetime != nil {
		return f.Spec.Spec.CredentialLifetime.DeepCopy()
	}
	return nil
}
