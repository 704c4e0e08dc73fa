package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/conditions"
	"github.com/flotilla-gitops/flotilla/reconciler/dispatch"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets/servingca"
)

// dispatchParts are what dispatch adds to the hub: the API proxy's server and CA, and
// the dispatcher of the tenants' Kueue objects.
type dispatchParts struct {
	authority  *servingca.Authority
	dispatcher *dispatch.Dispatcher
	server     *http.Server
	// limit bounds the proxy's connections.
	limit limitOptions
	// everyReplica says that every replica serves the proxy (dispatch.leaderURL), not
	// only the leader.
	everyReplica bool
}

// newDispatch makes the proxy's CA, the proxy and the dispatcher; serveProxy loads or
// creates the CA, on the leader or on every replica.
func newDispatch(cfg *Config, c client.Client, tun *tunnel.Server, status *conditions.Writer, m *metrics, log *slog.Logger) (*dispatchParts, error) {
	d := cfg.Dispatch
	u, _ := url.Parse(d.URL) // checked with the configuration
	hosts := []string{u.Hostname()}
	if d.LeaderURL != "" {
		// The replicas reach the leader by a name of its own, which the one
		// certificate every replica serves must name too.
		lu, _ := url.Parse(d.LeaderURL)
		hosts = append(hosts, lu.Hostname())
	}
	authority, err := servingca.New(servingca.Options{Client: c, Secret: types.NamespacedName{Namespace: d.Namespace, Name: d.CASecret},
		Hosts: hosts, Labels: map[string]string{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue}, Log: log})
	if err != nil {
		return nil, err
	}
	dispatcher, err := dispatch.New(dispatch.Options{Client: c, Tokens: tun, ProxyURL: d.URL, ProxyPath: tunnel.ProxyURL,
		Trust: authority.Bundle, KueueNamespace: d.KueueNamespace, Status: status, Log: log})
	if err != nil {
		return nil, err
	}
	popts := tunnel.ProxyOptions{ResumeWindow: time.Duration(d.ResumeWindow), Log: log}
	if d.LeaderURL != "" {
		popts.Leader, popts.LeaderTrust = d.LeaderURL, authority.Bundle
	}
	proxy, err := tunnel.NewProxy(tun, popts)
	if err != nil {
		return nil, err
	}
	lim := cfg.Connections.Proxy
	return &dispatchParts{authority: authority, dispatcher: dispatcher, server: proxyServer(d.Listen, proxy, authority.GetCertificate, lim),
		limit: limitOptions{Name: "proxy", Max: lim.Max, Counts: m.connections("proxy", lim.Max), Log: log}, everyReplica: d.LeaderURL != ""}, nil
}

// serve runs what dispatch does on the leader until ctx ends: the proxy too, unless
// every replica serves it (serveProxy), and the watch of Kueue's judgements.
func (p *dispatchParts) serve(ctx context.Context, rc *rest.Config, scheme *runtime.Scheme, log *slog.Logger) error {
	if err := p.watchKueue(ctx, rc, scheme, log); err != nil {
		return err
	}
	if p.everyReplica {
		<-ctx.Done()
		return nil
	}
	return p.serveProxy(ctx, log)
}

// serveProxy runs the proxy and the CA's rotation until ctx ends. Replicas that run it
// at once agree on the CA through its Secret (servingca).
func (p *dispatchParts) serveProxy(ctx context.Context, log *slog.Logger) error {
	if err := p.authority.Reconcile(ctx); err != nil {
		return err
	}
	l, err := listen(ctx, p.server.Addr, p.limit)
	if err != nil {
		return fmt.Errorf("the API proxy's listener: %w", err)
	}
	go p.authority.Run(ctx, time.Hour)
	errc := make(chan error, 1)
	go func() { errc <- p.server.ServeTLS(l, "", "") }()
	log.Info("serving the API proxy", "address", l.Addr().String(), "everyReplica", p.everyReplica)
	select {
	case <-ctx.Done():
		_ = p.server.Close()
		return nil
	case err := <-errc:
		return fmt.Errorf("the API proxy: %w", err)
	}
}

// watchKueue carries every change of the MultiKueueClusters flotilla made over to
// their WorkerClusters.
func (p *dispatchParts) watchKueue(ctx context.Context, rc *rest.Config, scheme *runtime.Scheme, log *slog.Logger) error {
	c, err := cache.New(rc, cache.Options{Scheme: scheme,
		ByObject:         map[client.Object]cache.ByObject{&kueue.MultiKueueCluster{}: {Label: labels.SelectorFromSet(labels.Set{v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue})}},
		DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return fmt.Errorf("watching MultiKueueClusters: %w", err)
	}
	inf, err := c.GetInformer(ctx, &kueue.MultiKueueCluster{})
	if err != nil {
		return fmt.Errorf("watching MultiKueueClusters (is Kueue installed on the hub?): %w", err)
	}
	judge := func(obj any) {
		if mc, ok := obj.(*kueue.MultiKueueCluster); ok {
			if err := p.dispatcher.Judged(ctx, mc); err != nil && ctx.Err() == nil {
				log.Error("recording Kueue's judgement of a worker", "multiKueueCluster", mc.Name, "error", err)
			}
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: judge, UpdateFunc: func(_, n any) { judge(n) }}); err != nil {
		return err
	}
	go func() { _ = c.Start(ctx) }()
	return nil
}
