package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
	"github.com/flotilla-gitops/flotilla/test/logtest"
)

// simEnv names, for a re-executed test binary, the hub and the agents to simulate; see
// TestMain. The agents run in a process of their own so that the hub's memory is
// measured alone.
const simEnv = "FLOTILLA_SIMULATED_AGENTS"

// benchAgents is how many agents BenchmarkIdleAgents connects.
var benchAgents = envInt("FLOTILLA_BENCH_AGENTS", 2000)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkIdleAgents connects thousands of agents to one hub over loopback and
// reports the hub's memory per idle tunnel, and the time to push a new desired state
// to all of them (the loop). Run it with
//
//	go test -run '^$' -bench IdleAgents -benchtime 3x ./test/e2e/
func BenchmarkIdleAgents(b *testing.B) {
	ctx := context.Background()
	n := benchAgents
	ns := "tenant-bench"
	if err := hub().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		b.Fatal(err)
	}
	creds := make([]string, n)
	var g errgroup.Group
	g.SetLimit(16)
	for i := range n {
		g.Go(func() error {
			id := fmt.Sprintf("bench-%05d", i)
			wc := &v1alpha1.WorkerCluster{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id, Labels: map[string]string{v1alpha1.WorkerClusterLabel: id}},
				Spec:       v1alpha1.WorkerClusterSpec{Region: "r", Residency: "eu", Preset: "gpu"},
			}
			if err := hub().Create(ctx, wc); err != nil {
				return err
			}
			tok, err := secrets.NewToken()
			if err != nil {
				return err
			}
			creds[i] = id + "\t" + tok.Reveal()
			return hub().Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: tunnel.CredentialSecretName(id)},
				Data:       map[string][]byte{"hash": []byte(tok.Hash().String())},
			})
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	credFile := b.TempDir() + "/creds"
	if err := os.WriteFile(credFile, []byte(strings.Join(creds, "\n")), 0o600); err != nil {
		b.Fatal(err)
	}

	state, _ := rendered(b, 1, nil)
	h := startHubFor(b)
	// As the hub's reconciler does on its first sync, before the agents redial.
	pushAll := func(ds *protocol.DesiredState) {
		for i := range n {
			id := fmt.Sprintf("bench-%05d", i)
			h.srv.Push(client.ObjectKey{Namespace: ns, Name: id}, id, ds)
		}
	}
	pushAll(state)

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	goroutinesBefore := runtime.NumGoroutine()

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), simEnv+"="+h.url()+"|"+credFile)
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	dialed := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := bufio.NewScanner(out)
	acks := make(chan int, 64)
	go func() {
		for lines.Scan() {
			if v, ok := strings.CutPrefix(lines.Text(), "acked "); ok {
				n, _ := strconv.Atoi(v)
				acks <- n
			}
		}
		close(acks)
	}()
	waitAcks := func(want int) {
		for got := range acks {
			if got >= want {
				return
			}
		}
		b.Fatal("the simulated agents stopped")
	}
	waitAcks(n)
	// As after a hub restart: every agent dials, authenticates, says hello and applies.
	connectAll := time.Since(dialed)
	eventually(b, "every simulated agent registered", func() (bool, string) {
		return h.srv.Sessions() >= n, fmt.Sprintf("%d of %d sessions", h.srv.Sessions(), n)
	})

	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	perAgent := float64(int64(after.HeapInuse+after.StackInuse)-int64(before.HeapInuse+before.StackInuse)) / float64(n)
	goroutines := float64(runtime.NumGoroutine()-goroutinesBefore) / float64(n)

	gen := int64(1)
	acked := n
	for b.Loop() {
		gen++
		next, _ := rendered(b, gen, nil)
		next.Hash = fmt.Sprintf("sha256:%064d", gen)
		pushAll(next)
		acked += n
		waitAcks(acked)
	}
	// After the loop: b.Loop's first call resets what was reported before it.
	b.ReportMetric(perAgent/1024, "KiB/idle-agent")
	b.ReportMetric(goroutines, "goroutines/agent")
	b.ReportMetric(connectAll.Seconds(), "s-connect-all")
}

func startHubFor(b *testing.B) *hubServer {
	h := &hubServer{t: b, log: &logtest.Buffer{}}
	l, err := listenLoopback()
	if err != nil {
		b.Fatal(err)
	}
	h.addr = l.Addr().String()
	h.opts = tunnel.Options{Client: hub(), AllowInsecureLoopback: true, LastSeenEvery: time.Hour}
	h.serve(l)
	b.Cleanup(h.stop)
	return h
}

// simulateAgents is the body of the re-executed test binary: it connects every agent
// in the credentials file, acknowledges every desired state, and prints the running
// count of acknowledgements.
func simulateAgents(spec string) int {
	url, credFile, _ := strings.Cut(spec, "|")
	data, err := os.ReadFile(credFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var acked atomic.Int64
	var mu sync.Mutex
	report := func() {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf("acked %d\n", acked.Load())
	}
	sem := make(chan struct{}, 32) // dial a few at a time, as a fleet coming up would
	for _, line := range strings.Split(string(data), "\n") {
		id, cred, _ := strings.Cut(line, "\t")
		sem <- struct{}{}
		go func() {
			conn, err := simDial(url, id, cred)
			<-sem
			if err != nil {
				fmt.Fprintln(os.Stderr, id, err)
				os.Exit(1)
			}
			for {
				_, body, err := conn.Receive()
				if err != nil {
					fmt.Fprintln(os.Stderr, id, err)
					os.Exit(1)
				}
				if ds, ok := body.(*protocol.DesiredState); ok {
					_ = conn.Send(protocol.TypeApplied, &protocol.Applied{Generation: ds.Generation, Hash: ds.Hash})
					acked.Add(1)
					report()
				}
			}
		}()
	}
	select {}
}

func simDial(url, id, cred string) (*protocol.Conn, error) {
	hdr := http.Header{}
	hdr.Set("Authorization", "Bearer "+cred)
	hdr.Set(protocol.HeaderIdentity, id)
	hdr.Set(protocol.HeaderAuth, protocol.AuthCredential)
	hdr.Set(protocol.HeaderProtocol, strconv.Itoa(protocol.ProtocolVersion))
	d := websocket.Dialer{ReadBufferSize: 1024, WriteBufferSize: 1024, HandshakeTimeout: time.Minute}
	ws, _, err := d.Dial(url+protocol.Path, hdr)
	if err != nil {
		return nil, err
	}
	t, err := protocol.NewTunnel(ws, true, protocol.DefaultLiveness)
	if err != nil {
		return nil, err
	}
	st, err := t.OpenStream()
	if err != nil {
		return nil, err
	}
	conn := protocol.NewConn(st)
	return conn, conn.Send(protocol.TypeHello, &protocol.Hello{Identity: id, AgentVersion: "simulated"})
}

// BenchmarkAgentIdleRSS runs the real flotilla-agent binary against a hub and a worker,
// lets it enroll and apply the template's cluster, and reports its resident memory
// while idle: the figure a worker's administrator sizes the agent's Pod by.
// rssRuns counts the runs of BenchmarkAgentIdleRSS in this process.
var rssRuns atomic.Int64

func BenchmarkAgentIdleRSS(b *testing.B) {
	// A case of its own per run: -count runs the benchmark again on the same planes.
	c := newCase(b, fmt.Sprintf("rss-%d", rssRuns.Add(1)))
	h := startHub(b, c, nil)
	bin := builtBinary(b, "flotilla-agent")
	dir := b.TempDir()
	kubeconfig := dir + "/worker.kubeconfig"
	if err := os.WriteFile(kubeconfig, planes[1].KubeConfig, 0o600); err != nil {
		b.Fatal(err)
	}
	valuesFile := dir + "/values.yaml"
	values := fmt.Sprintf("hub:\n  url: %s\ncluster:\n  tenant: example\n  name: %s\n  identity: %s\nenrollment:\n  token: %s\n", h.url(), "example-us-central1", c.identity, c.token.Reveal())
	if err := os.WriteFile(valuesFile, []byte(values), 0o600); err != nil {
		b.Fatal(err)
	}
	free, err := listenLoopback()
	if err != nil {
		b.Fatal(err)
	}
	listen := free.Addr().String()
	_ = free.Close()
	cmd := exec.Command(bin, "--values", valuesFile, "--kubeconfig", kubeconfig, "--namespace", c.agentNS, "--allow-insecure-loopback", "--listen", listen, "--heartbeat", "1s")
	cmd.Env = append(os.Environ(), os.Getenv("FLOTILLA_BENCH_AGENT_ENV"))
	agentLog := &logtest.Buffer{}
	cmd.Stderr = agentLog
	defer func() {
		if b.Failed() {
			b.Log(agentLog.String())
		}
	}()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	deadline := time.Now().Add(40 * time.Second)
	for {
		wc := c.wc()
		if cond := condition(wc, v1alpha1.ConditionWorkerConfigured); cond != nil && cond.Status == metav1.ConditionTrue && wc.Status.AppliedHash == c.state.Hash {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the agent did not apply the desired state in time")
		}
		time.Sleep(50 * time.Millisecond)
	}
	var peak, anon int64
	for b.Loop() {
		// Idle: one heartbeat interval with nothing to apply.
		time.Sleep(time.Second)
		if rss := procStatus(b, cmd.Process.Pid, "VmRSS:"); rss > peak {
			peak, anon = rss, procStatus(b, cmd.Process.Pid, "RssAnon:")
		}
	}
	b.ReportMetric(float64(peak)/1024, "MiB-rss")
	// Anonymous memory (heap, stacks) apart from the binary's own pages.
	b.ReportMetric(float64(anon)/1024, "MiB-anon")
}

// procStatus reads a size in KiB from a process's /proc status.
func procStatus(b *testing.B, pid int, field string) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	b.Fatal("no " + field)
	return 0
}
