package installer

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

//go:embed RBAC.md
var rbacDoc []byte

// RBAC is what the installer needs on a worker: a ClusterRole for the charts'
// cluster-scoped objects, and a Role in each namespace where it writes.
type RBAC struct {
	ClusterRole *rbacv1.ClusterRole
	// Roles are in the order RBAC.md gives them, each with its namespace.
	Roles []*rbacv1.Role
}

// DocumentedRBAC is the RBAC that RBAC.md documents as what installing, upgrading,
// adopting and uninstalling the components need: one source for the document, the
// agent's chart and the tests that run the installer under it.
func DocumentedRBAC() (RBAC, error) {
	_, block, ok := bytes.Cut(rbacDoc, []byte("```yaml\n"))
	if ok {
		block, _, ok = bytes.Cut(block, []byte("```"))
	}
	if !ok {
		return RBAC{}, errors.New("installer: RBAC.md has no yaml block")
	}
	var out RBAC
	for i, doc := range bytes.Split(block, []byte("\n---\n")) {
		var head struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return RBAC{}, fmt.Errorf("installer: RBAC.md's document %d: %w", i+1, err)
		}
		switch head.Kind {
		case "ClusterRole":
			if out.ClusterRole != nil {
				return RBAC{}, fmt.Errorf("installer: RBAC.md's document %d is a second ClusterRole", i+1)
			}
			out.ClusterRole = &rbacv1.ClusterRole{}
			if err := yaml.UnmarshalStrict(doc, out.ClusterRole); err != nil {
				return RBAC{}, fmt.Errorf("installer: RBAC.md's ClusterRole: %w", err)
			}
		case "Role":
			role := &rbacv1.Role{}
			if err := yaml.UnmarshalStrict(doc, role); err != nil {
				return RBAC{}, fmt.Errorf("installer: RBAC.md's document %d, a Role: %w", i+1, err)
			}
			if role.Namespace == "" {
				return RBAC{}, fmt.Errorf("installer: RBAC.md's Role %s names no namespace", role.Name)
			}
			out.Roles = append(out.Roles, role)
		default:
			return RBAC{}, fmt.Errorf("installer: RBAC.md's document %d is a %q, not a ClusterRole or Role", i+1, head.Kind)
		}
	}
	if out.ClusterRole == nil {
		return RBAC{}, errors.New("installer: RBAC.md has no ClusterRole")
	}
	return out, nil
}
