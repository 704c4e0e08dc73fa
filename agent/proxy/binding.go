package proxy

import (
	"context"
	"errors"
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	rbacv1client "k8s.io/client-go/kubernetes/typed/rbac/v1"
	"k8s.io/client-go/rest"
)

// BindingLabel marks the RoleBindings the agent writes for the dispatch identity; its
// value is the agent's namespace, so that two agents on one worker (two tenants) never
// remove each other's.
const BindingLabel = "flotilla.dev/dispatch-binding"

// bindingFieldManager is the field manager of those RoleBindings.
const bindingFieldManager = "flotilla-agent-dispatch"

// binder keeps one RoleBinding of the dispatch identity's namespaced ClusterRole in each
// namespace of the proxy's scope, and none in any other: the API server then refuses
// what the agent refuses by namespace, should the agent ever let it through. It writes
// as the agent itself, which the chart lets write RoleBindings of that one name and bind
// that one ClusterRole, nothing more (charts/flotilla-agent/templates/dispatch.yaml).
type binder struct {
	rbac        rbacv1client.RbacV1Interface
	clusterRole string // also the RoleBindings' name
	namespace   string // the agent's
	subject     *rbacv1ac.SubjectApplyConfiguration
}

func newBinder(cfg *rest.Config, clusterRole, namespace, serviceAccount string) (*binder, error) {
	c, err := rbacv1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("proxy: the RBAC client of the worker's API server: %w", err)
	}
	return &binder{
		rbac:        c,
		clusterRole: clusterRole,
		namespace:   namespace,
		subject:     rbacv1ac.Subject().WithKind(rbacv1.ServiceAccountKind).WithNamespace(namespace).WithName(serviceAccount),
	}, nil
}

// bind applies the RoleBinding in ns. Without Force: a RoleBinding of that name that
// someone else wrote differently is a conflict, and the namespace stays out of scope.
func (b *binder) bind(ctx context.Context, ns string) error {
	rb := rbacv1ac.RoleBinding(b.clusterRole, ns).
		WithLabels(map[string]string{BindingLabel: b.namespace, "app.kubernetes.io/managed-by": "flotilla-agent"}).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName(b.clusterRole)).
		WithSubjects(b.subject)
	if _, err := b.rbac.RoleBindings(ns).Apply(ctx, rb, metav1.ApplyOptions{FieldManager: bindingFieldManager}); err != nil {
		return fmt.Errorf("RoleBinding %s/%s: %w", ns, b.clusterRole, err)
	}
	return nil
}

// unbindExcept deletes the agent's RoleBindings outside keep, each only if it is still
// the one listed (a UID precondition).
func (b *binder) unbindExcept(ctx context.Context, keep map[string]bool) error {
	list, err := b.rbac.RoleBindings(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: BindingLabel + "=" + b.namespace})
	if err != nil {
		return fmt.Errorf("listing the dispatch RoleBindings: %w", err)
	}
	var errs []error
	for _, rb := range list.Items {
		if keep[rb.Namespace] || rb.Name != b.clusterRole {
			continue
		}
		err := b.rbac.RoleBindings(rb.Namespace).Delete(ctx, rb.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(rb.UID))})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting RoleBinding %s/%s: %w", rb.Namespace, rb.Name, err))
		}
	}
	return errors.Join(errs...)
}
