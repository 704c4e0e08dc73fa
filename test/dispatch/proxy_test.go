package dispatch

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	"github.com/flotilla-gitops/flotilla/reconciler/dispatch"
	"github.com/flotilla-gitops/flotilla/secrets"
	"github.com/flotilla-gitops/flotilla/test/kueuetest"
)

// kueueConfig is the worker's client configuration as the hub's Kueue reads it: the
// kubeconfig Secret the hub wrote for the worker's MultiKueueCluster.
func (w *world) kueueConfig(tb testing.TB, wk *worker) *rest.Config {
	tb.Helper()
	var sec corev1.Secret
	key := client.ObjectKey{Namespace: kueuetest.Namespace, Name: dispatch.KubeConfigSecretName(wk.identity)}
	if err := w.hub.Client.Get(tb.Context(), key, &sec); err != nil {
		tb.Fatalf("reading the kubeconfig Secret %s: %v", key, err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(sec.Data[dispatch.KubeConfigKey])
	if err != nil {
		tb.Fatalf("the kubeconfig in Secret %s: %v", key, err)
	}
	return cfg
}

func (w *world) testProxyRefuses(t *testing.T) {
	eu, us := w.worker("gpu-eu"), w.worker("gpu-us")
	euCfg, usCfg := w.kueueConfig(t, eu), w.kueueConfig(t, us)
	wrong, err := secrets.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	withToken := func(cfg *rest.Config, token string) *rest.Config {
		c := rest.CopyConfig(cfg)
		c.BearerToken = token
		return c
	}
	const secretPath = "/api/v1/namespaces/" + agentNamespace + "/secrets"
	tests := []struct {
		name   string
		cfg    *rest.Config
		server string // whose path: the worker's own unless set
		method string
		path   string
		header http.Header
		// http1 speaks HTTP/1.1, as kubectl exec does to upgrade the connection.
		http1 bool
		want  int
	}{
		{name: "the worker's Workloads, which MultiKueue reads by its origin, are served", cfg: euCfg,
			path: "/apis/kueue.x-k8s.io/v1beta2/namespaces/" + w.workloads + "/workloads?labelSelector=" + kueue.MultiKueueOriginLabel + "%3D" + dispatch.Origin, want: http.StatusOK},
		{name: "every Workload of the worker", cfg: euCfg, path: "/apis/kueue.x-k8s.io/v1beta2/workloads", want: http.StatusForbidden},
		{name: "Jobs created in the agent's namespace", cfg: euCfg, method: http.MethodPost, path: "/apis/batch/v1/namespaces/" + agentNamespace + "/jobs", want: http.StatusForbidden},
		{name: "Jobs created in kube-system", cfg: euCfg, method: http.MethodPost, path: "/apis/batch/v1/namespaces/kube-system/jobs", want: http.StatusForbidden},
		{name: "Secrets of the agent's namespace", cfg: euCfg, path: secretPath, want: http.StatusForbidden},
		{name: "the agent's credential Secret", cfg: euCfg, path: secretPath + "/flotilla-agent-credential-" + w.tenant, want: http.StatusForbidden},
		{name: "ConfigMaps", cfg: euCfg, path: "/api/v1/namespaces/kube-system/configmaps", want: http.StatusForbidden},
		{name: "pods/exec", cfg: euCfg, method: http.MethodPost, path: "/api/v1/namespaces/" + w.workloads + "/pods/train/exec?command=sh&stdin=true&stdout=true",
			header: http.Header{"Connection": {"Upgrade"}, "Upgrade": {"SPDY/3.1"}, "X-Stream-Protocol-Version": {"v4.channel.k8s.io"}}, http1: true, want: http.StatusForbidden},
		{name: "pods/exec over HTTP/2, without an upgrade", cfg: euCfg, method: http.MethodPost, path: "/api/v1/namespaces/" + w.workloads + "/pods/train/exec?command=sh", want: http.StatusForbidden},
		{name: "another worker's path with this worker's token", cfg: euCfg, server: usCfg.Host, path: "/api", want: http.StatusUnauthorized},
		{name: "a wrong token", cfg: withToken(euCfg, wrong.Reveal()), path: "/api", want: http.StatusUnauthorized},
		{name: "another worker's token", cfg: withToken(euCfg, usCfg.BearerToken), path: "/api", want: http.StatusUnauthorized},
		{name: "a token of the worker's own agent ServiceAccount", cfg: withToken(euCfg, eu.agentConfig.BearerToken), path: "/api", want: http.StatusUnauthorized},
	}
	var unauthorized []string
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			if tt.http1 {
				cfg = rest.CopyConfig(cfg)
				cfg.NextProtos = []string{"http/1.1"}
			}
			hc, err := rest.HTTPClientFor(cfg)
			if err != nil {
				t.Fatal(err)
			}
			server := tt.cfg.Host
			if tt.server != "" {
				server = tt.server
			}
			method := tt.method
			if method == "" {
				method = http.MethodGet
			}
			req, err := http.NewRequestWithContext(t.Context(), method, server+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tt.header {
				req.Header[k] = v
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			_ = resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Fatalf("%s %s: %s, want %d: %s", method, tt.path, resp.Status, tt.want, body)
			}
			for _, secret := range []string{euCfg.BearerToken, usCfg.BearerToken, wrong.Reveal(), eu.agentConfig.BearerToken} {
				if strings.Contains(string(body), secret) {
					t.Fatalf("the answer carries a token")
				}
			}
			if tt.want == http.StatusOK {
				return
			}
			var st metav1.Status
			if err := json.Unmarshal(body, &st); err != nil || st.Kind != "Status" || int(st.Code) != tt.want {
				t.Errorf("the refusal is not a Kubernetes Status of code %d: %s", tt.want, body)
			}
			if tt.want == http.StatusUnauthorized {
				// No detail: neither whether the identity exists nor why the token fails.
				for _, id := range []string{eu.identity, us.identity} {
					if strings.Contains(string(body), id) {
						t.Errorf("the refusal names identity %s: %s", id, body)
					}
				}
				unauthorized = append(unauthorized, string(body))
			}
		})
	}
	for i := 1; i < len(unauthorized); i++ {
		b := unauthorized[i]
		if b != unauthorized[0] {
			t.Errorf("refusals of tokens differ, telling a caller why:\n%s\n%s", unauthorized[0], b)
		}
	}
}
