package apply

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

// DocumentedRole is the ClusterRole that RBAC.md documents as what applying and pruning
// need: one source for the document, the agent's chart and the tests that run the
// applier under it.
func DocumentedRole() (*rbacv1.ClusterRole, error) {
	_, block, ok := bytes.Cut(rbacDoc, []byte("```yaml\n"))
	if ok {
		block, _, ok = bytes.Cut(block, []byte("```"))
	}
	if !ok {
		return nil, errors.New("apply: RBAC.md has no yaml block")
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.UnmarshalStrict(block, role); err != nil {
		return nil, fmt.Errorf("apply: RBAC.md's ClusterRole: %w", err)
	}
	return role, nil
}
