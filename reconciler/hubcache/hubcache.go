// Package hubcache is the hub's informer cache of the hub cluster: the WorkerClusters
// flotilla manages and the tunnel's Secrets, in the sources' namespaces only. The
// hub's reconciler, its status writer and the tunnel read from it, so that a sync, an
// agent's authentication or a metrics scrape costs the hub cluster's API nothing
// however large the fleet.
package hubcache

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
)

// syncTimeout bounds the first list of what the cache holds.
const syncTimeout = 2 * time.Minute

// Start starts an informer cache of the WorkerClusters flotilla manages and of
// the tunnel's Secrets (agent credentials and records of redeemed tokens, all labelled
// with the worker's identity), with WorkerClusters indexed by identity
// (tunnel.IndexIdentities), and returns once it holds them. The tunnel
// authenticates agents from it and /metrics counts clusters from it: neither a refused
// agent nor a scrape costs the hub cluster's API a request. It watches only the
// namespaces given, the sources', so that the hub needs no right to list the Secrets of
// any other namespace: RBAC cannot bound a list by label.
func Start(ctx context.Context, rc *rest.Config, scheme *runtime.Scheme, namespaces []string) (cache.Cache, error) {
	managed := labels.SelectorFromSet(labels.Set{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue})
	hasIdentity, err := labels.NewRequirement(v1alpha1.WorkerClusterLabel, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	watched := map[string]cache.Config{}
	for _, ns := range namespaces {
		watched[ns] = cache.Config{}
	}
	c, err := cache.New(rc, cache.Options{
		Scheme:            scheme,
		DefaultNamespaces: watched,
		ByObject: map[client.Object]cache.ByObject{
			&v1alpha1.WorkerCluster{}: {Label: managed},
			&corev1.Secret{}:          {Label: labels.NewSelector().Add(*hasIdentity)},
		},
		// Nothing reads managed fields; ten thousand clusters' worth would be most of
		// the cache.
		DefaultTransform: cache.TransformStripManagedFields(),
		// A read of anything else must fail loudly, not quietly start caching every
		// Secret of the cluster.
		ReaderFailOnMissingInformer: true,
	})
	if err != nil {
		return nil, fmt.Errorf("the cache of WorkerClusters and agent Secrets: %w", err)
	}
	if err := tunnel.IndexIdentities(ctx, c); err != nil {
		return nil, fmt.Errorf("the cache of WorkerClusters and agent Secrets: %w", err)
	}
	for _, obj := range []client.Object{&v1alpha1.WorkerCluster{}, &corev1.Secret{}} {
		if _, err := c.GetInformer(ctx, obj); err != nil {
			return nil, fmt.Errorf("the cache of WorkerClusters and agent Secrets: %w", err)
		}
	}
	go func() { _ = c.Start(ctx) }()
	sctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	if !c.WaitForCacheSync(sctx) {
		return nil, fmt.Errorf("the cache of WorkerClusters and agent Secrets did not fill within %s: can the hub list and watch both?", syncTimeout)
	}
	return c, nil
}
