package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/flotilla-gitops/flotilla/gitsource/status"
	"github.com/flotilla-gitops/flotilla/gitsource/status/gitnotes"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
	"github.com/flotilla-gitops/flotilla/test/sopstest"
)

// process is one of the real binaries, run for a test.
type process struct {
	t    *testing.T
	name string
	args []string
	log  *logBuffer
	cmd  *exec.Cmd
}

func startProcess(t *testing.T, name string, args ...string) *process {
	t.Helper()
	p := &process{t: t, name: name, args: args, log: &logBuffer{}}
	p.start()
	t.Cleanup(func() {
		p.stop(syscall.SIGKILL)
		if t.Failed() {
			t.Logf("%s's log:\n%s", name, p.log.String())
		}
	})
	return p
}

func (p *process) start() {
	p.t.Helper()
	p.cmd = exec.Command(builtBinary(p.t, p.name), p.args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
}

func (p *process) stop(sig os.Signal) {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	_ = p.cmd.Wait()
	p.cmd = nil
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := listenLoopback()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestRealBinaries runs the hub and an agent as the built binaries, as an operator
// would, and checks what they do to each other when killed and restarted.
func TestRealBinaries(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	tenant, ns := "procs", "tenant-procs"
	if err := hub().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	tunnelAddr := freeAddr(t)
	id := sopstest.NewIdentity(t)
	keyFile := sopstest.WriteKeyFile(t, dir, "hub.agekey", id)
	checkout := filepath.Join(dir, "fleet")
	cli(t, "fleet", "init", checkout, "--tenant", tenant, "--hub-url", "ws://"+tunnelAddr, "--age-recipient", id.Recipient().String())
	repo := gitserver.Start(t).NewRepo(t, "fleet", checkout)

	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hubKubeconfig := write("hub.kubeconfig", planes[0].KubeConfig)
	httpAddr := freeAddr(t)
	workerKubeconfig := write("worker.kubeconfig", planes[1].KubeConfig)
	config := write("hub.yaml", fmt.Appendf(nil, `kubeconfig: %s
listen:
  tunnel: %s
  http: %s
allowInsecureLoopback: true
age:
  identityFiles: [%s]
heartbeat:
  interval: 500ms
  timeout: 2s
leaderElection:
  enabled: true
  namespace: %s
sources:
- name: procs
  url: %s
  tenant: %s
  namespace: %s
  poll: 500ms
`, hubKubeconfig, tunnelAddr, httpAddr, keyFile, ns, repo.URL(), tenant, ns))
	hubProc := startProcess(t, "flotilla-hub", "--config", config)

	notes, err := gitnotes.New(gitnotes.Options{URL: repo.URL()})
	if err != nil {
		t.Fatal(err)
	}
	f := &fleetRepo{t: t, dir: checkout, repo: repo, notes: notes, tenant: tenant, ns: ns}
	repo.Branch("main", "add-gpu-p")
	f.addCluster("add-gpu-p", "gpu-p")
	merge := repo.Merge("main", "add-gpu-p", "Merge: add gpu-p")
	f.waitStatus(merge, "flotilla/gpu-p", status.Pending, "enrollment token")

	agentNS := "flotilla-gpu-p"
	if err := worker().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNS}}); err != nil {
		t.Fatal(err)
	}
	values := filepath.Join(checkout, "values.gpu-p.local.yaml")
	agentArgs := []string{"--values", values, "--kubeconfig", workerKubeconfig, "--namespace", agentNS, "--allow-insecure-loopback", "--heartbeat", "1s", "--listen", freeAddr(t)}
	agentProc := startProcess(t, "flotilla-agent", agentArgs...)
	f.waitStatus(merge, "flotilla/gpu-p", status.Success, "ready")

	wcKey := types.NamespacedName{Namespace: ns, Name: "gpu-p"}
	connected := func(want metav1.ConditionStatus) {
		t.Helper()
		eventually(t, "Connected="+string(want), func() (bool, string) {
			var wc v1alpha1.WorkerCluster
			if err := hub().Get(ctx, wcKey, &wc); err != nil {
				return false, err.Error()
			}
			c := condition(&wc, v1alpha1.ConditionConnected)
			return c != nil && c.Status == want, fmt.Sprint(c)
		})
	}

	t.Run("a second cluster on another worker, then a preset change reconfigures both", func(t *testing.T) {
		second := write("worker2.kubeconfig", planes[2].KubeConfig)
		f.addCluster("main", "gpu-q")
		added := repo.Head("main")
		if err := planes[2].Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "flotilla-gpu-q"}}); err != nil {
			t.Fatal(err)
		}
		startProcess(t, "flotilla-agent", "--values", filepath.Join(checkout, "values.gpu-q.local.yaml"), "--kubeconfig", second,
			"--namespace", "flotilla-gpu-q", "--allow-insecure-loopback", "--heartbeat", "1s", "--listen", freeAddr(t))
		f.waitStatus(added, "flotilla/gpu-q", status.Success, "ready")

		queues := filepath.Join(checkout, "presets", "gpu", "queues.yaml")
		data, err := os.ReadFile(queues)
		if err != nil {
			t.Fatal(err)
		}
		strict := strings.Replace(string(data), "  namespaceSelector: {}\n", "  namespaceSelector: {}\n  queueingStrategy: StrictFIFO\n", 1)
		preset := repo.Commit("main", "strict FIFO for every cluster", map[string][]byte{"presets/gpu/queues.yaml": []byte(strict)})
		for _, name := range []string{"gpu-p", "gpu-q"} {
			f.waitStatus(preset, "flotilla/"+name, status.Success, "ready")
		}
		for i, w := range []int{1, 2} {
			var cq unstructured.Unstructured
			cq.SetGroupVersionKind(schema.GroupVersionKind{Group: "kueue.x-k8s.io", Version: "v1beta2", Kind: "ClusterQueue"})
			if err := planes[w].Client.Get(ctx, types.NamespacedName{Name: "cluster-queue"}, &cq); err != nil {
				t.Fatalf("worker %d: %v", i+1, err)
			}
			if s, _, _ := unstructured.NestedString(cq.Object, "spec", "queueingStrategy"); s != "StrictFIFO" {
				t.Fatalf("worker %d's ClusterQueue has queueingStrategy %q after the preset change", i+1, s)
			}
		}
	})

	t.Run("the hub serves health, readiness and metrics", func(t *testing.T) {
		for path, want := range map[string]string{
			"/healthz": "ok",
			"/readyz":  "ok",
			"/metrics": `flotilla_hub_clusters{condition="Ready",namespace="` + ns + `",status="True"} 2`,
		} {
			body, code := get(t, "http://"+httpAddr+path)
			if code != http.StatusOK || !strings.Contains(body, want) {
				t.Errorf("GET %s = %d, want 200 with %q:\n%s", path, code, want, body)
			}
		}
		body, _ := get(t, "http://"+httpAddr+"/metrics")
		if !strings.Contains(body, "flotilla_hub_connected_agents 2") || !strings.Contains(body, "flotilla_hub_commit_statuses_posted_total") {
			t.Errorf("metrics lack the connected agent or the statuses posted:\n%s", body)
		}
	})

	t.Run("a second replica waits for the lease instead of serving", func(t *testing.T) {
		second := filepath.Join(dir, "hub2.yaml")
		otherHTTP := freeAddr(t)
		data, err := os.ReadFile(config)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Replace(strings.Replace(string(data), httpAddr, otherHTTP, 1), "tunnel: "+tunnelAddr, "tunnel: "+freeAddr(t), 1)
		if err := os.WriteFile(second, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		replica := startProcess(t, "flotilla-hub", "--config", second)
		eventually(t, "the replica answers, not leading", func() (bool, string) {
			body, code := get(t, "http://"+otherHTTP+"/readyz")
			return code == http.StatusServiceUnavailable && strings.Contains(body, "not leading"), fmt.Sprint(code, body)
		})
		replica.stop(syscall.SIGTERM)
	})

	t.Run("an agent killed is seen within the heartbeat timeout, and comes back", func(t *testing.T) {
		killed := time.Now()
		agentProc.stop(syscall.SIGKILL)
		connected(metav1.ConditionFalse)
		t.Logf("disconnection recorded %s after the kill (hub heartbeat timeout 2s)", time.Since(killed).Round(time.Millisecond))
		f.waitStatus(f.statusCommit("gpu-p"), "flotilla/gpu-p", status.Pending, "")
		agentProc.start()
		f.waitStatus(f.statusCommit("gpu-p"), "flotilla/gpu-p", status.Success, "ready")
	})

	t.Run("a restarted hub posts nothing twice and the agent reconnects", func(t *testing.T) {
		current := f.statusCommit("gpu-p")
		before, err := notes.Read(ctx, current)
		if err != nil {
			t.Fatal(err)
		}
		connects := strings.Count(hubProc.log.String(), `"msg":"agent connected"`)
		hubProc.stop(syscall.SIGTERM)
		hubProc.start()
		eventually(t, "the agent on the new hub", func() (bool, string) {
			return strings.Count(hubProc.log.String(), `"msg":"agent connected"`) > connects, ""
		})
		connected(metav1.ConditionTrue)
		f.waitStatus(f.statusCommit("gpu-p"), "flotilla/gpu-p", status.Success, "ready")
		after, err := notes.Read(ctx, current)
		if err != nil {
			t.Fatal(err)
		}
		for name, e := range before.Statuses {
			if a := after.Statuses[name]; a.Count != e.Count {
				t.Errorf("%s: %d statuses before the restart, %d after", name, e.Count, a.Count)
			}
		}
	})

	t.Run("a removed cluster is pruned and forgotten", func(t *testing.T) {
		rm := map[string][]byte{}
		for p := range readDir(t, checkout, "clusters/gpu-p") {
			rm[p] = nil
		}
		removed := repo.Commit("main", "remove gpu-p", rm)
		f.waitStatus(removed, "flotilla/gpu-p", status.Success, "decommissioned")
		eventually(t, "the WorkerCluster gone", func() (bool, string) {
			err := hub().Get(context.Background(), wcKey, &v1alpha1.WorkerCluster{})
			return err != nil, "still there"
		})
	})
}

func get(t *testing.T, url string) (string, int) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return err.Error(), 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}
