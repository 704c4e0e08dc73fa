//go:build demo

package demo

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/term"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus"
	"github.com/flotilla-gitops/flotilla/gitsource/commitstatus/gitnotes"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/test/controlplane"
	"github.com/flotilla-gitops/flotilla/test/dispatchtest"
	"github.com/flotilla-gitops/flotilla/test/gitserver"
	"github.com/flotilla-gitops/flotilla/test/sopstest"
)

const (
	ciEnv          = "FLOTILLA_DEMO_CI"
	timeoutEnv     = "FLOTILLA_DEMO_TIMEOUT"
	defaultTimeout = 5 * time.Minute

	tenant         = "demo"
	namespace      = "demo"            // the tenant's namespace on the hub cluster
	agentNamespace = "flotilla-system" // where each agent keeps its credential on its worker
	source         = "demo"            // the hub's name for the fleet repository: /webhooks/demo
	contextPrefix  = "flotilla/"       // fleet.yaml's statusContextPrefix, as fleet init writes it
	poll           = 2 * time.Second
)

// worker is one GPU worker cluster the demo enrolls.
type worker struct {
	name, region string
	nodes        []gpuNode

	plane      *controlplane.ControlPlane
	kubeconfig string
	commit     string // the merge that enrolled it
	agent      *process
}

// gpuNode is a Node as GPU Feature Discovery and the NVIDIA device plugin leave it.
type gpuNode struct {
	name, product string
	gpus          int64
	memoryMiB     int
}

// gpus is how many GPUs the worker's nodes have: its quota in cluster.yaml.
func (w *worker) gpus() int64 {
	var n int64
	for _, node := range w.nodes {
		n += node.gpus
	}
	return n
}

func workers() []*worker {
	return []*worker{
		{name: "gpu-east", region: "us-east1", nodes: []gpuNode{
			{name: "gpu-east-h100-0", product: "NVIDIA-H100-80GB-HBM3", gpus: 8, memoryMiB: 81559},
			{name: "gpu-east-h100-1", product: "NVIDIA-H100-80GB-HBM3", gpus: 8, memoryMiB: 81559},
		}},
		{name: "gpu-west", region: "us-west1", nodes: []gpuNode{
			{name: "gpu-west-a100-0", product: "NVIDIA-A100-SXM4-80GB", gpus: 8, memoryMiB: 81920},
		}},
	}
}

// demo is one run: where everything lives and what is running.
type demo struct {
	t        *testing.T
	ctx      context.Context // ends on Ctrl-C
	run      context.Context // ends on Ctrl-C, and in the CI mode at the deadline
	ci       bool
	began    time.Time
	deadline time.Time
	late     bool // the interactive mode printed its diagnosis already
	// stopSignals gives Ctrl-C back its default: once the demo is stopping, a second one
	// ends it at once, and the kernel and the reaper clean up.
	stopSignals func()

	root, bin, logs, repoRoot string
	out                       io.Writer
	table                     *table

	hubPlane *controlplane.ControlPlane
	workers  []*worker
	repoURL  string
	checkout string // the engineer's clone, where the CLI writes
	notes    *gitnotes.Backend

	hub                             *process
	kueue                           []*kueueManager
	tunnelAddr, httpAddr, proxyAddr string
	webhookSecret                   []byte
	deliveries, pulls               int
}

func TestDemo(t *testing.T) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d := newDemo(t, ctx)
	d.stopSignals = stop

	d.build()
	d.startClock()
	d.startControlPlanes()
	d.startKueue()
	d.createFleet()
	d.startHub()
	for _, w := range d.workers {
		d.enroll(w)
	}
	for _, w := range d.workers {
		d.addGPUNodes(w)
	}
	for _, w := range d.workers {
		d.startAgent(w)
	}
	d.watchUntilGreen()
	d.dispatchJob()

	if d.ci {
		d.say("\nStopping everything and removing %s.", d.root)
		return
	}
	d.guide()
	<-ctx.Done()
	stop()
	d.say("\nStopping the agents, the hub, the control planes and the git server, and removing %s…", d.root)
}

// newDemo makes the demo's directory and points TMPDIR at it, so that every temporary
// directory of the run (the control planes', the git server's) is inside it and goes
// with it, also when the demo is killed.
func newDemo(t *testing.T, ctx context.Context) *demo {
	root, err := os.MkdirTemp("", "flotilla-demo-")
	if err != nil {
		t.Fatal(err)
	}
	reap, err := startReaper(root)
	if err != nil {
		_ = os.RemoveAll(root)
		t.Fatal(err)
	}
	// Registered first, so it runs last, after every process and plane has stopped.
	t.Cleanup(func() {
		if err := reap(); err != nil {
			t.Errorf("removing %s: %v", root, err)
		}
	})
	t.Setenv("TMPDIR", root)
	repoRoot, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	d := &demo{
		t: t, ctx: ctx, run: ctx, ci: isSet(os.Getenv(ciEnv)),
		root: root, bin: filepath.Join(root, "bin"), logs: filepath.Join(root, "logs"), repoRoot: repoRoot,
		out: os.Stdout, workers: workers(),
	}
	for _, dir := range []string{d.bin, d.logs, filepath.Join(root, "kubeconfigs"), filepath.Join(root, "hub"), filepath.Join(root, "jobs")} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	fd := int(os.Stdout.Fd())
	d.table = &table{out: d.out, tty: term.IsTerminal(fd), width: func() int {
		if w, _, err := term.GetSize(fd); err == nil {
			return w
		}
		return 120
	}}
	mode := "interactive: Ctrl-C stops everything"
	if d.ci {
		mode = ciEnv + " is set: the demo ends once both clusters are green and a job has run through the hub"
	}
	d.say("flotilla demo (%s)", mode)
	d.say("Everything lives in %s: kubeconfigs/, logs/, bin/, jobs/, the fleet checkout fleet/.", root)
	return d
}

// isSet reads a yes-or-no environment variable: anything but empty, 0 or false is yes.
func isSet(v string) bool {
	return v != "" && v != "0" && !strings.EqualFold(v, "false")
}

// say prints a line of the demo's narration.
func (d *demo) say(format string, args ...any) { fmt.Fprintf(d.out, format+"\n", args...) }

// step announces a step and returns the function that reports it done.
func (d *demo) step(format string, args ...any) func() {
	began := time.Now()
	d.say("\n==> "+format, args...)
	return func() { d.say("    done in %s", time.Since(began).Round(100*time.Millisecond)) }
}

// startClock starts the timeout: it bounds the run from the control planes to green,
// not the build, which on a cold cache takes as long as it takes.
func (d *demo) startClock() {
	timeout := defaultTimeout
	if s := os.Getenv(timeoutEnv); s != "" {
		v, err := time.ParseDuration(s)
		if err != nil || v <= 0 {
			d.t.Fatalf("%s=%q: want a positive duration such as 10m", timeoutEnv, s)
		}
		timeout = v
	}
	d.began = time.Now()
	d.deadline = d.began.Add(timeout)
	if d.ci {
		ctx, cancel := context.WithDeadline(d.ctx, d.deadline)
		d.t.Cleanup(cancel)
		d.run = ctx
	}
}

func (d *demo) build() {
	done := d.step("Building flotilla, flotilla-hub and flotilla-agent into bin/")
	cmd := exec.CommandContext(d.ctx, "go", "build", "-o", d.bin+string(filepath.Separator), "./cmd/flotilla", "./cmd/flotilla-hub", "./cmd/flotilla-agent")
	cmd.Dir = d.repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		d.fail("building the binaries: %v\n%s", err, out)
	}
	done()
}

func (d *demo) startControlPlanes() {
	done := d.step("Starting three Kubernetes control planes (kube-apiserver and etcd): the hub, %s and %s", d.workers[0].name, d.workers[1].name)
	out, err := os.OpenFile(filepath.Join(d.logs, "controlplanes.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		d.fail("%v", err)
	}
	d.t.Cleanup(func() { _ = out.Close() })
	// envtest logs through controller-runtime's logger; unset, it complains on stderr.
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(out, nil)))
	planes, err := controlplane.Start(d.run, 1+len(d.workers), controlplane.Options{Output: out})
	if err != nil {
		d.fail("starting the control planes: %v", err)
	}
	d.t.Cleanup(func() {
		if err := controlplane.StopAll(planes); err != nil {
			d.t.Errorf("stopping the control planes: %v", err)
		}
	})
	d.hubPlane = planes[0]
	d.writeKubeconfig("hub", planes[0])
	d.createNamespace(planes[0], namespace)
	// Where the hub keeps its API proxy's CA (dispatch.namespace's default).
	d.createNamespace(planes[0], agentNamespace)
	for i, w := range d.workers {
		w.plane = planes[i+1]
		w.kubeconfig = d.writeKubeconfig(w.name, w.plane)
		d.createNamespace(w.plane, agentNamespace)
	}
	d.say("    kubeconfigs/hub.yaml, kubeconfigs/%s.yaml, kubeconfigs/%s.yaml", d.workers[0].name, d.workers[1].name)
	done()
}

func (d *demo) writeKubeconfig(name string, p *controlplane.ControlPlane) string {
	path := filepath.Join(d.root, "kubeconfigs", name+".yaml")
	if err := os.WriteFile(path, p.KubeConfig, 0o600); err != nil {
		d.fail("%v", err)
	}
	return path
}

func (d *demo) createNamespace(p *controlplane.ControlPlane, name string) {
	if err := p.Client.Create(d.run, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		d.fail("creating namespace %s on %s: %v", name, p.Name, err)
	}
}

// createFleet makes the fleet repository the way an organization starts one: fleet
// init, the first commit on a git server, and an engineer's clone.
func (d *demo) createFleet() {
	done := d.step("Creating the fleet repository with `flotilla fleet init` on a local git server")
	var err error
	if d.tunnelAddr, err = freeAddr(); err != nil {
		d.fail("%v", err)
	}
	if d.httpAddr, err = freeAddr(); err != nil {
		d.fail("%v", err)
	}
	if d.proxyAddr, err = freeAddr(); err != nil {
		d.fail("%v", err)
	}
	id := sopstest.NewIdentity(d.t)
	sopstest.WriteKeyFile(d.t, filepath.Join(d.root, "hub"), "hub.agekey", id)
	d.say("    a fresh age identity for the hub in hub/hub.agekey (0600); its recipient %s…", id.Recipient().String()[:16])

	initDir := filepath.Join(d.root, "new-fleet")
	d.sh(d.root, echoOutput, d.flotilla(), "fleet", "init", initDir, "--tenant", tenant, "--hub-url", "ws://"+d.tunnelAddr, "--age-recipient", id.Recipient().String(), "--manage-components=false")
	d.repoURL = d.startGitServer().NewRepo(d.t, "fleet", initDir).URL()
	d.say("    new-fleet/ pushed as the first commit of %s", d.repoURL)
	d.checkout = filepath.Join(d.root, "fleet")
	d.sh(d.root, echo, "git", "clone", "-q", "-b", "main", d.repoURL, d.checkout)
	if err := os.RemoveAll(initDir); err != nil {
		d.fail("%v", err)
	}
	// The engineer's identity, so that commits in the checkout, the demo's and yours, work.
	d.sh(d.checkout, quiet, "git", "config", "user.name", "Demo Engineer")
	d.sh(d.checkout, quiet, "git", "config", "user.email", "engineer@flotilla.invalid")
	if d.notes, err = gitnotes.New(gitnotes.Options{URL: d.repoURL}); err != nil {
		d.fail("%v", err)
	}
	done()
}

// startGitServer starts the git server, its request log in logs/gitserver.log: it logs
// through the standard logger, which would otherwise interleave with the narration.
func (d *demo) startGitServer() *gitserver.Server {
	f, err := os.OpenFile(filepath.Join(d.logs, "gitserver.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		d.fail("%v", err)
	}
	log.SetOutput(f)
	d.t.Cleanup(func() {
		log.SetOutput(os.Stderr)
		_ = f.Close()
	})
	return gitserver.Start(d.t)
}

func (d *demo) flotilla() string { return filepath.Join(d.bin, "flotilla") }

// startHub writes the hub's configuration and runs it until the end of the demo.
func (d *demo) startHub() {
	done := d.step("Starting flotilla-hub: tunnel on ws://%s, health, metrics and webhooks on http://%s, the API proxy for its Kueue on https://%s",
		d.tunnelAddr, d.httpAddr, d.proxyAddr)
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		d.fail("%v", err)
	}
	d.webhookSecret = []byte(hex.EncodeToString(secret))
	secretFile := filepath.Join(d.root, "hub", "webhook-secret")
	if err := os.WriteFile(secretFile, d.webhookSecret, 0o600); err != nil {
		d.fail("%v", err)
	}
	config := fmt.Sprintf(`# flotilla-hub's configuration for the demo: one fleet repository, statuses as git notes.
kubeconfig: %q
listen:
  tunnel: %q
  http: %q
# Where people open the pull-request plans the hub links from its plan statuses.
publicURL: %q
# Agents on this machine dial ws://127.0.0.1: no certificate needed on loopback.
allowInsecureLoopback: true
age:
  identityFiles: [%q]
sources:
  - name: %s
    url: %q
    branch: main
    tenant: %s
    namespace: %s
    poll: %s
    webhookSecretFile: %q
    statuses:
      kind: notes
    # The namespace on the hub that the tenant's jobs are submitted in: the hub gives
    # the tenant's LocalQueues only the namespaces listed here.
    dispatch:
      workloadNamespaces: [%s]
# The hub's Kueue dispatches to the workers through the hub's API proxy: its kubeconfig
# for each worker names https://<url>/clusters/<identity>, and the proxy carries each
# request over that worker's tunnel. The proxy's CA is the hub's own, kept in the
# Secret flotilla-system/flotilla-hub-proxy-ca.
dispatch:
  listen: %q
  url: %q
`, filepath.Join(d.root, "kubeconfigs", "hub.yaml"), d.tunnelAddr, d.httpAddr, "http://"+d.httpAddr, filepath.Join(d.root, "hub", "hub.agekey"),
		source, d.repoURL, tenant, namespace, poll, secretFile, workloadNamespace, d.proxyAddr, "https://"+d.proxyAddr)
	configFile := filepath.Join(d.root, "hub", "config.yaml")
	if err := os.WriteFile(configFile, []byte(config), 0o600); err != nil {
		d.fail("%v", err)
	}
	p, err := start("flotilla-hub", filepath.Join(d.logs, "hub.log"), filepath.Join(d.bin, "flotilla-hub"), "--config", configFile)
	if err != nil {
		d.fail("%v", err)
	}
	d.hub = p
	d.t.Cleanup(p.stop)
	d.say("    $ flotilla-hub --config hub/config.yaml   (log: logs/hub.log)")
	d.wait("the hub to serve /readyz and its tunnel", 100*time.Millisecond, func() (bool, string) {
		resp, err := http.Get("http://" + d.httpAddr + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, "/readyz: " + resp.Status
		}
		c, err := net.DialTimeout("tcp", d.tunnelAddr, time.Second)
		if err != nil {
			return false, err.Error()
		}
		_ = c.Close()
		return true, ""
	})
	done()
}

// enroll adds a cluster the GitOps way: a branch, `flotilla cluster add`, a commit, a
// pull request whose plan the hub checks, and a merge into main.
func (d *demo) enroll(w *worker) {
	done := d.step("Enrolling %s through a pull request", w.name)
	branch := "enroll-" + w.name
	d.sh(d.checkout, echo, "git", "switch", "-q", "-c", branch, "main")
	d.sh(d.checkout, echoOutput, d.flotilla(), "cluster", "add", w.name, "--region", w.region, "--residency", pool, "--preset", "gpu", "--gpus", fmt.Sprint(w.gpus()))
	d.sh(d.checkout, echo, "git", "add", "clusters/"+w.name)
	d.sh(d.checkout, echo, "git", "commit", "-q", "-m", "Enroll "+w.name)
	head := d.sh(d.checkout, quiet, "git", "rev-parse", "HEAD")
	d.say("    (values.%s.local.yaml, with the plaintext token, stays out of Git: the worker's admin gets it)", w.name)

	// A forge publishes a pull request's head as refs/pull/N/head; the hub checks it.
	d.pulls++
	pull := fmt.Sprintf("refs/pull/%d/head", d.pulls)
	d.sh(d.checkout, echo, "git", "push", "-q", "origin", branch, branch+":"+pull)
	d.notifyHub(pull, head)
	st := d.waitStatus(head, contextPrefix+"plan")
	d.say("    pull request #%d: %splan on %s is %s: %s", d.pulls, contextPrefix, short(head), st.State, st.Description)
	if st.State != commitstatus.Success {
		d.fail("the hub's plan of %s is %s: %s", w.name, st.State, st.Description)
	}

	d.sh(d.checkout, echo, "git", "switch", "-q", "main")
	d.sh(d.checkout, echo, "git", "merge", "-q", "--no-ff", "-m", fmt.Sprintf("Merge pull request #%d from %s", d.pulls, branch), branch)
	d.sh(d.checkout, echo, "git", "push", "-q", "origin", "main")
	w.commit = d.sh(d.checkout, quiet, "git", "rev-parse", "HEAD")
	d.notifyHub("refs/heads/main", w.commit)
	d.say("    merged: main is %s; the hub now waits for %s's agent", short(w.commit), w.name)
	done()
}

// waitStatus waits for a final (not pending) status of context on commit.
func (d *demo) waitStatus(commit, context string) commitstatus.Status {
	var st commitstatus.Status
	d.wait(fmt.Sprintf("%s on %s", context, short(commit)), 200*time.Millisecond, func() (bool, string) {
		got, err := d.notes.Latest(d.run, commit)
		if err != nil {
			return false, err.Error()
		}
		st = got[context]
		if st.State == "" {
			return false, "no status yet"
		}
		return st.State != commitstatus.Pending, fmt.Sprintf("%s: %s", st.State, st.Description)
	})
	return st
}

// notifyHub delivers a signed push webhook, as a forge would after a push, so that the
// hub fetches at once instead of at its next poll.
func (d *demo) notifyHub(ref, after string) {
	d.deliveries++
	body := fmt.Appendf(nil, `{"ref":%q,"after":%q}`, ref, after)
	mac := hmac.New(sha256.New, d.webhookSecret)
	mac.Write(body)
	req, err := http.NewRequestWithContext(d.run, http.MethodPost, "http://"+d.httpAddr+"/webhooks/"+source, bytes.NewReader(body))
	if err != nil {
		d.fail("%v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "push")
	req.Header.Set("X-GitHub-Delivery", fmt.Sprintf("demo-%d", d.deliveries))
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.fail("delivering the webhook: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		d.fail("delivering the webhook: %s", resp.Status)
	}
	d.say("    (a signed push webhook told the hub about %s)", ref)
}

// addGPUNodes registers the worker's GPU nodes as their kubelets, GPU Feature Discovery
// and the NVIDIA device plugin would: labels, nvidia.com/gpu capacity, Ready.
func (d *demo) addGPUNodes(w *worker) {
	done := d.step("Adding GPU nodes to %s", w.name)
	for _, n := range w.nodes {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{
			"kubernetes.io/hostname":               n.name,
			"nvidia.com/gpu.product":               n.product,
			"nvidia.com/gpu.count":                 fmt.Sprint(n.gpus),
			"nvidia.com/gpu.memory":                fmt.Sprint(n.memoryMiB),
			"nvidia.com/cuda.driver-version.full":  "580.95.05",
			"nvidia.com/cuda.runtime-version.full": "13.0",
		}}}
		if err := w.plane.Client.Create(d.run, node); err != nil {
			d.fail("creating node %s on %s: %v", n.name, w.name, err)
		}
		resources := corev1.ResourceList{
			"nvidia.com/gpu":      *resource.NewQuantity(n.gpus, resource.DecimalSI),
			corev1.ResourceCPU:    resource.MustParse("96"),
			corev1.ResourceMemory: resource.MustParse("1Ti"),
		}
		now := metav1.Now()
		node.Status = corev1.NodeStatus{
			Capacity: resources, Allocatable: resources,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				Message: "kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now}},
		}
		if err := w.plane.Client.Status().Update(d.run, node); err != nil {
			d.fail("setting the status of node %s on %s: %v", n.name, w.name, err)
		}
		d.say("    node %s: %d× %s, Ready", n.name, n.gpus, n.product)
	}
	done()
}

// startAgent runs the worker's agent with the values file `flotilla cluster add` wrote.
func (d *demo) startAgent(w *worker) {
	done := d.step("Starting flotilla-agent for %s", w.name)
	d.installDispatchRBAC(w)
	listen, err := freeAddr()
	if err != nil {
		d.fail("%v", err)
	}
	values := filepath.Join(d.checkout, "values."+w.name+".local.yaml")
	// The chart hands the agent the name of its dispatch ClusterRole; run by hand, it
	// takes it as a flag.
	args := []string{"--values", values, "--kubeconfig", w.kubeconfig, "--namespace", agentNamespace, "--allow-insecure-loopback", "--listen", listen,
		"--dispatch-cluster-role", dispatchtest.DispatchClusterRole}
	p, err := start("flotilla-agent "+w.name, filepath.Join(d.logs, "agent-"+w.name+".log"), filepath.Join(d.bin, "flotilla-agent"), args...)
	if err != nil {
		d.fail("%v", err)
	}
	w.agent = p
	d.t.Cleanup(p.stop)
	d.say("    $ flotilla-agent --values fleet/values.%s.local.yaml --kubeconfig kubeconfigs/%s.yaml --namespace %s --allow-insecure-loopback --listen %s --dispatch-cluster-role %s   (log: logs/agent-%s.log)",
		w.name, w.name, agentNamespace, listen, dispatchtest.DispatchClusterRole, w.name)
	done()
}

// watchUntilGreen shows the live table until every cluster is green.
func (d *demo) watchUntilGreen() {
	began := time.Now()
	d.step("Watching the hub until both clusters are green: ready and dispatchable (conditions from the hub's WorkerClusters, statuses from git notes)")
	d.table.began = began
	var rows []row
	d.wait("both clusters green", time.Second, func() (bool, string) {
		var note string
		got, err := d.rows(d.run)
		if err != nil {
			note = err.Error()
		} else {
			rows = got
		}
		d.table.show(rows, note)
		green := len(rows) == len(d.workers)
		var why []string
		for _, r := range rows {
			green = green && r.green()
			why = append(why, fmt.Sprintf("%s %s: %s", r.name, r.status.State, r.status.Description))
		}
		if note != "" {
			why = append(why, note)
		}
		return green, strings.Join(why, "; ")
	})
	if !d.table.tty {
		d.say("")
		for _, l := range format(rows) {
			d.say("%s", l)
		}
	}
	d.say("\nBoth clusters are green: %s after the agents started, %s after the control planes did.",
		time.Since(began).Round(100*time.Millisecond), time.Since(d.began).Round(100*time.Millisecond))
}

// wait polls cond every interval until it holds. The hub's and agents' exits end the
// demo at once. Past the deadline the CI mode fails with a diagnosis; the interactive
// one prints it once and keeps waiting, with everything left running to be looked at.
func (d *demo) wait(what string, every time.Duration, cond func() (bool, string)) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		ok, why := cond()
		if ok {
			return
		}
		for _, p := range d.processes() {
			if err := p.exited(); err != nil {
				d.fail("waiting for %s: %v", what, err)
			}
		}
		for _, k := range d.kueue {
			select {
			case <-k.m.Done():
				d.fail("waiting for %s: the %s manager exited (log: logs/%s)", what, k.name, filepath.Base(k.log))
			default:
			}
		}
		if !d.ci && !d.late && time.Now().After(d.deadline) {
			d.late = true
			d.diagnose(fmt.Sprintf("%s: not reached within %s; last: %s", what, d.deadline.Sub(d.began), why))
			d.say("Everything keeps running for you to look at; Ctrl-C stops it.\n")
			d.table.drawn = 0 // the table goes on below the diagnosis, not over it
		}
		select {
		case <-d.run.Done():
			d.fail("%s: not reached; last: %s", what, why)
		case <-tick.C:
		}
	}
}

// conditionOrder is the order a new cluster meets its conditions in.
var conditionOrder = []string{v1alpha1.ConditionRegistered, v1alpha1.ConditionConnected,
	v1alpha1.ConditionWorkerConfigured, v1alpha1.ConditionReady, v1alpha1.ConditionDispatchReady}

func (d *demo) processes() []*process {
	ps := []*process{}
	if d.hub != nil {
		ps = append(ps, d.hub)
	}
	for _, w := range d.workers {
		if w.agent != nil {
			ps = append(ps, w.agent)
		}
	}
	return ps
}

// fail ends the demo: quietly when it was interrupted, else with the reason, the last
// statuses and the tails of the logs. Cleanup stops everything either way.
func (d *demo) fail(format string, args ...any) {
	d.t.Helper()
	if d.ctx.Err() != nil {
		d.stopSignals()
		d.say("\nInterrupted: stopping everything and removing %s…", d.root)
		d.t.FailNow()
	}
	reason := fmt.Sprintf(format, args...)
	if errors.Is(d.run.Err(), context.DeadlineExceeded) {
		reason += fmt.Sprintf(" (the timeout of %s ran out; set %s to wait longer)", d.deadline.Sub(d.began), timeoutEnv)
	}
	d.diagnose(reason)
	d.t.Fatal(reason)
}

// diagnose prints what an operator would look at first.
func (d *demo) diagnose(reason string) {
	d.say("\n!!! %s", reason)
	if d.hubPlane != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rows, err := d.rows(ctx)
		cancel()
		if err != nil {
			d.say("\nLast statuses: %v", err)
		} else {
			d.say("\nLast statuses:")
			for _, l := range format(rows) {
				d.say("%s", l)
			}
			for _, r := range rows {
				for _, typ := range conditionOrder {
					if c := meta.FindStatusCondition(r.conditions, typ); c != nil {
						d.say("  %s %s=%s (%s): %s", r.name, c.Type, c.Status, c.Reason, c.Message)
					}
				}
			}
		}
	}
	for _, p := range d.processes() {
		d.say("\nLast lines of %s (%s):", p.log, p.name)
		for _, l := range tail(p.log, 25) {
			d.say("  %s", l)
		}
	}
	// Kueue logs a lot, in JSON: its last few lines, the rest in the file.
	for _, k := range d.kueue {
		d.say("\nLast lines of %s (%s):", k.log, k.name)
		for _, l := range tail(k.log, 8) {
			d.say("  %s", l)
		}
	}
}

// How sh shows a command.
type shown int

const (
	quiet      shown = iota // not at all: plumbing the reader need not see
	echo                    // as a person would type it
	echoOutput              // and the first line it printed
)

// sh runs a command in dir, showing it as asked, and returns its trimmed output.
func (d *demo) sh(dir string, show shown, name string, args ...string) string {
	d.t.Helper()
	line := []string{filepath.Base(name)}
	for _, a := range args {
		if rel, err := filepath.Rel(d.root, a); err == nil && filepath.IsAbs(a) && !strings.HasPrefix(rel, "..") {
			a = rel
		}
		line = append(line, shellQuote(a))
	}
	if show != quiet {
		d.say("    $ %s", strings.Join(line, " "))
	}
	cmd := exec.CommandContext(d.run, name, args...)
	cmd.Dir = dir
	// The demo's own git commands do not depend on the user's git configuration.
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		d.fail("%s: %v\n%s", strings.Join(line, " "), err, out)
	}
	text := strings.TrimSpace(string(out))
	if show == echoOutput && text != "" {
		d.say("      %s", strings.SplitN(text, "\n", 2)[0])
	}
	return text
}

// guide tells what to try next while everything runs.
func (d *demo) guide() {
	east, west := d.workers[0].name, d.workers[1].name
	r := d.root
	d.say(`
Everything keeps running until you press Ctrl-C, which stops it all and removes %[1]s.
Try, in another terminal:

  export PATH=%[1]s/bin:$PATH KUBECONFIG=%[1]s/kubeconfigs/hub.yaml
  flotilla -n %[2]s cluster list                 # what the hub knows of each cluster
  kubectl get workerclusters -A                 # the same WorkerClusters, with kubectl
  flotilla commit status --repo %[3]s    # the commit statuses on main's head

Whether a cluster takes jobs is its DispatchReady condition, Kueue's judgement carried over:
  kubectl get workerclusters -n %[2]s -o wide    # the DISPATCH column
  flotilla -n %[2]s cluster status %[4]s       # DispatchReady with its reason and message
  kubectl get multikueueclusters                # the hub's Kueue's own view: CONNECTED

Submit a job to the hub: it goes to the LocalQueue %[8]q (the dispatch pool of residency
%[8]s) in %[7]s, and the hub's Kueue runs it on %[4]s or %[6]s through its tunnel:
  kubectl create -f %[1]s/jobs/train.yaml          # prints job.batch/train-xxxxx created
  kubectl get jobs,workloads -n %[7]s       # admitted on the hub
  kubectl get workloads -n %[7]s -o custom-columns=NAME:.metadata.name,CLUSTER:.status.clusterName   # placed where
  kubectl --kubeconfig %[1]s/kubeconfigs/%[4]s.yaml get jobs -n %[7]s   # the copy the hub's Kueue made (or %[6]s's)
No kubelet runs on these machines: a job on a worker never finishes until you play its
nodes, as the demo did for its own job, by writing the worker Job's status, e.g.:
  NOW=$(date -u +%%Y-%%m-%%dT%%H:%%M:%%SZ)
  kubectl --kubeconfig %[1]s/kubeconfigs/%[4]s.yaml patch -n %[7]s job/train-xxxxx --subresource=status --type=merge -p '{"status":{
    "startTime":"'$NOW'","completionTime":"'$NOW'","active":0,"ready":0,"succeeded":1,"conditions":[
    {"type":"SuccessCriteriaMet","status":"True","reason":"CompletionsReached","message":"played","lastProbeTime":"'$NOW'","lastTransitionTime":"'$NOW'"},
    {"type":"Complete","status":"True","reason":"CompletionsReached","message":"played","lastProbeTime":"'$NOW'","lastTransitionTime":"'$NOW'"}]}}'
and the hub's job turns Complete: 'kubectl get jobs -n %[7]s'.

Cordon %[4]s (no new jobs; running ones carry on) with a commit and a merge:
  cd %[1]s/fleet
  git switch -c cordon-%[4]s
  flotilla cluster cordon %[4]s
  git commit -am "Cordon %[4]s"
  git switch main && git merge --no-ff cordon-%[4]s && git push origin main
The hub polls every %[5]s; then 'flotilla -n %[2]s cluster list' shows it cordoned, DispatchReady
turns False (Cordoned), and 'flotilla commit status --repo %[3]s' shows the merge's statuses.

Remove %[6]s (no new jobs; once the work placed on it has finished, its agent prunes what it
applied and the hub revokes its credential):
  flotilla cluster remove %[6]s && git commit -am "Remove %[6]s" && git push origin main

The workers: kubectl --kubeconfig %[1]s/kubeconfigs/%[4]s.yaml get clusterqueues,localqueues,nodes -A
Logs:        %[1]s/logs/ (hub.log, agent-%[4]s.log, agent-%[6]s.log, kueue-hub.log, kueue-%[4]s.log, kueue-%[6]s.log,
             controlplanes.log, gitserver.log)
Hub config:  %[1]s/hub/config.yaml`, r, namespace, d.repoURL, east, poll, west, workloadNamespace, pool)
}
