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

// The names RBAC.md gives the installer's roles; the agent's chart names them after its
// release.
const (
	// rbacName is the roles that name what the installer writes.
	rbacName = "flotilla-components"
	// controllersName is the roles that hold what the charts' roles grant.
	controllersName = "flotilla-components-controllers"
)

// RBAC is what the installer needs on a worker: a ClusterRole for the charts'
// cluster-scoped objects and a Role in each namespace where it writes, by name; and,
// so that it may write the charts' roles and bindings without escalate or bind, the
// permissions those roles grant.
type RBAC struct {
	ClusterRole *rbacv1.ClusterRole
	// Roles are in the order RBAC.md gives them, each with its namespace.
	Roles []*rbacv1.Role
	// Controllers grants, cluster-wide, what the charts' ClusterRoles grant, but for the
	// aggregated ones, which no rule can hold.
	Controllers *rbacv1.ClusterRole
	// ControllersRoles grant, each in its namespace, what the charts' Roles there grant.
	ControllersRoles []*rbacv1.Role
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
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return RBAC{}, fmt.Errorf("installer: RBAC.md's document %d: %w", i+1, err)
		}
		if head.Metadata.Name != rbacName && head.Metadata.Name != controllersName {
			return RBAC{}, fmt.Errorf("installer: RBAC.md's document %d is named %q, not %s or %s", i+1, head.Metadata.Name, rbacName, controllersName)
		}
		controllers := head.Metadata.Name == controllersName
		switch head.Kind {
		case "ClusterRole":
			role := &rbacv1.ClusterRole{}
			if err := yaml.UnmarshalStrict(doc, role); err != nil {
				return RBAC{}, fmt.Errorf("installer: RBAC.md's ClusterRole %s: %w", role.Name, err)
			}
			into := &out.ClusterRole
			if controllers {
				into = &out.Controllers
			}
			if *into != nil {
				return RBAC{}, fmt.Errorf("installer: RBAC.md's document %d is a second ClusterRole %s", i+1, role.Name)
			}
			*into = role
		case "Role":
			role := &rbacv1.Role{}
			if err := yaml.UnmarshalStrict(doc, role); err != nil {
				return RBAC{}, fmt.Errorf("installer: RBAC.md's document %d, a Role: %w", i+1, err)
			}
			if role.Namespace == "" {
				return RBAC{}, fmt.Errorf("installer: RBAC.md's Role %s names no namespace", role.Name)
			}
			if controllers {
				out.ControllersRoles = append(out.ControllersRoles, role)
			} else {
				out.Roles = append(out.Roles, role)
			}
		default:
			return RBAC{}, fmt.Errorf("installer: RBAC.md's document %d is a %q, not a ClusterRole or Role", i+1, head.Kind)
		}
	}
	if out.ClusterRole == nil || out.Controllers == nil {
		return RBAC{}, fmt.Errorf("installer: RBAC.md lacks the ClusterRole %s or %s", rbacName, controllersName)
	}
	return out, nil
}
