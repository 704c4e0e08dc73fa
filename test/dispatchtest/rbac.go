package dispatchtest

import (
	"context"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/proxy"
)

// AgentServiceAccount is the agent's own ServiceAccount, as the chart names it.
const AgentServiceAccount = "flotilla-agent"

// DispatchClusterRole is the ClusterRole of the dispatch identity's namespaced rules, as
// the chart names it for a release named flotilla-agent: what agent/proxy.Options
// .ClusterRole names, and the agent binds in each workload namespace.
const DispatchClusterRole = "flotilla-agent-dispatch"

// tokenLifetime is how long the agent's token is valid: longer than any test or demo.
const tokenLifetime = 24 * time.Hour

// grantTimeout bounds the wait for the API server's authorizer to see the bindings.
const grantTimeout = time.Minute

// InstallAgentRBAC creates, on the worker that admin reaches, the agent's ServiceAccount
// and the chart's dispatch RBAC in namespace (which it creates when missing), as
// charts/flotilla-agent/templates/dispatch.yaml does for the allowlist of integrations
// (nil: proxy.DefaultIntegrations): flotilla-dispatch bound across namespaces to
// proxy.ClusterPolicyRules, DispatchClusterRole holding proxy.NamespacedPolicyRules for
// the agent to bind in the workload namespaces, the agent's right to write those
// RoleBindings, and a Role that lets the agent impersonate that one account. It waits
// until the authorizer grants them, and returns cfg's server and CA with a token of the
// agent's ServiceAccount: what agent/proxy.Options.Config gets in the agent's pod.
// Objects that exist already are kept, so a second call is harmless.
func InstallAgentRBAC(ctx context.Context, admin client.Client, cfg *rest.Config, namespace string, integrations []proxy.Integration) (*rest.Config, error) {
	if integrations == nil {
		integrations = proxy.DefaultIntegrations()
	}
	dispatchName := DispatchClusterRole
	watchName := DispatchClusterRole + "-watch"
	binderName := DispatchClusterRole + "-binder"
	impersonateName := "flotilla-agent-impersonate-dispatch"
	agentSubject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: AgentServiceAccount}
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: AgentServiceAccount}},
		// Nothing runs as this account: it is only impersonated.
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: proxy.DefaultServiceAccount},
			AutomountServiceAccountToken: ptr.To(false)},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: dispatchName}, Rules: proxy.NamespacedPolicyRules(proxy.Allowlist(integrations))},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: watchName}, Rules: proxy.ClusterPolicyRules(proxy.Allowlist(integrations))},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: watchName},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: watchName},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: proxy.DefaultServiceAccount}}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: binderName}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"rolebindings"}, Verbs: []string{"list"}},
			{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"rolebindings"}, ResourceNames: []string{dispatchName}, Verbs: []string{"get", "create", "patch", "delete"}},
			{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"clusterroles"}, ResourceNames: []string{dispatchName}, Verbs: []string{"bind"}},
		}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: binderName},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: binderName},
			Subjects: []rbacv1.Subject{agentSubject}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: impersonateName},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"serviceaccounts"},
				ResourceNames: []string{proxy.DefaultServiceAccount}, Verbs: []string{"impersonate"}}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: impersonateName},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: impersonateName},
			Subjects: []rbacv1.Subject{agentSubject}},
	}
	for _, o := range objs {
		if err := admin.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating %T %s/%s: %w", o, o.GetNamespace(), o.GetName(), err)
		}
	}
	agentUser := "system:serviceaccount:" + namespace + ":" + AgentServiceAccount
	dispatchUser := "system:serviceaccount:" + namespace + ":" + proxy.DefaultServiceAccount
	for _, g := range []struct {
		user string
		attr authorizationv1.ResourceAttributes
	}{
		{agentUser, authorizationv1.ResourceAttributes{Resource: "serviceaccounts", Verb: "impersonate", Namespace: namespace, Name: proxy.DefaultServiceAccount}},
		{dispatchUser, authorizationv1.ResourceAttributes{Group: "kueue.x-k8s.io", Resource: "workloads", Verb: "watch"}},
		{agentUser, authorizationv1.ResourceAttributes{Group: rbacv1.GroupName, Resource: "clusterroles", Verb: "bind", Name: dispatchName}},
	} {
		if err := waitGranted(ctx, admin, g.user, g.attr); err != nil {
			return nil, err
		}
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: AgentServiceAccount}}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(tokenLifetime / time.Second))}}
	if err := admin.SubResource("token").Create(ctx, sa, tr); err != nil {
		return nil, fmt.Errorf("requesting a token of ServiceAccount %s/%s: %w", namespace, AgentServiceAccount, err)
	}
	out := rest.AnonymousClientConfig(cfg)
	out.BearerToken = tr.Status.Token
	return out, nil
}

// waitGranted waits until the RBAC authorizer, which sees new bindings through its
// informers a moment after they are stored, allows user attr.
func waitGranted(ctx context.Context, admin client.Client, user string, attr authorizationv1.ResourceAttributes) error {
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, grantTimeout, true, func(ctx context.Context) (bool, error) {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &attr}}
		if err := admin.Create(ctx, review); err != nil {
			return false, err
		}
		return review.Status.Allowed, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %s to be allowed to %s %s: %w", user, attr.Verb, attr.Resource, err)
	}
	return nil
}
