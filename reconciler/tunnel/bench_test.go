package tunnel_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
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
