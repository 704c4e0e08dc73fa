package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
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
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitnotes"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
	"github.com/flotilla-gitops/flotilla/test/logtest"
	"github.com/flotilla-gitops/flotilla/test/poll"
	"github.com/flotilla-gitops/flotilla/test/sopstest"
)

// process is one of the real binaries, run for a test.
type process struct {
	t    *testing.T
	name string
	args []string
	log  *logtest.Buffer
	cmd  *exec.Cmd
}

func startProcess(t *testing.T, name string, args ...string) *process {
	t.Helper()
	p := &process{t: t, name: name, args: args, log: &logtest.Buffer{}}
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
	outer := t // processes started in a case below outlive it
	dir := t.TempDir()
	tenant, ns := "procs", "tenant-procs"
	if err := hub().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	tunnelAddr := freeAddr(t)
	id := sopstest.NewIdentity(t)
	keyFile := sopstest.WriteKeyFile(t, dir, "hub.agekey", id)
	checkout := filepath.Join(dir, "fleet")
	cli(t, "fleet", "init", checkout, "--tenant", tenant, "--hub-url", "ws://"+tunnelAddr, "--age-recipient", id.Recipient().String(), "--manage-components=false")
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
publicURL: http://%s
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
`, hubKubeconfig, tunnelAddr, httpAddr, httpAddr, keyFile, ns, repo.URL(), tenant, ns))
	hubProc := startProcess(t, "flotilla-hub", "--config", config)

	notes, err := gitnotes.New(gitnotes.Options{URL: repo.URL()})
	if err != nil {
		t.Fatal(err)
	}
	f := &fleetRepo{t: t, dir: checkout, repo: repo, notes: notes, statuses: notes, tenant: tenant, ns: ns}
	repo.Branch("main", "add-gpu-p")
	valuesP, branchHead := f.addCluster("add-gpu-p", "gpu-p")
	repo.SetRef("refs/pull/1/head", "add-gpu-p")
	planned := f.waitStatus(branchHead, "flotilla/plan", commitstatus.Success, "+1 cluster")
	// The plan's link is the page a reviewer opens: gpu-p's rendered objects, added.
	if want := "http://" + httpAddr + "/plans/procs/" + branchHead; planned.TargetURL != want {
		t.Fatalf("the plan links to %q, want %q", planned.TargetURL, want)
	}
	if page, code := get(t, planned.TargetURL); code != http.StatusOK || !strings.Contains(page, "gpu-p") || !strings.Contains(page, "ClusterQueue") {
		t.Fatalf("GET %s = %d:\n%s", planned.TargetURL, code, page)
	}
	if err := hub().Get(ctx, types.NamespacedName{Namespace: ns, Name: "gpu-p"}, &v1alpha1.WorkerCluster{}); err == nil {
		t.Fatal("a plan created the WorkerCluster")
	}
	merge := repo.Merge("main", "add-gpu-p", "Merge: add gpu-p")
	f.waitStatus(merge, "flotilla/gpu-p", commitstatus.Pending, "enrollment token")

	agentNS := "flotilla-gpu-p"
	if err := worker().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agentNS}}); err != nil {
		t.Fatal(err)
	}
	valuesFile := filepath.Join(checkout, "values.gpu-p.local.yaml")
	agentArgs := []string{"--values", valuesFile, "--kubeconfig", workerKubeconfig, "--namespace", agentNS, "--allow-insecure-loopback", "--heartbeat", "1s", "--listen", freeAddr(t)}
	agentProc := startProcess(t, "flotilla-agent", agentArgs...)
	f.waitStatus(merge, "flotilla/gpu-p", commitstatus.Success, "ready")

	// The commit status follows the agent's report as it arrives; the WorkerCluster's
	// record of it follows the hub's write.
	wcKey := types.NamespacedName{Namespace: ns, Name: "gpu-p"}
	var wc v1alpha1.WorkerCluster
	poll.Until(t, "the WorkerCluster's record of the agent's report", func() (bool, string) {
		if err := hub().Get(ctx, wcKey, &wc); err != nil {
			return false, err.Error()
		}
		c := condition(&wc, v1alpha1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionTrue, fmt.Sprintf("Ready %+v", c)
	})
	for _, typ := range []string{v1alpha1.ConditionRegistered, v1alpha1.ConditionConnected, v1alpha1.ConditionWorkerConfigured, v1alpha1.ConditionReady} {
		if c := condition(&wc, typ); c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != wc.Generation {
			t.Errorf("%s = %+v, want True at generation %d", typ, c, wc.Generation)
		}
	}
	if c := condition(&wc, v1alpha1.ConditionDispatchReady); c == nil || c.Status != metav1.ConditionUnknown || c.Reason != "MultiKueueNotConfigured" {
		t.Errorf("DispatchReady = %+v, want Unknown MultiKueueNotConfigured", c)
	}
	if wc.Status.ObservedGeneration != wc.Generation {
		t.Errorf("status.observedGeneration %d, generation %d", wc.Status.ObservedGeneration, wc.Generation)
	}
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
		repo.Branch("main", "add-gpu-q")
		_, prHead := f.addCluster("add-gpu-q", "gpu-q")
		repo.SetRef("refs/pull/3/head", "add-gpu-q")
		f.waitStatus(prHead, "flotilla/plan", commitstatus.Success, "+1 cluster")
		added := repo.Merge("main", "add-gpu-q", "Merge: add gpu-q")
		if err := planes[2].Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "flotilla-gpu-q"}}); err != nil {
			t.Fatal(err)
		}
		startProcess(outer, "flotilla-agent", "--values", filepath.Join(checkout, "values.gpu-q.local.yaml"), "--kubeconfig", second,
			"--namespace", "flotilla-gpu-q", "--allow-insecure-loopback", "--heartbeat", "1s", "--listen", freeAddr(t))
		f.waitStatus(added, "flotilla/gpu-q", commitstatus.Success, "ready")

		queues := filepath.Join(checkout, "presets", "gpu", "queues.yaml")
		data, err := os.ReadFile(queues)
		if err != nil {
			t.Fatal(err)
		}
		strict := strings.Replace(string(data), "  namespaceSelector: {}\n", "  namespaceSelector: {}\n  queueingStrategy: StrictFIFO\n", 1)
		preset := repo.Commit("main", "strict FIFO for every cluster", map[string][]byte{"presets/gpu/queues.yaml": []byte(strict)})
		for _, name := range []string{"gpu-p", "gpu-q"} {
			f.waitStatus(preset, "flotilla/"+name, commitstatus.Success, "ready")
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

	t.Run("a cordon by pull request puts the ClusterQueue on hold", func(t *testing.T) {
		file := filepath.Join(checkout, "clusters", "gpu-q", "cluster.yaml")
		cli(t, "cluster", "cordon", "gpu-q", "--dir", checkout)
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		repo.Branch("main", "cordon-gpu-q")
		prHead := repo.Commit("cordon-gpu-q", "cordon gpu-q", map[string][]byte{"clusters/gpu-q/cluster.yaml": data})
		repo.SetRef("refs/pull/2/head", "cordon-gpu-q")
		f.waitStatus(prHead, "flotilla/plan", commitstatus.Success, "~1")
		merged := repo.Merge("main", "cordon-gpu-q", "Merge: cordon gpu-q")
		f.waitStatus(merged, "flotilla/gpu-q", commitstatus.Success, "ready")
		var cq unstructured.Unstructured
		cq.SetGroupVersionKind(schema.GroupVersionKind{Group: "kueue.x-k8s.io", Version: "v1beta2", Kind: "ClusterQueue"})
		if err := planes[2].Client.Get(ctx, types.NamespacedName{Name: "cluster-queue"}, &cq); err != nil {
			t.Fatal(err)
		}
		if p, _, _ := unstructured.NestedString(cq.Object, "spec", "stopPolicy"); p != "Hold" {
			t.Fatalf("gpu-q's ClusterQueue has stopPolicy %q after the cordon", p)
		}
	})

	t.Run("an invalid cluster fails alone, naming the file and line", func(t *testing.T) {
		before := f.statusCommit("gpu-p")
		bad := repo.Commit("main", "a cluster in a forbidden place", map[string][]byte{"clusters/gpu-x/cluster.yaml": []byte("apiVersion: flotilla.dev/v1alpha1\nkind: WorkerCluster\nmetadata:\n  name: gpu-x\nspec:\n  region: us-east1\n  residency: mars\n  preset: gpu\n")})
		f.waitStatus(bad, "flotilla/gpu-x", commitstatus.Failure, "clusters/gpu-x/cluster.yaml:7:")
		f.waitStatus(bad, "flotilla/fleet", commitstatus.Failure, "invalid")
		if got := f.statusCommit("gpu-p"); got != before {
			t.Fatalf("gpu-p's status moved to %s, a commit that did not touch it", got)
		}
		f.waitStatus(before, "flotilla/gpu-p", commitstatus.Success, "ready")
		dropped := repo.Commit("main", "drop the invalid cluster", map[string][]byte{"clusters/gpu-x/cluster.yaml": nil})
		f.waitStatus(dropped, "flotilla/fleet", commitstatus.Success, "2 of 2 clusters ready")
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
		// The queue of statuses drains, and dropped nothing.
		eventually(t, "no commit status pending", func() (bool, string) {
			body, _ := get(t, "http://"+httpAddr+"/metrics")
			return strings.Contains(body, `flotilla_hub_commit_statuses_pending{source="procs"} 0`) &&
				strings.Contains(body, `flotilla_hub_commit_statuses_dropped_total{source="procs"} 0`), body
		})
	})

	t.Run("a second replica is ready but leaves the tunnel to the leader", func(t *testing.T) {
		second := filepath.Join(dir, "hub2.yaml")
		otherHTTP, otherTunnel := freeAddr(t), freeAddr(t)
		data, err := os.ReadFile(config)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Replace(strings.Replace(string(data), httpAddr, otherHTTP, 1), "tunnel: "+tunnelAddr, "tunnel: "+otherTunnel, 1)
		if err := os.WriteFile(second, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		replica := startProcess(t, "flotilla-hub", "--config", second)
		// Ready, so that a rolling update proceeds while the first replica holds the Lease.
		eventually(t, "the replica ready while following", func() (bool, string) {
			body, code := get(t, "http://"+otherHTTP+"/readyz")
			return code == http.StatusOK && strings.Contains(replica.log.String(), "another replica leads; waiting"), fmt.Sprint(code, body)
		})
		if c, err := net.DialTimeout("tcp", otherTunnel, time.Second); err == nil {
			_ = c.Close()
			t.Fatal("the following replica accepts tunnel connections")
		}
		replica.stop(syscall.SIGTERM)
	})

	t.Run("an agent killed is seen within the heartbeat timeout, and comes back", func(t *testing.T) {
		killed := time.Now()
		agentProc.stop(syscall.SIGKILL)
		connected(metav1.ConditionFalse)
		// The hub's heartbeat timeout is 2 s; the slack is for a loaded machine.
		if took := time.Since(killed); took > 10*time.Second {
			t.Fatalf("the disconnection was recorded %s after the kill", took.Round(time.Millisecond))
		} else {
			t.Logf("disconnection recorded %s after the kill (hub heartbeat timeout 2s)", took.Round(time.Millisecond))
		}
		f.waitStatus(f.statusCommit("gpu-p"), "flotilla/gpu-p", commitstatus.Pending, "")
		agentProc.start()
		f.waitStatus(f.statusCommit("gpu-p"), "flotilla/gpu-p", commitstatus.Success, "ready")
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
		f.waitStatus(f.statusCommit("gpu-p"), "flotilla/gpu-p", commitstatus.Success, "ready")
		f.waitStatus(f.statusCommit("gpu-q"), "flotilla/gpu-q", commitstatus.Success, "ready")
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
		cli(t, "cluster", "remove", "gpu-p", "--dir", checkout)
		if _, err := os.Stat(filepath.Join(checkout, "clusters", "gpu-p")); !os.IsNotExist(err) {
			t.Fatalf("flotilla cluster remove left clusters/gpu-p: %v", err)
		}
		removed := repo.Commit("main", "remove gpu-p", rm)
		f.waitStatus(removed, "flotilla/gpu-p", commitstatus.Success, "decommissioned")
		eventually(t, "the WorkerCluster gone", func() (bool, string) {
			err := hub().Get(context.Background(), wcKey, &v1alpha1.WorkerCluster{})
			return err != nil, "still there"
		})
		if err := hub().Get(ctx, types.NamespacedName{Namespace: ns, Name: tunnel.CredentialSecretName("gpu-p")}, &corev1.Secret{}); err == nil {
			t.Fatal("the agent's credential was not revoked")
		}
		var cqs unstructured.UnstructuredList
		cqs.SetGroupVersionKind(schema.GroupVersionKind{Group: "kueue.x-k8s.io", Version: "v1beta2", Kind: "ClusterQueueList"})
		if err := worker().List(ctx, &cqs, client.MatchingLabels{v1alpha1.WorkerClusterLabel: valuesP.Cluster.Identity}); err != nil || len(cqs.Items) != 0 {
			t.Fatalf("the worker still has %d ClusterQueues of gpu-p (%v)", len(cqs.Items), err)
		}
	})

	t.Run("no token reaches a log or a commit status", func(t *testing.T) {
		// Everything the repository holds, commit statuses (git notes) included.
		mirror := filepath.Join(dir, "mirror.git")
		if out, err := exec.Command("git", "clone", "-q", "--mirror", repo.URL(), mirror).CombinedOutput(); err != nil {
			t.Fatalf("git clone --mirror: %v\n%s", err, out)
		}
		notes, err := exec.Command("git", "-C", mirror, "log", "--all", "-p").CombinedOutput()
		if err != nil || !strings.Contains(string(notes), "flotilla/gpu-q") {
			t.Fatalf("git log of the statuses: %v", err)
		}
		for _, name := range []string{"gpu-p", "gpu-q"} {
			data, err := os.ReadFile(filepath.Join(checkout, "values."+name+".local.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var v values
			if err := yaml.Unmarshal(data, &v); err != nil {
				t.Fatal(err)
			}
			notContains(t, "the hub's log", hubProc.log.String(), v.Enrollment.Token)
			notContains(t, "gpu-p's agent's log", agentProc.log.String(), v.Enrollment.Token)
			notContains(t, "the repository", string(notes), v.Enrollment.Token)
		}
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
