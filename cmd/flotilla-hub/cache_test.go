package main

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/hubcache"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	controlplane.Main(m, 1, &planes, controlplane.Options{})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestClustersAreCountedFromTheCacheWithoutARequestPerScrape(t *testing.T) {
	ctx := t.Context()
	admin := planes[0].Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant-metrics"}}
	if err := admin.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	for _, wc := range []struct {
		name    string
		managed bool
		status  metav1.ConditionStatus
	}{{"gpu-a", true, metav1.ConditionTrue}, {"gpu-b", true, metav1.ConditionFalse}, {"by-hand", false, metav1.ConditionTrue}} {
		obj := &v1alpha1.WorkerCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: wc.name, Labels: map[string]string{v1alpha1.WorkerClusterLabel: "13-metrics-" + wc.name}},
			Spec:       v1alpha1.WorkerClusterSpec{Region: "r", Residency: "eu", Preset: "gpu"},
		}
		if wc.managed {
			obj.Labels[v1alpha1.ManagedByLabel] = v1alpha1.ManagedByValue
		}
		if err := admin.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		obj.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionConnected, Status: wc.status, Reason: "Test", LastTransitionTime: metav1.Now()}}
		if err := admin.Status().Update(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	elsewhere := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "not-a-source"}}
	if err := admin.Create(ctx, elsewhere); err != nil {
		t.Fatal(err)
	}
	for _, sec := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "gpu-a-agent-credential", Labels: map[string]string{v1alpha1.WorkerClusterLabel: "13-metrics-gpu-a"}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "someone-elses"}},
		// Labelled like the tunnel's, in a namespace no source writes.
		{ObjectMeta: metav1.ObjectMeta{Namespace: elsewhere.Name, Name: "gpu-z-agent-credential", Labels: map[string]string{v1alpha1.WorkerClusterLabel: "13-metrics-gpu-z"}}},
	} {
		if err := admin.Create(ctx, sec); err != nil {
			t.Fatal(err)
		}
	}

	var requests atomic.Int64
	cfg := rest.CopyConfig(planes[0].Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			requests.Add(1)
			return rt.RoundTrip(r)
		})
	})
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cached, err := hubcache.Start(cctx, cfg, scheme, []string{ns.Name})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("the tunnel's Secrets are cached, others are not", func(t *testing.T) {
		if err := cached.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: "gpu-a-agent-credential"}, &corev1.Secret{}); err != nil {
			t.Fatalf("an agent credential Secret: %v", err)
		}
		if err := cached.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: "someone-elses"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			t.Fatalf("a Secret of someone else's = %v, want it not in the cache", err)
		}
		if err := cached.Get(ctx, client.ObjectKey{Namespace: elsewhere.Name, Name: "gpu-z-agent-credential"}, &corev1.Secret{}); err == nil {
			t.Fatal("a Secret outside the sources' namespaces is in the cache: the hub would need to read every namespace's Secrets")
		}
		if err := cached.Get(ctx, client.ObjectKey{Name: "default"}, &corev1.Namespace{}); err == nil {
			t.Fatal("the cache reads what it was not set up for instead of refusing")
		}
	})

	reg := prometheus.NewRegistry()
	newMetrics(reg, cached)
	before := requests.Load()
	for range 3 {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, f := range families {
			if f.GetName() != "flotilla_hub_clusters" {
				continue
			}
			for _, m := range f.GetMetric() {
				l := map[string]string{}
				for _, p := range m.GetLabel() {
					l[p.GetName()] = p.GetValue()
				}
				if l["namespace"] == ns.Name && l["condition"] == v1alpha1.ConditionConnected {
					got[l["status"]] = m.GetGauge().GetValue()
				}
			}
		}
		// The hand-made WorkerCluster is not flotilla's to count.
		if got["True"] != 1 || got["False"] != 1 {
			t.Fatalf("Connected counted as %v, want one True and one False", got)
		}
	}
	if n := requests.Load() - before; n != 0 {
		t.Fatalf("three scrapes sent %d requests to the hub cluster, want none", n)
	}
}
