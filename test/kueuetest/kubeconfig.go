package kueuetest

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

// KubeConfigKey is the key of a MultiKueue cluster's kubeconfig in its Secret.
const KubeConfigKey = "kubeconfig"

// tokenLifetime is how long a token from TokenKubeConfig is valid: longer than any test.
const tokenLifetime = 24 * time.Hour

// TokenKubeConfig returns a kubeconfig for plane in the form Kueue's MultiKueue accepts for a
// worker: an https server, inline CA data and an inline bearer token (it refuses token files, CA
// file paths, basic auth, exec plugins and auth providers). The token is that of the
// ServiceAccount name in Namespace, created on plane and bound to cluster-admin: a stand-in for a
// worker's real MultiKueue identity, for tests about something else. It returns once the API
// server's authorizer grants the binding.
func TokenKubeConfig(ctx context.Context, plane *controlplane.ControlPlane, name string) ([]byte, error) {
	fail := func(err error) ([]byte, error) {
		return nil, fmt.Errorf("making a token kubeconfig for ServiceAccount %s/%s on %s: %w", Namespace, name, plane.Name, err)
	}
	if err := ensureNamespace(ctx, plane, Namespace); err != nil {
		return fail(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name}}
	if err := plane.Client.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		return fail(err)
	}
	bindingName := "kueuetest-" + name
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: bindingName},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: Namespace, Name: name}},
	}
	if err := plane.Client.Create(ctx, binding); err != nil && !apierrors.IsAlreadyExists(err) {
		return fail(err)
	}
	if err := waitGranted(ctx, plane, "system:serviceaccount:"+Namespace+":"+name); err != nil {
		return fail(err)
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(int64(tokenLifetime / time.Second)),
	}}
	if err := plane.Client.SubResource("token").Create(ctx, sa, req); err != nil {
		return fail(err)
	}
	server := plane.Config.Host
	if !strings.Contains(server, "://") {
		server = "https://" + server
	}
	if u, err := url.Parse(server); err != nil || u.Scheme != "https" {
		return fail(fmt.Errorf("the plane's server %q is not an https URL", plane.Config.Host))
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[plane.Name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: plane.Config.CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: req.Status.Token}
	cfg.Contexts[plane.Name] = &clientcmdapi.Context{Cluster: plane.Name, AuthInfo: name}
	cfg.CurrentContext = plane.Name
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fail(err)
	}
	return data, nil
}

// waitGranted waits until the RBAC authorizer, which sees new bindings through its informers a
// moment after they are stored, lets user list Workloads everywhere.
func waitGranted(ctx context.Context, plane *controlplane.ControlPlane, user string) error {
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               user,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Group: "kueue.x-k8s.io", Resource: "workloads", Verb: "watch"},
		}}
		if err := plane.Client.Create(ctx, review); err != nil {
			return false, err
		}
		return review.Status.Allowed, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %s to be granted cluster-admin: %w", user, err)
	}
	return nil
}
