package scale

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/flotilla-gitops/flotilla/agent"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
)

// agentsEnv names, for the re-executed test binary, the hub's tunnel address and the
// file of the agents to simulate (see TestMain). The agents run in a process of their
// own: ten thousand tunnels are as many file descriptors on each side, and the hub's
// process is measured alone.
const agentsEnv = "FLOTILLA_SCALE_AGENTS"

// simAgent is one agent at the protocol level: it enrolls with its token, then dials
// with the credential it was issued, acknowledges every desired state whole without a
// worker API server, sends heartbeats as a real agent does, and redials with a real
// agent's backoff when the tunnel ends.
type simAgent struct {
	identity string
	token    string

	credential string
	applied    string
	// redemptionKey goes with every enrollment attempt until one is answered, as a
	// real agent's: a redemption whose answer was lost is then repeated, not refused.
	redemptionKey protocol.Secret
}

// simulateAgents is the body of the re-executed test binary. The file holds one
// "identity<TAB>token" line per agent. It runs until killed, and says on stderr why
// tunnels ended, a few times.
func simulateAgents(spec string) int {
	url, file, _ := strings.Cut(spec, "|")
	data, err := os.ReadFile(file)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var agents []*simAgent
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		id, tok, ok := strings.Cut(sc.Text(), "\t")
		if ok {
			agents = append(agents, &simAgent{identity: id, token: tok})
		}
	}
	var failures atomic.Int64
	var wg sync.WaitGroup
	// A fleet enrolls over days; ten thousand enrollments at once would only measure
	// how the setup copes with them.
	enrolling := make(chan struct{}, 64)
	for _, a := range agents {
		wg.Go(func() { a.run(url, enrolling, &failures) })
	}
	wg.Wait()
	return 0
}

func (a *simAgent) run(url string, enrolling chan struct{}, failures *atomic.Int64) {
	redial := agent.NewRedial(agent.DefaultBackoff())
	for {
		began := time.Now()
		err := a.session(url, enrolling)
		if n := failures.Add(1); n <= 20 || n%1000 == 0 {
			fmt.Fprintf(os.Stderr, "simulated agent %s: %v (%d tunnels ended so far)\n", a.identity, err, n)
		}
		time.Sleep(redial.After(time.Since(began)))
	}
}

// session dials once and serves the tunnel until it ends. An enrollment takes one of
// the enrolling slots while it dials.
func (a *simAgent) session(url string, enrolling chan struct{}) error {
	hdr := http.Header{}
	hdr.Set(protocol.HeaderIdentity, a.identity)
	hdr.Set(protocol.HeaderProtocol, strconv.Itoa(protocol.ProtocolVersion))
	if a.credential != "" {
		hdr.Set("Authorization", "Bearer "+a.credential)
		hdr.Set(protocol.HeaderAuth, protocol.AuthCredential)
	} else {
		if a.redemptionKey == "" {
			key, err := protocol.NewRedemptionKey()
			if err != nil {
				return err
			}
			a.redemptionKey = key
		}
		hdr.Set("Authorization", "Bearer "+a.token)
		hdr.Set(protocol.HeaderAuth, protocol.AuthEnrollment)
		hdr.Set(protocol.HeaderRedemptionKey, a.redemptionKey.Reveal())
	}
	d := websocket.Dialer{ReadBufferSize: 1024, WriteBufferSize: 1024, HandshakeTimeout: time.Minute}
	if a.credential == "" {
		enrolling <- struct{}{}
	}
	ws, resp, err := d.Dial(url+protocol.Path, hdr)
	if a.credential == "" {
		<-enrolling
	}
	if err != nil {
		if resp != nil {
			return fmt.Errorf("dialling: HTTP %d", resp.StatusCode)
		}
		return err
	}
	if cred := resp.Header.Get(protocol.HeaderCredential); cred != "" {
		a.credential = cred
	}
	version, _ := strconv.Atoi(resp.Header.Get(protocol.HeaderProtocol))
	ws.SetReadLimit(int64(protocol.MaxMessageSize) + 1024)
	t, err := protocol.NewTunnel(ws, true, protocol.DefaultLiveness)
	if err != nil {
		_ = ws.Close()
		return err
	}
	defer t.Close()
	st, err := t.OpenStream()
	if err != nil {
		return err
	}
	conn := protocol.NewConn(st)
	if version > 0 {
		conn.SetVersion(version)
	}
	if err := conn.Send(protocol.TypeHello, &protocol.Hello{Identity: a.identity, AgentVersion: "simulated", KubernetesVersion: "v1.36.0", AppliedHash: a.applied}); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		tick := time.NewTicker(protocol.DefaultLiveness.Interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				_ = conn.Send(protocol.TypeHeartbeat, &protocol.Heartbeat{Time: now.UTC()})
			}
		}
	}()
	for {
		_, body, err := conn.Receive()
		if err != nil {
			if protocol.Recoverable(err) {
				continue
			}
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return fmt.Errorf("control stream: %w", err)
		}
		if ds, ok := body.(*protocol.DesiredState); ok {
			if err := conn.Send(protocol.TypeApplied, &protocol.Applied{Generation: ds.Generation, Hash: ds.Hash}); err != nil {
				return err
			}
			a.applied = ds.Hash
		}
	}
}
