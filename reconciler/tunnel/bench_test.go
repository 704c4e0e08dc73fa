package tunnel_test

import (
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"testing"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// BenchmarkRefusedRequest is what a refused upgrade request costs the hub, from the
// request to the 401, with the WorkerClusters of a fleet in the hub's cache.
func BenchmarkRefusedRequest(b *testing.B) {
	const fleet = 2000
	k := newCounted(b)
	h := startHub(b, k, nil)
	ns := "bench-refused"
	if err := admin().Create(b.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		b.Fatal(err)
	}
	var g errgroup.Group
	g.SetLimit(16)
	for i := range fleet {
		g.Go(func() error {
			return admin().Create(b.Context(), &v1alpha1.WorkerCluster{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("gpu-%04d", i), Labels: map[string]string{
					v1alpha1.ManagedByLabel: v1alpha1.ManagedByValue, v1alpha1.WorkerClusterLabel: fmt.Sprintf("5-bench-gpu-%04d", i),
				}},
				Spec: v1alpha1.WorkerClusterSpec{Region: "r", Residency: "eu", Preset: "gpu"},
			})
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	eventually(b, "the fleet in the hub's cache", func() (bool, string) {
		var list v1alpha1.WorkerClusterList
		err := k.cache.List(b.Context(), &list)
		return err == nil && len(list.Items) >= fleet, fmt.Sprint(len(list.Items), err)
	})
	c := newCluster(b, "bench-known")
	k.sees(b, c)
	h.enroll(b, c)
	other, _ := secrets.NewToken()
	for _, bc := range []struct {
		name string
		req  request
	}{
		{"malformed token", request{identity: c.identity, kind: protocol.AuthCredential, secret: "hunter2"}},
		{"unknown identity", request{identity: "99-nobody-gpu", kind: protocol.AuthCredential, secret: other.Reveal()}},
		{"wrong credential", request{identity: c.identity, kind: protocol.AuthCredential, secret: other.Reveal()}},
		{"redeemed token", request{identity: c.identity, kind: protocol.AuthEnrollment, secret: c.token.Reveal()}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			before := k.requests.Load()
			hdr := bc.req.header()
			b.ReportAllocs()
			for b.Loop() {
				r := httptest.NewRequest(http.MethodGet, protocol.Path, nil)
				r.RemoteAddr = "127.0.0.1:40000"
				r.Header = hdr
				w := httptest.NewRecorder()
				h.srv.ServeHTTP(w, r)
				if w.Code != http.StatusUnauthorized {
					b.Fatalf("answered %d, want 401", w.Code)
				}
			}
			if n := k.requests.Load() - before; n != 0 {
				b.Fatalf("%d requests to the hub cluster", n)
			}
		})
	}
}

// BenchmarkIdleWorkerWatches is what the watches MultiKueue holds open to an idle
// worker cost through the proxy: three per worker (Workloads, Jobs, JobSets, selected by
// the origin label, as Kueue opens them), over HTTP/2 and TLS. The heap and stacks
// measured are the whole process's: the proxy's, but also the test agents' ends and the
// watchers', so the figure is an upper bound of the hub's share.
func BenchmarkIdleWorkerWatches(b *testing.B) {
	const workers = 50
	h := startProxyHub(b, tunnel.ProxyOptions{MaxInFlight: 8})
	var ws []*proxied
	for i := range workers {
		ws = append(ws, h.enrollProxied(b, fmt.Sprintf("idle-%02d", i)))
	}
	paths := []string{"/apis/kueue.x-k8s.io/v1beta2/workloads", "/apis/batch/v1/jobs", "/apis/jobset.x-k8s.io/v1alpha2/jobsets"}
	// The API server answers a custom resource's first requests only once its watch
	// cache is ready.
	for _, p := range paths {
		eventually(b, p+" served", func() (bool, string) {
			code, body := h.get(b, ws[0].identity, ws[0].token.Reveal(), p+"?limit=1")
			return code == http.StatusOK, body
		})
	}
	// One request each first: the connections that every watch shares are open.
	for _, w := range ws {
		if code, body := h.get(b, w.identity, w.token.Reveal(), "/api"); code != http.StatusOK {
			b.Fatalf("%d %s", code, body)
		}
	}
	before, beforeG := inUse(), runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()
	sel := "labelSelector=" + url.QueryEscape("kueue.x-k8s.io/multikueue-origin=flotilla-hub") + "&watch=true&allowWatchBookmarks=true"
	var watchers []*watcher
	for _, w := range ws {
		for _, path := range paths {
			watchers = append(watchers, h.openWatch(b, ctx, w, path+"?"+sel))
		}
	}
	after, afterG := inUse(), runtime.NumGoroutine()
	for b.Loop() {
	}
	b.ReportMetric(float64(after-before)/workers, "B/idle-worker")
	b.ReportMetric(float64(afterG-beforeG)/workers, "goroutines/idle-worker")
	for _, w := range watchers {
		w.close()
	}
}

// inUse is the live heap and the stacks in use after a collection. The live heap, not
// the heap's spans in use, which move by whole spans with what else the process does.
func inUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc + m.StackInuse
}

// BenchmarkHubMemoryPerIdleWorker is the hub's own cost of the watches MultiKueue holds
// open to an idle worker (three: Workloads, Jobs, JobSets) through the proxy, beyond the
// worker's tunnel: the agents and the watchers run in another process, so the heap and
// stacks measured here are the hub's alone.
func BenchmarkHubMemoryPerIdleWorker(b *testing.B) {
	const workers = 200
	h := startProxyHub(b, tunnel.ProxyOptions{})
	send, expect := peersProcess(b)
	var cs []*cluster
	plan := peerPlan{HubURL: h.url()}
	for i := range workers {
		c := newCluster(b, fmt.Sprintf("mem-%03d", i))
		h.srv.Push(c.key(), c.identity, &protocol.DesiredState{Generation: 1, Hash: "h1"})
		cs = append(cs, c)
		plan.Agents = append(plan.Agents, peerAgent{Identity: c.identity, Token: c.token.Reveal()})
	}
	send(plan)
	expect("CONNECTED")
	eventually(b, "every agent connected", func() (bool, string) {
		n := 0
		for _, c := range cs {
			if h.srv.Connected(c.identity) {
				n++
			}
		}
		return n == workers, fmt.Sprint(n)
	})
	watch := peerPlan{Proxy: h.proxy.URL, CA: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: h.proxy.Certificate().Raw}))}
	sel := "?labelSelector=" + url.QueryEscape("kueue.x-k8s.io/multikueue-origin=flotilla-hub") + "&watch=true&allowWatchBookmarks=true"
	for _, c := range cs {
		tok, err := h.srv.IssueProxyToken(b.Context(), c.wc(b))
		if err != nil {
			b.Fatal(err)
		}
		for _, p := range []string{"/apis/kueue.x-k8s.io/v1beta2/workloads", "/apis/batch/v1/jobs", "/apis/jobset.x-k8s.io/v1alpha2/jobsets"} {
			watch.Watch = append(watch.Watch, peerWatch{Identity: c.identity, Token: tok.Reveal(), Path: p + sel})
		}
	}
	before, beforeG := inUse(), runtime.NumGoroutine()
	send(watch)
	expect("WATCHING")
	after, afterG := inUse(), runtime.NumGoroutine()
	for b.Loop() {
	}
	b.ReportMetric(float64(after-before)/workers, "B/idle-worker")
	b.ReportMetric(float64(afterG-beforeG)/workers, "goroutines/idle-worker")
}
