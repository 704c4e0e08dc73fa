package tunnel_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/flotilla-gitops/flotilla/agent/protocol"
	"github.com/flotilla-gitops/flotilla/agent/proxy"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
)

// peersEnv makes the test binary a process of agents and watchers instead of running
// tests: the hub's memory is then measured without theirs.
const peersEnv = "FLOTILLA_TUNNEL_PEERS"

// peerPlan is what the peers process is told on its standard input, one JSON line per
// step: first the agents to enroll, then the watches to open.
type peerPlan struct {
	HubURL string      `json:"hubURL,omitempty"`
	Agents []peerAgent `json:"agents,omitempty"`
	Proxy  string      `json:"proxy,omitempty"`
	CA     string      `json:"ca,omitempty"`
	Watch  []peerWatch `json:"watch,omitempty"`
}

type peerAgent struct{ Identity, Token string }

type peerWatch struct{ Identity, Token, Path string }

// runPeers is the peers process: agents that hold every proxy stream the hub opens as
// an idle watch (as a worker with nothing to report does), and the watchers, Kueue's
// stand-in, over one HTTP/2 connection to the proxy.
func runPeers() int {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(nil, 16<<20)
	var plan peerPlan
	if !in.Scan() || json.Unmarshal(in.Bytes(), &plan) != nil {
		return 2
	}
	idle := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
	})
	for _, a := range plan.Agents {
		h := http.Header{}
		h.Set("Authorization", "Bearer "+a.Token)
		h.Set(protocol.HeaderIdentity, a.Identity)
		h.Set(protocol.HeaderAuth, protocol.AuthEnrollment)
		h.Set(protocol.HeaderProtocol, strconv.Itoa(protocol.ProtocolVersion))
		ws, _, err := websocket.DefaultDialer.Dial(plan.HubURL+protocol.Path, h)
		if err != nil {
			fmt.Fprintln(os.Stderr, "peers: dial:", err)
			return 1
		}
		tn, err := protocol.NewTunnel(ws, true, fast)
		if err != nil {
			return 1
		}
		st, err := tn.OpenStream()
		if err != nil {
			return 1
		}
		if err := protocol.NewConn(st).Send(protocol.TypeHello, &protocol.Hello{Identity: a.Identity, AgentVersion: "peers"}); err != nil {
			return 1
		}
		go func() { _, _ = io.Copy(io.Discard, st) }()
		l := proxy.NewListener(64)
		go func() {
			for {
				s, err := tn.AcceptStream()
				if err != nil {
					return
				}
				if k, err := protocol.ReadStreamKind(s); err != nil || k != protocol.StreamProxy || !l.Offer(s) {
					_ = s.Close()
				}
			}
		}()
		go func() { _ = (&http.Server{Handler: idle}).Serve(l) }()
	}
	fmt.Println("CONNECTED")
	if !in.Scan() || json.Unmarshal(in.Bytes(), &plan) != nil {
		return 2
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(plan.CA))
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	var wg sync.WaitGroup
	failed := make(chan string, len(plan.Watch))
	for _, w := range plan.Watch {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodGet, plan.Proxy+tunnel.ProxyPathPrefix+w.Identity+w.Path, nil)
			req.Header.Set("Authorization", "Bearer "+w.Token)
			resp, err := client.Do(req)
			if err != nil || resp.StatusCode != http.StatusOK {
				failed <- fmt.Sprint(w.Path, err, resp)
				return
			}
			go func() { _, _ = io.Copy(io.Discard, resp.Body) }()
		})
	}
	wg.Wait()
	select {
	case f := <-failed:
		fmt.Fprintln(os.Stderr, "peers: watch:", f)
		return 1
	default:
	}
	fmt.Println("WATCHING")
	// The parent ends this process when it has measured.
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// peersProcess runs the peers process for b and returns a writer of its plan and a
// waiter for each line it prints.
func peersProcess(b *testing.B) (send func(peerPlan), expect func(string)) {
	ctx, cancel := context.WithCancel(b.Context())
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), peersEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = stdin.Close(); cancel(); _ = cmd.Wait() })
	out := bufio.NewScanner(stdout)
	send = func(p peerPlan) {
		line, _ := json.Marshal(p)
		if _, err := stdin.Write(append(line, '\n')); err != nil {
			b.Fatal(err)
		}
	}
	expect = func(want string) {
		for out.Scan() {
			if strings.TrimSpace(out.Text()) == want {
				return
			}
		}
		b.Fatalf("the peers process ended before %s", want)
	}
	return send, expect
}
