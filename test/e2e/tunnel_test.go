package e2e

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/hashicorp/yamux"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/flotilla-gitops/flotilla/agent"
	"github.com/flotilla-gitops/flotilla/agent/protocol"
	v1alpha1 "github.com/flotilla-gitops/flotilla/reconciler/api/v1alpha1"
	"github.com/flotilla-gitops/flotilla/reconciler/tunnel"
	"github.com/flotilla-gitops/flotilla/secrets"
)

// dialRaw makes an upgrade request the way an agent would, with any secret.
func dialRaw(t *testing.T, h *hubServer, identity, kind, secret string, version int) (*websocket.Conn, *http.Response, string) {
	t.Helper()
	hdr := http.Header{}
	hdr.Set("Authorization", "Bearer "+secret)
	hdr.Set(protocol.HeaderIdentity, identity)
	hdr.Set(protocol.HeaderAuth, kind)
	hdr.Set(protocol.HeaderProtocol, strconv.Itoa(version))
	ws, resp, err := websocket.DefaultDialer.DialContext(t.Context(), h.url()+protocol.Path, hdr)
	body := ""
	if err != nil && resp != nil {
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
	}
	return ws, resp, body
}

func workerSecret(t *testing.T, c *fleetCase) string {
	t.Helper()
	var sec corev1.Secret
	if err := worker().Get(t.Context(), types.NamespacedName{Namespace: c.agentNS, Name: "flotilla-agent-credential"}, &sec); err != nil {
		t.Fatal(err)
	}
	return string(sec.Data["credential"])
}

func hubSecret(t *testing.T, c *fleetCase) corev1.Secret {
	t.Helper()
	var sec corev1.Secret
	if err := hub().Get(t.Context(), types.NamespacedName{Namespace: c.ns, Name: tunnel.CredentialSecretName(fleetgenName)}, &sec); err != nil {
		t.Fatal(err)
	}
	return sec
}

func TestEnrollmentIsOneShot(t *testing.T) {
	c := newCase(t, "enroll")
	h := startHub(t, c, nil)
	stop, agentLog := runAgent(t, c, h, true, nil)

	wc := c.conditionIs(v1alpha1.ConditionRegistered, metav1.ConditionTrue, v1alpha1.ReasonEnrolled)
	c.conditionIs(v1alpha1.ConditionConnected, metav1.ConditionTrue, v1alpha1.ReasonTunnelUp)
	c.configured()
	if wc.Status.Enrollment == nil || wc.Status.Enrollment.TokenHash != c.token.Hash().String() {
		t.Fatalf("enrollment recorded as %+v", wc.Status.Enrollment)
	}
	cred := workerSecret(t, c)
	if _, err := secrets.ParseToken(cred); err != nil {
		t.Fatalf("the agent stored no credential: %v", err)
	}
	// The hub keeps the hash, never the credential.
	hs := hubSecret(t, c)
	tok, _ := secrets.ParseToken(cred)
	if string(hs.Data["hash"]) != tok.Hash().String() {
		t.Fatalf("hub credential hash %q, want the hash of the agent's credential", hs.Data["hash"])
	}
	for k, v := range hs.Data {
		notContains(t, "the hub's Secret key "+k, string(v), cred)
	}

	t.Run("the same token again is refused without detail", func(t *testing.T) {
		_, resp, body := dialRaw(t, h, c.identity, protocol.AuthEnrollment, c.token.Reveal(), protocol.ProtocolVersion)
		if resp == nil || resp.StatusCode != http.StatusUnauthorized || strings.TrimSpace(body) != "unauthorized" {
			t.Fatalf("replayed token: %v %q, want 401 unauthorized", resp, body)
		}
		if !strings.Contains(h.log.String(), "already redeemed") || !strings.Contains(h.log.String(), "fingerprint="+c.token.Hash().Fingerprint()) {
			t.Fatalf("the hub's log lacks the reason and fingerprint:\n%s", h.log.String())
		}
	})
	t.Run("a wrong token is refused without detail", func(t *testing.T) {
		other, _ := secrets.NewToken()
		for _, secret := range []string{other.Reveal(), "not-a-token", c.token.Reveal()[:20]} {
			_, resp, body := dialRaw(t, h, c.identity, protocol.AuthEnrollment, secret, protocol.ProtocolVersion)
			if resp == nil || resp.StatusCode != http.StatusUnauthorized || strings.TrimSpace(body) != "unauthorized" {
				t.Fatalf("wrong token: %v %q, want 401 unauthorized", resp, body)
			}
		}
		if !strings.Contains(h.log.String(), "does not match") {
			t.Fatalf("the hub's log lacks the reason:\n%s", h.log.String())
		}
		_, resp, _ := dialRaw(t, h, c.identity, protocol.AuthCredential, other.Reveal(), protocol.ProtocolVersion)
		if resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a wrong credential: %v, want 401", resp)
		}
	})
	t.Run("a newer protocol is refused with a reason", func(t *testing.T) {
		_, resp, body := dialRaw(t, h, c.identity, protocol.AuthCredential, cred, protocol.ProtocolVersion+1)
		if resp == nil || resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "newer") {
			t.Fatalf("newer protocol: %v %q", resp, body)
		}
	})
	t.Run("a restarted agent reconnects with its stored credential", func(t *testing.T) {
		stop()
		c.conditionIs(v1alpha1.ConditionConnected, metav1.ConditionFalse, v1alpha1.ReasonTunnelDown)
		// No token this time: only the stored credential can get it in.
		runAgent(t, c, h, false, nil)
		c.conditionIs(v1alpha1.ConditionConnected, metav1.ConditionTrue, v1alpha1.ReasonTunnelUp)
	})
	for _, log := range []string{h.log.String(), agentLog.String()} {
		notContains(t, "a log", log, c.token.Reveal())
		notContains(t, "a log", log, cred)
	}
}

const fleetgenName = "example-us-central1"

func TestCredentialRotatesWithoutDroppingTheTunnel(t *testing.T) {
	c := newCase(t, "rotate")
	h := startHub(t, c, func(o *tunnel.Options) { o.RotateEvery = 700 * time.Millisecond })
	runAgent(t, c, h, true, nil)
	c.configured()
	first := workerSecret(t, c)
	var rotated string
	eventually(t, "two rotations", func() (bool, string) {
		cur := workerSecret(t, c)
		if cur != first && rotated == "" {
			rotated = cur
		}
		return rotated != "" && cur != rotated, "waiting"
	})
	// The hub confirms what the agent stored, and the tunnel never dropped.
	eventually(t, "the hub's hash follows", func() (bool, string) {
		tok, err := secrets.ParseToken(workerSecret(t, c))
		if err != nil {
			return false, err.Error()
		}
		hs := hubSecret(t, c)
		return string(hs.Data["hash"]) == tok.Hash().String() || string(hs.Data["pendingHash"]) == tok.Hash().String(), string(hs.Data["hash"])
	})
	if n := strings.Count(h.log.String(), "agent connected"); n != 1 {
		t.Fatalf("%d connections during rotation, want the first one only:\n%s", n, h.log.String())
	}
	// The first credential is worthless now.
	_, resp, _ := dialRaw(t, h, c.identity, protocol.AuthCredential, first, protocol.ProtocolVersion)
	if resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a rotated-out credential: %v, want 401", resp)
	}
}

func TestDesiredStateIsAppliedUpdatedAndPruned(t *testing.T) {
	c := newCase(t, "apply")
	h := startHub(t, c, nil)
	runAgent(t, c, h, true, nil)
	c.configured()
	uids := map[string]types.UID{}
	for _, o := range c.res.Objects {
		live := &unstructured.Unstructured{}
		live.SetGroupVersionKind(o.GroupVersionKind())
		if err := worker().Get(t.Context(), client.ObjectKeyFromObject(o), live); err != nil {
			t.Fatalf("%s %s not applied: %v", o.GetKind(), o.GetName(), err)
		}
		// Workload namespaces are created only when missing: another test's worker may
		// have made them first on this shared plane.
		if o.GetAnnotations()[v1alpha1.ApplyAnnotation] != v1alpha1.ApplyIfNotPresent && live.GetLabels()[v1alpha1.WorkerClusterLabel] != c.identity {
			t.Fatalf("%s %s lacks the ownership label", o.GetKind(), o.GetName())
		}
		uids[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()] = live.GetUID()
	}

	// Cordon: stopPolicy Hold on the ClusterQueues, updated in place; drop a LocalQueue.
	var dropped *unstructured.Unstructured
	c.state, c.res = rendered(t, 2, func(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
		var out []*unstructured.Unstructured
		for _, o := range objs {
			if o.GetKind() == "LocalQueue" && dropped == nil {
				dropped = o
				continue
			}
			if o.GetKind() == "ClusterQueue" {
				_ = unstructured.SetNestedField(o.Object, "Hold", "spec", "stopPolicy")
			}
			out = append(out, o)
		}
		return out
	})
	if dropped == nil {
		t.Fatal("the template renders no LocalQueue to drop")
	}
	if !c.push(h) {
		t.Fatal("Push found the agent not connected")
	}
	c.configured()
	for _, o := range c.res.Objects {
		live := &unstructured.Unstructured{}
		live.SetGroupVersionKind(o.GroupVersionKind())
		if err := worker().Get(t.Context(), client.ObjectKeyFromObject(o), live); err != nil {
			t.Fatal(err)
		}
		if live.GetUID() != uids[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()] {
			t.Fatalf("%s %s was replaced, not updated in place", o.GetKind(), o.GetName())
		}
		if o.GetKind() == "ClusterQueue" {
			if p, _, _ := unstructured.NestedString(live.Object, "spec", "stopPolicy"); p != "Hold" {
				t.Fatalf("ClusterQueue %s has stopPolicy %q after the cordon", o.GetName(), p)
			}
		}
	}
	gone := &unstructured.Unstructured{}
	gone.SetGroupVersionKind(dropped.GroupVersionKind())
	eventually(t, "the dropped LocalQueue pruned", func() (bool, string) {
		err := worker().Get(t.Context(), client.ObjectKeyFromObject(dropped), gone)
		return client.IgnoreNotFound(err) == nil && err != nil, "still there"
	})
}

func TestBrownfieldObjectIsRefusedUntilLabelled(t *testing.T) {
	c := newCase(t, "brownfield")
	var cq *unstructured.Unstructured
	for _, o := range c.res.Objects {
		if o.GetKind() == "ClusterQueue" {
			cq = o
			break
		}
	}
	// A customer's ClusterQueue of the same name, already there.
	existing := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": cq.GetAPIVersion(), "kind": "ClusterQueue",
		"metadata": map[string]any{"name": cq.GetName(), "labels": map[string]any{"team": "research"}},
		"spec":     map[string]any{"namespaceSelector": map[string]any{}},
	}}
	if err := worker().Create(t.Context(), existing); err != nil {
		t.Fatal(err)
	}
	before := existing.DeepCopy()
	h := startHub(t, c, nil)
	runAgent(t, c, h, true, nil)
	wc := c.conditionIs(v1alpha1.ConditionWorkerConfigured, metav1.ConditionFalse, v1alpha1.ReasonAdoptionRefused)
	msg := condition(wc, v1alpha1.ConditionWorkerConfigured).Message
	if !strings.Contains(msg, "refuse to adopt existing object not owned by this WorkerCluster") || !strings.Contains(msg, string(before.GetUID())) {
		t.Fatalf("refusal says %q", msg)
	}
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(cq.GroupVersionKind())
	if err := worker().Get(t.Context(), client.ObjectKeyFromObject(cq), live); err != nil {
		t.Fatal(err)
	}
	if live.GetUID() != before.GetUID() || live.GetResourceVersion() != before.GetResourceVersion() {
		t.Fatal("the refused ClusterQueue was changed")
	}

	// The operator hands it over.
	live.SetLabels(map[string]string{"team": "research", v1alpha1.WorkerClusterLabel: c.identity})
	if err := worker().Update(t.Context(), live); err != nil {
		t.Fatal(err)
	}
	if !c.push(h) {
		t.Fatal("Push found the agent not connected")
	}
	c.configured()
	if err := worker().Get(t.Context(), client.ObjectKeyFromObject(cq), live); err != nil {
		t.Fatal(err)
	}
	if live.GetUID() != before.GetUID() {
		t.Fatal("the adopted ClusterQueue was replaced")
	}
}

func TestFaultsConverge(t *testing.T) {
	c := newCase(t, "faults")
	h := startHub(t, c, nil)
	outer := t // agents started in a case below outlive it
	stopCurrent, _ := runAgent(t, c, h, true, nil)
	c.configured()
	cred := workerSecret(t, c)
	snapshot := func() (map[string]string, error) {
		out := map[string]string{}
		for _, o := range c.res.Objects {
			live := &unstructured.Unstructured{}
			live.SetGroupVersionKind(o.GroupVersionKind())
			if err := worker().Get(context.Background(), client.ObjectKeyFromObject(o), live); err != nil {
				return nil, err
			}
			out[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()] = live.GetResourceVersion()
		}
		return out, nil
	}
	versions := func() map[string]string {
		out, err := snapshot()
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	applied := versions()
	// change gives the cluster a new desired state, its ClusterQueue queueing by
	// strategy, and pushes it while no agent may be connected: the tunnel must deliver
	// it when one is.
	change := func(t *testing.T, generation int64, strategy string) {
		c.state, c.res = rendered(t, generation, func(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
			for _, o := range objs {
				if o.GetKind() == "ClusterQueue" {
					_ = unstructured.SetNestedField(o.Object, strategy, "spec", "queueingStrategy")
				}
			}
			return objs
		})
		c.push(h)
	}
	queueing := func(t *testing.T, want string) {
		t.Helper()
		for _, o := range c.res.Objects {
			if o.GetKind() != "ClusterQueue" {
				continue
			}
			live := &unstructured.Unstructured{}
			live.SetGroupVersionKind(o.GroupVersionKind())
			if err := worker().Get(t.Context(), client.ObjectKeyFromObject(o), live); err != nil {
				t.Fatal(err)
			}
			if got, _, _ := unstructured.NestedString(live.Object, "spec", "queueingStrategy"); got != want {
				t.Fatalf("ClusterQueue %s queues %q, want %q", o.GetName(), got, want)
			}
		}
	}
	unchanged := func(t *testing.T) {
		t.Helper()
		for k, v := range versions() {
			if applied[k] != v {
				t.Fatalf("%s was written again (resourceVersion %s → %s)", k, applied[k], v)
			}
		}
	}

	t.Run("the hub restarts and delivers what changed meanwhile", func(t *testing.T) {
		change(t, 2, "StrictFIFO")
		h.restart()
		c.conditionIs(v1alpha1.ConditionConnected, metav1.ConditionTrue, "")
		eventually(t, "the new hub has the agent", func() (bool, string) { return h.srv.Connected(c.identity), "" })
		c.configured()
		queueing(t, "StrictFIFO")
		applied = versions()
	})
	t.Run("the tunnel is cut mid-apply: the state lands once", func(t *testing.T) {
		stopCurrent()
		change(t, 3, "BestEffortFIFO")
		var afterCut map[string]string
		var afterCutErr error
		cut := &cutOnce{srv: h.srv, identity: c.identity, afterFirst: func() { afterCut, afterCutErr = snapshot() }}
		// This agent stays for the cases below.
		stopCurrent, _ = runAgent(outer, c, h, false, func(o *agent.Options) { cut.next = o.Applier; o.Applier = cut })
		eventually(t, "the cut apply done and the state applied after the redial", func() (bool, string) {
			return cut.applies.Load() >= 2 && h.srv.Connected(c.identity), fmt.Sprintf("%d applies", cut.applies.Load())
		})
		c.configured()
		queueing(t, "BestEffortFIFO")
		applied = versions()
		if afterCutErr != nil {
			t.Fatal(afterCutErr)
		}
		// The apply whose acknowledgement was lost changed the objects; applying the
		// same state again after the redial must write nothing.
		for k, v := range applied {
			if afterCut[k] != v {
				t.Fatalf("%s was written again after the redial (resourceVersion %s → %s)", k, afterCut[k], v)
			}
		}
	})
	t.Run("a second connection of the identity replaces the first cleanly", func(t *testing.T) {
		mark := len(h.log.String())
		since := func() string { return h.log.String()[mark:] }
		tn, st := dialTunnel(t, h, c.identity, cred)
		defer tn.Close()
		if err := protocol.NewConn(st).Send(protocol.TypeHello, &protocol.Hello{Identity: c.identity, AgentVersion: "second"}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the first replaced", func() (bool, string) {
			return strings.Contains(since(), "tunnel replaced by a new connection"), ""
		})
		// The agent redials and replaces the intruder in turn; the hub never marked the
		// cluster disconnected meanwhile.
		eventually(t, "the second closed by the agent's return", func() (bool, string) { return tn.IsClosed(), "" })
		if strings.Contains(since(), "agent disconnected") {
			t.Fatal("a replaced tunnel was recorded as a disconnection")
		}
		c.configured()
		unchanged(t)
	})
	// The hub gives a new tunnel HandshakeTimeout (10 s) to say hello; each refusal
	// below must come well before that, or it is the silence being refused, not the input.
	const refusedWithin = 3 * time.Second
	t.Run("garbage frames do not disturb the live agent", func(t *testing.T) {
		for name, frame := range map[string]struct {
			kind int
			data []byte
		}{
			"a text frame":             {websocket.TextMessage, []byte("{not yamux")},
			"a binary non-yamux frame": {websocket.BinaryMessage, []byte{0xff, 0xfe, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		} {
			ws, resp, body := dialRaw(t, h, c.identity, protocol.AuthCredential, cred, protocol.ProtocolVersion)
			if ws == nil {
				t.Fatalf("dial: %v %s", resp, body)
			}
			_ = ws.WriteMessage(frame.kind, frame.data)
			_ = ws.SetReadDeadline(time.Now().Add(refusedWithin))
			_, _, err := ws.ReadMessage()
			var ne net.Error
			if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
				t.Fatalf("%s: the hub kept the tunnel (%v)", name, err)
			}
			_ = ws.Close()
			if !h.srv.Connected(c.identity) {
				t.Fatalf("%s: the garbage connection displaced the agent", name)
			}
		}
	})
	t.Run("a live tunnel answers what it cannot use and is closed by a message over the size cap", func(t *testing.T) {
		tn, st := dialTunnel(t, h, c.identity, cred)
		defer tn.Close()
		conn := protocol.NewConn(st)
		// A hello makes this the identity's live tunnel, as a confused second agent would.
		if err := conn.Send(protocol.TypeHello, &protocol.Hello{Identity: c.identity, AgentVersion: "intruder"}); err != nil {
			t.Fatal(err)
		}
		refusal := func(code string) {
			t.Helper()
			_ = st.SetReadDeadline(time.Now().Add(refusedWithin))
			for {
				_, body, err := conn.Receive()
				if err != nil {
					t.Fatalf("waiting for a %s refusal: %v", code, err)
				}
				if e, ok := body.(*protocol.Error); ok {
					if e.Code != code {
						t.Fatalf("refused with %s (%s), want %s", e.Code, e.Message, code)
					}
					return
				}
			}
		}
		if err := conn.Send("bogus", struct{}{}); err != nil {
			t.Fatal(err)
		}
		refusal(protocol.CodeUnknownType)
		raw, _ := json.Marshal(protocol.Envelope{Version: protocol.ProtocolVersion + 1, Type: protocol.TypeHeartbeat, Body: json.RawMessage(`{}`)})
		var frame [4]byte
		binary.BigEndian.PutUint32(frame[:], uint32(len(raw)))
		if _, err := st.Write(append(frame[:], raw...)); err != nil {
			t.Fatal(err)
		}
		refusal(protocol.CodeUnsupportedVersion)

		binary.BigEndian.PutUint32(frame[:], protocol.MaxMessageSize+1)
		_, _ = st.Write(frame[:])
		_, _ = st.Write(make([]byte, 1024))
		_ = st.SetReadDeadline(time.Now().Add(refusedWithin))
		if _, err := io.Copy(io.Discard, st); errors.Is(err, yamux.ErrTimeout) {
			t.Fatal("the hub kept reading a stream whose message is over the size cap")
		}
		// The real agent redials and takes its place back, with nothing to apply again.
		c.conditionIs(v1alpha1.ConditionConnected, metav1.ConditionTrue, "")
		eventually(t, "the agent back", func() (bool, string) { return h.srv.Connected(c.identity), "" })
		c.configured()
		unchanged(t)
	})
	t.Run("a peer that stops answering is dropped, and comes back", func(t *testing.T) {
		// The agent's tunnel runs through a link that the test cuts without closing:
		// packets vanish, as in a network partition.
		stopCurrent()
		link := newLink(t, h.addr)
		stop, _ := runAgent(t, c, h, false, func(o *agent.Options) { o.HubURL = link.url() })
		defer stop()
		eventually(t, "the agent through the link", func() (bool, string) {
			return link.conns() > 0 && h.srv.Connected(c.identity), ""
		})
		link.freeze()
		frozen := time.Now()
		c.conditionIs(v1alpha1.ConditionConnected, metav1.ConditionFalse, v1alpha1.ReasonTunnelDown)
		// Within the heartbeat timeout, with slack for a loaded machine: far below what
		// TCP alone would take to notice a partition.
		if took := time.Since(frozen); took > fast.Timeout+9*time.Second {
			t.Fatalf("the silent peer was dropped %s after it went quiet (heartbeat timeout %s)", took.Round(time.Millisecond), fast.Timeout)
		} else {
			t.Logf("the silent peer was dropped %s after it went quiet (heartbeat timeout %s)", took.Round(time.Millisecond), fast.Timeout)
		}
		link.thaw()
		c.conditionIs(v1alpha1.ConditionConnected, metav1.ConditionTrue, v1alpha1.ReasonTunnelUp)
		c.configured()
		unchanged(t)
	})
}

func TestGPUInventoryReachesTheHub(t *testing.T) {
	c := newCase(t, "gpus")
	for i, n := range []struct {
		name          string
		ready         bool
		unschedulable bool
	}{{"gpu-node-a", true, false}, {"gpu-node-b", true, false}, {"gpu-node-c", false, false}} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{
			"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.count": "8",
		}}, Spec: corev1.NodeSpec{Unschedulable: n.unschedulable}}
		if err := worker().Create(t.Context(), node); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = worker().Delete(context.Background(), node) })
		status := corev1.ConditionTrue
		if !n.ready {
			status = corev1.ConditionFalse
		}
		node.Status = corev1.NodeStatus{
			Capacity:    corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")},
			Allocatable: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, Reason: "Test", LastHeartbeatTime: metav1.Now()}},
		}
		if err := worker().Status().Update(t.Context(), node); err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
	}
	h := startHub(t, c, nil)
	runAgent(t, c, h, true, nil)
	eventually(t, "the GPU totals on the WorkerCluster", func() (bool, string) {
		wc := c.wc()
		want := []v1alpha1.GPUTotal{{Product: "NVIDIA-H100-80GB-HBM3", Count: 16, Nodes: 2}}
		return fmt.Sprint(wc.Status.GPUs) == fmt.Sprint(want) && wc.Status.UnavailableGPUNodes == 1, fmt.Sprintf("%v, %d unavailable", wc.Status.GPUs, wc.Status.UnavailableGPUNodes)
	})
}

// cutOnce is an applier that cuts the hub's end of the tunnel during its first apply
// and then applies all the same, as when a link fails while a state is being applied.
type cutOnce struct {
	srv        *tunnel.Server
	identity   string
	next       agent.Applier
	afterFirst func() // runs once the cut apply is done
	applies    atomic.Int32
}

func (c *cutOnce) Apply(ctx context.Context, st protocol.DesiredState) protocol.Applied {
	first := c.applies.Add(1) == 1
	if first {
		c.srv.Disconnect(c.identity)
	}
	res := c.next.Apply(ctx, st)
	if first && c.afterFirst != nil {
		c.afterFirst()
	}
	return res
}

// dialTunnel opens a tunnel and its control stream with the identity's credential, as a
// second agent of the identity would.
func dialTunnel(t *testing.T, h *hubServer, identity, cred string) (*protocol.Tunnel, *yamux.Stream) {
	t.Helper()
	ws, resp, body := dialRaw(t, h, identity, protocol.AuthCredential, cred, protocol.ProtocolVersion)
	if ws == nil {
		t.Fatalf("dial: %v %s", resp, body)
	}
	tn, err := protocol.NewTunnel(ws, true, fast)
	if err != nil {
		t.Fatal(err)
	}
	st, err := tn.OpenStream()
	if err != nil {
		_ = tn.Close()
		t.Fatal(err)
	}
	return tn, st
}
