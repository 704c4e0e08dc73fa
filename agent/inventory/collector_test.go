package inventory_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/inventory"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
)

var planes []*controlplane.ControlPlane

func TestMain(m *testing.M) {
	controlplane.Main(m, 1, &planes, controlplane.Options{})
}

// createNode creates the node and then, as a kubelet does, sets its status through the
// status subresource, which is the only way the API server takes it.
func createNode(t *testing.T, c client.Client, n corev1.Node) {
	t.Helper()
	ctx := t.Context()
	obj := n.DeepCopy()
	obj.Status = corev1.NodeStatus{}
	if err := c.Create(ctx, obj); err != nil {
		t.Fatalf("creating node %s: %v", n.Name, err)
	}
	t.Cleanup(func() {
		if err := c.Delete(context.Background(), obj); client.IgnoreNotFound(err) != nil {
			t.Errorf("deleting node %s: %v", n.Name, err)
		}
	})
	obj.Status = *n.Status.DeepCopy()
	if err := c.Status().Update(ctx, obj); err != nil {
		t.Fatalf("updating status of node %s: %v", n.Name, err)
	}
}

// exporter serves a dcgm-exporter page as dcgm-exporter does, at /metrics.
func exporter(t *testing.T, page []byte) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" || r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(page)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func failing(t *testing.T, code int) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "DCGM is not running", code)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func collect(t *testing.T, opts inventory.Options) protocol.Inventory {
	t.Helper()
	c, err := inventory.NewCollector(opts)
	if err != nil {
		t.Fatalf("NewCollector: %v", err)
	}
	inv, err := c.Collect(t.Context())
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	return inv
}

func TestCollect(t *testing.T) {
	plane := planes[0]
	h100 := map[string]string{
		"nvidia.com/gpu.product":                  "NVIDIA-H100-80GB-HBM3",
		"nvidia.com/gpu.memory":                   "81559",
		"nvidia.com/gpu.count":                    "8",
		"nvidia.com/mig.strategy":                 "none",
		"nvidia.com/cuda.driver-version.major":    "570",
		"nvidia.com/cuda.driver-version.minor":    "124",
		"nvidia.com/cuda.driver-version.revision": "06",
		"nvidia.com/cuda.driver-version.full":     "570.124.06",
		"nvidia.com/cuda.runtime-version.major":   "12",
		"nvidia.com/cuda.runtime-version.minor":   "8",
		"nvidia.com/cuda.runtime-version.full":    "12.8",
	}
	for _, n := range []corev1.Node{
		newNode("a100-0", labels(gfdA100()), gpus("8", "8")),
		newNode("a100-1-cordoned", labels(gfdA100()), gpus("8", "8"), cordoned),
		newNode("h100-0", labels(h100), gpus("8", "8")),
		newNode("h100-1-not-ready", labels(h100), gpus("8", "8"), readyStatus(corev1.ConditionFalse)),
		// The API server defaults a status without allocatable to its capacity.
		newNode("t4-0-no-allocatable", gpus("1", "1"), labels(map[string]string{"nvidia.com/gpu.product": "Tesla-T4"}),
			func(n *corev1.Node) { n.Status.Allocatable = nil }),
		newNode("mig-0", gpus("56", "56"), labels(gfdA100()), labels(map[string]string{
			"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
			"nvidia.com/gpu.count":   "56",
			"nvidia.com/gpu.memory":  "9728",
		})),
		newNode("cpu-0"),
	} {
		createNode(t, plane.Client, n)
	}

	// The API server defaults a status without allocatable to its capacity; FromNodes
	// follows the same rule for nodes it is handed directly.
	var t4 corev1.Node
	if err := plane.Client.Get(t.Context(), client.ObjectKey{Name: "t4-0-no-allocatable"}, &t4); err != nil {
		t.Fatal(err)
	}
	if q, ok := t4.Status.Allocatable[inventory.ResourceGPU]; !ok || q.Value() != 1 {
		t.Fatalf("allocatable of t4-0-no-allocatable is %v, want the capacity", t4.Status.Allocatable)
	}

	h100Node := func(name string) protocol.NodeGPUs {
		return protocol.NodeGPUs{
			Name: name, Capacity: 8, Allocatable: 8, Product: "NVIDIA-H100-80GB-HBM3", MemoryMiB: 81559, Count: 8,
			MIGStrategy: "none", DriverVersion: "570.124.06", CUDAVersion: "12.8", Ready: true,
		}
	}
	cordonedA100 := a100("a100-1-cordoned")
	cordonedA100.Unschedulable = true
	notReadyH100 := h100Node("h100-1-not-ready")
	notReadyH100.Ready = false
	nodes := protocol.Inventory{
		Nodes: []protocol.NodeGPUs{
			a100("a100-0"),
			cordonedA100,
			h100Node("h100-0"),
			notReadyH100,
			{
				Name: "mig-0", Capacity: 56, Allocatable: 56, Product: "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
				MemoryMiB: 9728, Count: 56, MIGStrategy: "single", DriverVersion: "550.54.15", CUDAVersion: "12.4", Ready: true,
			},
			{Name: "t4-0-no-allocatable", Capacity: 1, Allocatable: 1, Product: "Tesla-T4", Ready: true},
		},
		Totals: []protocol.ProductTotal{
			{Product: "NVIDIA-A100-SXM4-80GB", GPUs: 8, Nodes: 1},
			{Product: "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", GPUs: 56, Nodes: 1},
			{Product: "NVIDIA-H100-80GB-HBM3", GPUs: 8, Nodes: 1},
			{Product: "Tesla-T4", GPUs: 1, Nodes: 1},
		},
		UnavailableNodes: 2,
	}
	withHealth := func(h protocol.GPUHealth) protocol.Inventory {
		inv := nodes
		inv.Health = &h
		return inv
	}

	t.Run("the nodes' GPUs are read from the API server, without health when no exporter is set", func(t *testing.T) {
		got := collect(t, inventory.Options{Client: plane.Client})
		if diff := cmp.Diff(nodes, got); diff != "" {
			t.Errorf("Collect (-want +got):\n%s", diff)
		}
	})

	t.Run("a DCGM exporter's GPUs are the health", func(t *testing.T) {
		srv := exporter(t, fixture(t, "dcgm-health-counters.txt"))
		got := collect(t, inventory.Options{Client: plane.Client, DCGMURL: srv.URL + "/metrics"})
		if diff := cmp.Diff(withHealth(protocol.GPUHealth{GPUs: healthCountersGPUs}), got); diff != "" {
			t.Errorf("Collect (-want +got):\n%s", diff)
		}
	})

	t.Run("the given HTTP client reads the exporter", func(t *testing.T) {
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write(fixture(t, "dcgm-mig.txt"))
		}))
		t.Cleanup(srv.Close)
		got := collect(t, inventory.Options{Client: plane.Client, DCGMURL: srv.URL + "/metrics", HTTPClient: srv.Client()})
		if diff := cmp.Diff(withHealth(protocol.GPUHealth{GPUs: migGPUs}), got); diff != "" {
			t.Errorf("Collect (-want +got):\n%s", diff)
		}
	})

	// Each of these leaves the nodes as they are and says in Health.Error why there are no
	// GPUs in it.
	for _, tt := range []struct {
		name    string
		url     func(t *testing.T) string
		http    *http.Client
		want    []string // in the error
		secrets []string // not in the error
	}{
		{
			name: "an exporter answering 500",
			url:  func(t *testing.T) string { return failing(t, http.StatusInternalServerError).URL + "/metrics" },
			want: []string{"500 Internal Server Error", "/metrics"},
		},
		{
			name: "an exporter answering 500 to a URL with credentials",
			url: func(t *testing.T) string {
				return strings.Replace(failing(t, http.StatusInternalServerError).URL, "://", "://scraper:pa55word@", 1) +
					"/metrics?token=t0ken-in-query"
			},
			want:    []string{"500 Internal Server Error"},
			secrets: []string{"scraper", "pa55word", "t0ken-in-query"},
		},
		{
			name: "an exporter that is gone, at a URL with credentials",
			url: func(t *testing.T) string {
				srv := failing(t, http.StatusInternalServerError)
				srv.Close()
				return strings.Replace(srv.URL, "://", "://scraper:pa55word@", 1) + "/metrics?token=t0ken-in-query"
			},
			want:    []string{"reading DCGM exporter http://127.0.0.1:", "connection refused"},
			secrets: []string{"scraper", "pa55word", "t0ken-in-query"},
		},
		{
			name: "an exporter answering something else than metrics",
			url: func(t *testing.T) string {
				return exporter(t, []byte("<html><body>Sign in</body></html>\n")).URL + "/metrics"
			},
			want: []string{"line 1"},
		},
		{
			name: "an exporter answering more than the cap",
			url: func(t *testing.T) string {
				page := append(fixture(t, "dcgm-default-counters.txt"), bytes.Repeat([]byte("# padding\n"), inventory.MaxDCGMBytes/10)...)
				return exporter(t, page).URL + "/metrics"
			},
			want: []string{"larger than 8 MiB"},
		},
		{
			name: "an exporter that does not answer in time",
			url: func(t *testing.T) string {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					<-r.Context().Done()
				}))
				t.Cleanup(srv.Close)
				return srv.URL + "/metrics"
			},
			http: &http.Client{Timeout: 100 * time.Millisecond},
			want: []string{"Client.Timeout exceeded"},
		},
	} {
		t.Run(tt.name+" leaves the inventory whole and says why in the health", func(t *testing.T) {
			got := collect(t, inventory.Options{Client: plane.Client, DCGMURL: tt.url(t), HTTPClient: tt.http})
			if got.Health == nil {
				t.Fatal("no health")
			}
			msg := got.Health.Error
			t.Logf("health error: %s", msg)
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("health error %q does not say %q", msg, w)
				}
			}
			for _, s := range tt.secrets {
				if strings.Contains(msg, s) {
					t.Errorf("health error %q carries %q", msg, s)
				}
			}
			if diff := cmp.Diff(withHealth(protocol.GPUHealth{GPUs: []protocol.GPUStatus{}, Error: msg}), got); diff != "" {
				t.Errorf("Collect (-want +got):\n%s", diff)
			}
		})
	}

	t.Run("a malformed page's long error is cut for the hub", func(t *testing.T) {
		srv := exporter(t, []byte(`DCGM_FI_DEV_GPU_TEMP{gpu="0"} `+strings.Repeat("9", 10000)+"x\n"))
		got := collect(t, inventory.Options{Client: plane.Client, DCGMURL: srv.URL + "/metrics"})
		if got.Health == nil || got.Health.Error == "" {
			t.Fatalf("health %+v, want an error", got.Health)
		}
		if n := len(got.Health.Error); n > 512 {
			t.Errorf("health error is %d bytes, want at most 512", n)
		}
	})

	t.Run("nodes that cannot be listed fail the inventory", func(t *testing.T) {
		c, err := inventory.NewCollector(inventory.Options{Client: plane.Client, DCGMURL: exporter(t, nil).URL + "/metrics"})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		inv, err := c.Collect(ctx)
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "listing nodes") {
			t.Fatalf("Collect gave %+v, %v; want an error listing nodes, context.Canceled", inv, err)
		}
	})
}

func TestNewCollectorRefusesBadOptions(t *testing.T) {
	reader := planes[0].Client
	for _, tt := range []struct {
		name string
		opts inventory.Options
	}{
		{"no client", inventory.Options{DCGMURL: "http://dcgm:9400/metrics"}},
		{"a relative URL", inventory.Options{Client: reader, DCGMURL: "dcgm:9400/metrics"}},
		{"a URL of another scheme", inventory.Options{Client: reader, DCGMURL: "ftp://scraper:pa55word@dcgm/metrics"}},
		{"a URL without host", inventory.Options{Client: reader, DCGMURL: "http://scraper:pa55word@/metrics"}},
		{"a URL that does not parse", inventory.Options{Client: reader, DCGMURL: "http://scraper:pa55word@dcgm:port/metrics"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := inventory.NewCollector(tt.opts)
			if err == nil {
				t.Fatalf("NewCollector gave %v, want an error", c)
			}
			if strings.Contains(err.Error(), "pa55word") {
				t.Errorf("error %q carries the password", err)
			}
		})
	}
}

// An error answer's body is drained only a little, for the connection's sake, so one that
// never ends does not hold Collect.
func TestCollectDoesNotDrainAnEndlessErrorAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.Copy(w, &endless{})
	}))
	t.Cleanup(srv.Close)
	got := collect(t, inventory.Options{Client: planes[0].Client, DCGMURL: srv.URL + "/metrics"})
	if got.Health == nil || !strings.Contains(got.Health.Error, "503") {
		t.Fatalf("health %+v, want the 503", got.Health)
	}
}
